"""Quieter libraries for a block: their loggers at another level, and back afterwards (also after an exception)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["logger_levels"]


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
