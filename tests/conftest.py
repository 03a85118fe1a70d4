"""Shared fixtures: a throw-away work directory for the whole run, a local SparkSession, image folders."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Everything the course writes goes under COURSE_WORK_DIR: point it at a temporary folder before any helper runs,
# so the test suite never writes into the repository's work/.
_SESSION_WORK = Path(tempfile.mkdtemp(prefix="course-tests-"))
os.environ["COURSE_WORK_DIR"] = str(_SESSION_WORK)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Nothing is left in /tmp: the session's tables, checkpoints and MLflow stores go with it."""
    shutil.rmtree(_SESSION_WORK, ignore_errors=True)


@pytest.fixture(scope="session")
def session_work_dir() -> Path:
    """The work directory shared by the whole test run."""
    return _SESSION_WORK


@pytest.fixture
def work_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's work directory: course code (and the worker processes it starts, through ``COURSE_WORK_DIR``)
    writes its checkpoints, MLflow store and job reports under the test's ``tmp_path``."""
    monkeypatch.setenv("COURSE_WORK_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession (2 cores) for the whole run."""
    from helpers.spark import get_spark

    session = get_spark(cores=2)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's trainings: on a shared 2-core machine, OpenMP threads fighting other
    processes stall (use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def digits_dir(session_work_dir: Path) -> Path:
    """The embedded default data set, written once."""
    from helpers.data import embedded_digits

    return embedded_digits(session_work_dir)


@pytest.fixture(scope="session")
def digits_data(spark, digits_dir: Path):
    """The embedded digits prepared once for 2 devices: ``(df, train_converter, val_converter, class_names)``."""
    from helpers.loaders import prepare_data

    return prepare_data(digits_dir, num_devices=2, spark=spark)
