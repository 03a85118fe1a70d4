"""helpers.logs: loggers at another level for a block, restored afterwards; records below WARNING dropped for good."""

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


def test_pyspark_s_launchers_say_only_warnings_even_after_they_reset_their_level(caplog):
    from pyspark.ml.torch.distributor import _get_logger

    import helpers.distributor  # noqa: F401  (installs the filter)

    caplog.set_level(logging.INFO)
    for name in ("TorchDistributor", "DeepspeedTorchDistributor"):
        logger = _get_logger(name)  # what every constructor does: the level back to INFO
        assert logger.level == logging.INFO
        logger.info("Started distributed training with 2 executor processes")
        logger.warning(f"{name}: the log streaming server failed")
    assert [record.getMessage() for record in caplog.records] == [
        "TorchDistributor: the log streaming server failed",
        "DeepspeedTorchDistributor: the log streaming server failed",
    ]
