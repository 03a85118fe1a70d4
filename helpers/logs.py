"""Quieter libraries: their loggers at another level for a block, and back afterwards (also after an exception);
or, for a library that resets its loggers' level, their records below WARNING dropped for good."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["drop_below_warning", "logger_levels"]


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
