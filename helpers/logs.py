"""Quieter libraries: their loggers at another level for a block, and back afterwards (also after an exception);
for a library that resets its loggers' level, their records below WARNING dropped for good; a logger's records that
start with given words dropped for a block; and the warnings raised inside libraries that a learner cannot act on
ignored, in this process (:func:`quiet_library_warnings`) and in the processes it starts (:func:`python_warnings`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator

__all__ = [
    "LIBRARY_WARNINGS",
    "drop_below_warning",
    "dropped_records",
    "logger_levels",
    "python_warnings",
    "quiet_library_warnings",
]

#: Warnings raised inside libraries, about their own code: (the message's start, its category, the module it is
#: reported from). Petastorm 0.12 imports pyarrow's deprecated ``LocalFileSystem``; tqdm, imported by MLflow and
#: Ray, asks for ipywidgets, which the course does not need (its progress bars are text); Lightning 2.6 uses torch's
#: deprecated pytree API in every fit.
LIBRARY_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    ("pyarrow.LocalFileSystem is deprecated", FutureWarning, "petastorm.spark.spark_dataset_converter"),
    ("IProgress not found", Warning, "tqdm.auto"),
    ("`isinstance(treespec", FutureWarning, "pytorch_lightning.utilities._pytree"),
)


@contextlib.contextmanager
def logger_levels(levels: dict[str, int]) -> Iterator[None]:
    """Set each named logger to its level for the block, then restore the levels it had.

    Args:
        levels: logger name -> level, e.g. ``{"pytorch_lightning": logging.ERROR}``.
    """
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _warning_or_worse(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def drop_below_warning(*names: str) -> None:
    """Drop the records below WARNING of the named loggers from now on, whatever level they are set to later.

    For libraries that set their logger to INFO each time they make one, as pyspark's ``TorchDistributor`` does in
    every constructor ("Started distributed training with 2 executor processes").

    Args:
        names: the loggers, e.g. ``"TorchDistributor"``.
    """
    for name in names:
        logger = logging.getLogger(name)
        if _warning_or_worse not in logger.filters:
            logger.addFilter(_warning_or_worse)


@contextlib.contextmanager
def dropped_records(name: str, *starts: str) -> Iterator[None]:
    """Drop the named logger's records whose message starts with one of ``starts``, for the block; the others
    pass.

    Args:
        name: the logger, e.g. ``"ray.util.spark"``.
        starts: the beginnings of the messages to drop.
    """

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(starts)

    logger = logging.getLogger(name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def quiet_library_warnings() -> None:
    """Ignore :data:`LIBRARY_WARNINGS` in this process from now on (each warning only where it is raised)."""
    for message, category, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", re.escape(message), category, re.escape(module) + r"\Z")


def python_warnings(current: str | None = None) -> str:
    """``PYTHONWARNINGS`` for the processes this one starts: ``current`` with :data:`LIBRARY_WARNINGS` ignored.

    Args:
        current: the value set now (``os.environ.get("PYTHONWARNINGS")``), kept.

    Returns:
        The value, comma-separated ``-W`` options.
    """
    kept = [option for option in (current or "").split(",") if option]
    ours = [f"ignore:{message}:{category.__name__}:{module}" for message, category, module in LIBRARY_WARNINGS]
    return ",".join(kept + [option for option in ours if option not in kept])
