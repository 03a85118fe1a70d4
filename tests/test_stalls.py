"""Stalled collectives end within the stall bound, with real processes, on both launchers.

Two mistakes, each in a small training-shaped loop of allreduces (no model: the point is the collectives): uneven
shards (rank 1 has fewer batches and moves on to its epoch end) and a skipped step (rank 1 skips one step's
allreduce, as when it caught an error before it). Each job must end within the bound set by the test with its
launcher's error naming the stall, the ranks that did not join and the usual causes; no worker process may be left,
and the MLflow run the job opened is FAILED. The relation between the course's stall bound and the grader's
per-notebook timeout is pinned too.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

from helpers.course.grade import DEFAULT_TIMEOUT_S
from helpers.distributor import DistributorError, make_distributor, run_with_distributor
from helpers.horovod_runner import HorovodRunner, HorovodWorkerError
from helpers.jobs import DEFAULT_STALL_TIMEOUT_S, STALL_HINT, STALL_TIMEOUT_ENV

# the workers cannot import tests/: send this module's functions by value (TorchDistributor pickles with pyspark's
# own copy of cloudpickle)
for _pickler in (cloudpickle, pyspark_cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])

BOUND_S = 5
# a job's own start and stop (process start-up, torchrun and Horovod teardown) on a loaded 2-core machine
JOB_OVERHEAD_S = 60
WORKER_MARKERS = ("horovod.runner", "torch.distributed.run", "torch_run_process_wrapper")

# rank 1's batches and skipped step, per mistake (rank 0 has 3 batches and skips nothing)
MISTAKES = {"uneven_shards": {"batches": 2, "skip": None}, "skipped_step": {"batches": 3, "skip": 1}}


def _mlflow_run(rank: int, tracking_uri: str):
    """On rank 0 an MLflow run, recorded with the job, as helpers.training.train opens it; elsewhere nothing."""
    import contextlib

    import mlflow

    from helpers.jobs import record_mlflow_run

    if rank != 0:
        return contextlib.nullcontext()
    mlflow.set_tracking_uri(tracking_uri)
    run = mlflow.start_run(run_name="stall")
    record_mlflow_run(run.info.run_id, tracking_uri)
    return run


def horovod_steps(batches: int, skip: int | None, tracking_uri: str) -> None:
    """Rank 0 allreduces 3 gradients, rank 1 ``batches`` (skipping step ``skip``); then each its epoch's loss."""
    import horovod.torch as hvd
    import torch

    rank = int(os.environ["HOROVOD_RANK"])
    with _mlflow_run(rank, tracking_uri):
        hvd.init()  # after rank 0 opened its run (seconds on a loaded machine): the ranks start the steps together
        own = (3, None) if rank == 0 else (batches, skip)
        for step in range(own[0]):
            if step != own[1]:
                hvd.allreduce(torch.ones(4), name="grad")
        hvd.allreduce(torch.ones(1), name="epoch_loss")


def ddp_steps(batches: int, skip: int | None, tracking_uri: str) -> None:
    """The same with ``torch.distributed`` (the process group's timeout is the stall bound); rank 1 then works
    alone at its epoch end (validation, a checkpoint) for longer than the bound."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from helpers.jobs import stall_timeout_s

    rank = int(os.environ["RANK"])
    opened = Path(tracking_uri.removeprefix("sqlite:///")).with_suffix(".opened")
    with _mlflow_run(rank, tracking_uri):
        # the steps start together once rank 0 has opened its run (seconds on a loaded machine): a file, not a
        # collective, since every collective here, the process group's start included, is bounded by the stall bound
        if rank == 0:
            opened.touch()
        deadline = time.monotonic() + 120
        while not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        dist.init_process_group("gloo", timeout=timedelta(seconds=stall_timeout_s()))
        own = (3, None) if rank == 0 else (batches, skip)
        for step in range(own[0]):
            if step != own[1]:
                dist.all_reduce(torch.ones(4))
        if rank == 1:
            time.sleep(10 * stall_timeout_s())
        dist.all_reduce(torch.ones(1))


def _workers_left() -> list[str]:
    """Command lines of this process's descendants that are training workers."""
    left = []
    for proc in psutil.Process().children(recursive=True):
        try:
            command = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if any(marker in command for marker in WORKER_MARKERS):
            left.append(command)
    return left


def _run_status(tracking_uri: str) -> list[str]:
    """The status of every MLflow run in the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    return [run.info.status for exp in client.search_experiments() for run in client.search_runs([exp.experiment_id])]


@pytest.fixture
def stall_bound(monkeypatch: pytest.MonkeyPatch, work_dir: Path) -> str:
    """The bound set by the test; returns an MLflow store under the test's work directory, created here so that
    rank 0 does not spend seconds creating it while rank 1 waits (that wait would be a stall of its own)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv(STALL_TIMEOUT_ENV, str(BOUND_S))
    tracking_uri = f"sqlite:///{work_dir / 'mlflow.db'}"
    MlflowClient(tracking_uri).search_experiments()
    return tracking_uri


def _check_ended(error: Exception, elapsed: float, tracking_uri: str) -> str:
    """The job ended within the bound, left no worker, marked its run FAILED; returns the error's message."""
    message = str(error)
    assert elapsed < BOUND_S + JOB_OVERHEAD_S, f"the stalled job took {elapsed:.0f} s:\n{message}"
    assert STALL_HINT.rstrip(".") in message, message
    deadline = time.monotonic() + 10
    while _workers_left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _workers_left(), _workers_left()
    assert _run_status(tracking_uri) == ["FAILED"]
    return message


@pytest.mark.slow
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_horovod_stall_ends_with_ranks_and_tensor(mistake: str, stall_bound: str):
    started = time.monotonic()
    with pytest.raises(HorovodWorkerError) as caught:
        HorovodRunner(np=-2).run(horovod_steps, **MISTAKES[mistake], tracking_uri=stall_bound)
    message = _check_ended(caught.value, time.monotonic() - started, stall_bound)
    # both ranks wait, each in its own collective: whichever passes the bound first tells the story
    views = {0: ("grad", 1, "epoch_loss"), 1: ("epoch_loss", 0, "grad")}
    waited, other, elsewhere = views[caught.value.rank]
    host = socket.gethostname()  # where the rank that did not join started
    told = (
        f"rank {caught.value.rank} waited {BOUND_S} s in '{waited}'; rank(s) {other} ({host}, waiting in '{elsewhere}')"
    )
    assert f"StalledCollectiveError: {told} did not join it" in message, message


@pytest.mark.slow
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_distributor_stall_ends_with_ranks(mistake: str, stall_bound: str, spark):
    started = time.monotonic()
    with pytest.raises(DistributorError) as caught:
        distributor = make_distributor(2, local_mode=True, spark=spark)
        run_with_distributor(distributor, ddp_steps, spark=spark, **MISTAKES[mistake], tracking_uri=stall_bound)
    message = _check_ended(caught.value, time.monotonic() - started, stall_bound)
    assert "a collective stalled: rank(s) 0 (at `dist.all_reduce(torch.ones(4))`)" in message, message
    told = f"stall bound ({BOUND_S} s, {STALL_TIMEOUT_ENV}) and rank(s) 1 ({socket.gethostname()}) did not join"
    assert told in message, message


def test_stall_bound_ends_a_notebook_long_before_the_grader():
    """A stalled exercise must end inside its notebook, with its own message, well before the grader stops the
    notebook: the bound plus a job's own start and stop stays under half the grader's per-notebook timeout."""
    assert DEFAULT_STALL_TIMEOUT_S + JOB_OVERHEAD_S <= DEFAULT_TIMEOUT_S / 2


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("grad", "grad"),
        ("list.sz", "hvd.allgather_object of a list"),
        ("dict.t", "hvd.allgather_object of a dict"),
        ("the check gathering every rank's weights.sz", "the check gathering every rank's weights"),
        ("layer.weight", "layer.weight"),
    ],
)
def test_a_stall_names_an_object_gather_by_its_call_not_its_internal_steps(name: str, said: str):
    """``hvd.allgather_object`` gathers in two collectives, ``NAME.sz`` and ``NAME.t``: a stall in one says the call
    (the checks name theirs), never Horovod's internal ``list.sz``."""
    from helpers.horovod_runner import _said

    assert _said(name) == said
