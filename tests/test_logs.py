"""helpers.logs: loggers at another level for a block, restored afterwards."""

from __future__ import annotations

import logging

import pytest

from helpers.logs import logger_levels


def test_levels_are_set_in_the_block_and_restored_also_after_an_exception():
    first, second = logging.getLogger("course-test-a"), logging.getLogger("course-test-b")
    first.setLevel(logging.INFO)
    with pytest.raises(RuntimeError), logger_levels({"course-test-a": logging.ERROR, "course-test-b": logging.WARNING}):
        assert (first.level, second.level) == (logging.ERROR, logging.WARNING)
        raise RuntimeError("the block failed")
    assert (first.level, second.level) == (logging.INFO, logging.NOTSET)
