"""HorovodRunner with real Horovod processes over Gloo: results, input checks, worker errors, Spark mode."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import cloudpickle
import pytest

from helpers import CourseInputError
from helpers.horovod_runner import HorovodRunner, HorovodWorkerError, runner_class

REPO = str(Path(__file__).resolve().parent.parent)

# The workers cannot import this test module (tests/ is not on their path): send its functions by value, as
# functions defined in a notebook or a script's __main__ are sent.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


pytestmark = pytest.mark.usefixtures("work_dir")  # the runner's failure reports go under each test's tmp_path


def rank_info(tag: str) -> dict:
    """Each rank reports who it is, what it sees, and a sum over all ranks (proves the ranks talk)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {
        "tag": tag,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "sum": float(total),
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "pythonpath": os.environ.get("PYTHONPATH", "").split(os.pathsep),
    }


def raise_on_rank_one() -> None:
    """Every rank says something on stdout and stderr; then rank 1 raises while rank 0 waits for it in a
    collective."""
    import sys

    import horovod.torch as hvd
    import torch

    hvd.init()
    print(f"rank {hvd.rank()} starts", flush=True)
    print(f"rank {hvd.rank()} warns", file=sys.stderr, flush=True)
    if hvd.rank() == 1:
        raise ValueError("deliberate failure in the worker")
    hvd.allreduce(torch.ones(1))


def kill_rank_one() -> None:
    """Rank 1 kills itself with SIGKILL (no Python error, like the OOM killer) while rank 0 waits for it."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(torch.ones(1))
    time.sleep(60)
    hvd.allreduce(torch.ones(1))


def tuning_env() -> dict:
    """What Horovod's core will read for its cycle time and response cache in this worker."""
    return {name: os.environ.get(name) for name in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")}


# --- input checks (nothing is started) -------------------------------------------------------------------------


@pytest.mark.parametrize("np", [0, 1.5, True])
def test_np_must_be_a_nonzero_int(np: object) -> None:
    with pytest.raises(CourseInputError, match="np"):
        HorovodRunner(np=np)  # type: ignore[arg-type]


def test_unknown_log_verbosity_is_rejected() -> None:
    with pytest.raises(CourseInputError, match="driver_log_verbosity"):
        HorovodRunner(np=-2, driver_log_verbosity="everything")


def test_unpicklable_function_is_reported_before_starting() -> None:
    lock = threading.Lock()

    def uses_lock() -> bool:
        return lock.locked()

    with pytest.raises(CourseInputError, match="cannot be pickled.*uses_lock|uses_lock.*cannot be pickled"):
        HorovodRunner(np=-2).run(uses_lock)


def test_unpicklable_argument_is_reported_before_starting() -> None:
    with pytest.raises(CourseInputError, match="arguments.*cannot be pickled"):
        HorovodRunner(np=-2).run(rank_info, tag=threading.Lock())


def test_np_above_core_count_warns_with_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = HorovodRunner(np=-3)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    launched = []
    monkeypatch.setattr("horovod.run", lambda *args, **kwargs: launched.append(kwargs["num_proc"]) or ["rank 0"])
    with pytest.warns(UserWarning, match="3 processes on a machine with 2 cores"):
        assert runner.run(rank_info, tag="x") == "rank 0"
    assert launched == [3]


# --- GPU jobs (checked before anything starts, so they run on the CPU too) -------------------------------------


@pytest.mark.parametrize(
    ("gpus", "have", "fix"),
    [(1, "1 GPU", "use np=-1"), (2, "2 GPUs", "use np=-2"), (0, "no CUDA GPU", "run it on a GPU machine")],
)
def test_local_gpu_job_needs_one_gpu_per_process(gpus: int, have: str, fix: str) -> None:
    with pytest.raises(CourseInputError) as caught:
        HorovodRunner(np=-4, use_gpu=True, cuda_count=gpus).run(rank_info, tag="x")
    assert str(caught.value) == (
        f"HorovodRunner(np=-4, use_gpu=True) asks for 4 local processes with one GPU each, but this machine has "
        f"{have}: {fix}, or use_gpu=False to train on the CPU."
    )


def test_use_gpu_must_be_a_bool() -> None:
    with pytest.raises(CourseInputError, match=r"^use_gpu='yes': pass True or False\.$"):
        HorovodRunner(np=-1, use_gpu="yes")  # type: ignore[arg-type]


def test_horovod_without_cuda_is_refused_and_without_nccl_warned() -> None:
    from helpers.horovod_runner import _check_local_gpus

    full = {"installed": True, "cuda": True, "nccl": True, "gloo": True}
    with pytest.raises(CourseInputError, match=r"Horovod was built without CUDA.*make setup GPU=1.*use_gpu=False"):
        _check_local_gpus(-2, 2, {**full, "cuda": False, "nccl": False})
    with pytest.raises(CourseInputError, match=r"Horovod is not installed"):
        _check_local_gpus(-1, 1, dict.fromkeys(full, False))
    with pytest.warns(UserWarning, match=r"built without NCCL.*host.*make setup GPU=1"):
        _check_local_gpus(-2, 2, {**full, "nccl": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_local_gpus(-2, 4, full)


def test_gpu_job_with_this_machine_s_horovod() -> None:
    """The real detection: a Horovod built without CUDA (the CPU build of ``make setup``) refuses a GPU job."""
    from helpers.devices import horovod_gpu_support

    if horovod_gpu_support()["cuda"]:
        pytest.skip("this Horovod was built with CUDA")
    expected = r"^HorovodRunner\(np=-1, use_gpu=True\): Horovod was built without CUDA"
    with pytest.raises(CourseInputError, match=expected):
        HorovodRunner(np=-1, use_gpu=True, cuda_count=1).run(rank_info, tag="x")


def test_runner_class_is_ours_without_sparkdl() -> None:
    if importlib.util.find_spec("sparkdl") is not None:
        pytest.skip("sparkdl is installed here")
    assert runner_class() is HorovodRunner


# --- real local jobs -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_local_run_returns_rank_zero_result_with_repo_on_path_and_pinned_threads() -> None:
    result = HorovodRunner(np=-2).run(rank_info, tag="local")
    assert result["tag"] == "local"
    assert (result["rank"], result["size"]) == (0, 2)
    assert result["sum"] == 3.0  # 1 + 2: both ranks took part
    expected_threads = max(1, (os.cpu_count() or 1) // 2)
    assert result["threads"] == expected_threads
    assert result["omp"] == str(expected_threads)
    assert REPO in result["pythonpath"]


@pytest.mark.slow
def test_workers_get_horovod_s_tuning_defaults_or_the_driver_s(monkeypatch: pytest.MonkeyPatch) -> None:
    # horovod.run would hand them "(None,)", which Horovod parses as a 0 ms cycle and no cache
    monkeypatch.delenv("HOROVOD_CYCLE_TIME", raising=False)
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)
    assert HorovodRunner(np=-1).run(tuning_env) == {"HOROVOD_CYCLE_TIME": None, "HOROVOD_CACHE_CAPACITY": None}
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2.5")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "512")
    assert HorovodRunner(np=-1).run(tuning_env) == {"HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_CACHE_CAPACITY": "512"}


@pytest.mark.slow
def test_worker_exception_names_the_rank_and_carries_its_traceback(tmp_path: Path, capfd) -> None:
    with pytest.raises(HorovodWorkerError) as caught:
        HorovodRunner(np=-2).run(raise_on_rank_one)
    # what the ranks said reaches the notebook; their tracebacks and Horovod's exit notices do not (the error has it)
    said = capfd.readouterr()
    assert "[0]<stdout>:rank 0 starts" in said.out and "[1]<stderr>:rank 1 warns" in said.err, said
    assert "Traceback" not in said.out + said.err and "exit with status code" not in said.out + said.err, said
    error = caught.value
    assert error.rank == 1
    message = str(error)
    assert "rank 1 of 2" in message
    assert "ValueError: deliberate failure in the worker" in message
    assert "Traceback (most recent call last)" in message
    assert "raise_on_rank_one" in message
    assert list((tmp_path / "jobs").iterdir()) == []  # the job folder is removed


@pytest.mark.slow
def test_killed_worker_fails_the_job_quickly() -> None:
    start = time.monotonic()
    with pytest.raises(HorovodWorkerError) as caught:
        HorovodRunner(np=-2).run(kill_rank_one)
    elapsed = time.monotonic() - start
    assert elapsed < 45, f"a killed worker took {elapsed:.0f} s to fail the job"
    assert caught.value.rank == 1
    assert "died without a Python error" in str(caught.value)
    assert "SIGKILL" in str(caught.value)


# --- Spark mode ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_spark_run_on_local_session(spark) -> None:
    result = HorovodRunner(np=2).run(rank_info, tag="spark")
    assert (result["tag"], result["rank"], result["size"], result["sum"]) == ("spark", 0, 2, 3.0)


@pytest.mark.slow
def test_spark_worker_exception_names_the_rank(spark) -> None:
    with pytest.raises(HorovodWorkerError) as caught:
        HorovodRunner(np=2, driver_log_verbosity="all").run(raise_on_rank_one)
    assert caught.value.rank == 1
    assert "ValueError: deliberate failure in the worker" in caught.value.worker_traceback


@pytest.mark.slow
def test_spark_killed_worker_fails_the_job_quickly(spark) -> None:
    start = time.monotonic()
    with pytest.raises(HorovodWorkerError) as caught:
        HorovodRunner(np=2).run(kill_rank_one)
    elapsed = time.monotonic() - start
    assert elapsed < 45, f"a killed Spark worker took {elapsed:.0f} s to fail the job"
    assert caught.value.rank == 1
    assert "died without a Python error" in str(caught.value)


def test_spark_gpu_job_needs_one_gpu_per_task(spark) -> None:
    # the shared local session schedules no GPUs: nothing may start
    with pytest.raises(
        CourseInputError,
        match=r"^HorovodRunner\(np=2\) with use_gpu=True needs one GPU per Spark "
        r"task: .*spark.task.resource.gpu.amount=1",
    ):
        HorovodRunner(np=2, use_gpu=True).run(rank_info, tag="gpu")


def test_spark_mode_without_a_session_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)  # no session at all in this process
    with pytest.raises(CourseInputError, match="no active SparkSession"):
        HorovodRunner(np=2).run(rank_info, tag="x")
