"""A worker dies during TorchDistributor training on the local cluster: the job fails fast, the rerun resumes.

One driver program, tests/scripts/cluster_session.py (a subprocess: a process holds one SparkContext, and the
shared local ``spark`` fixture must stay usable), starts a 2-worker ``LocalCluster`` (and runs Ray on it, for
tests/test_ray_on_spark.py), trains the lesson 2 model with
Lightning DDP on both workers, and as soon as the first epoch's checkpoint exists SIGKILLs worker 1 with its executor
and training process, as a lost machine would die. The job must fail with ``DistributorError`` naming what happened
and the last checkpoint, within a bounded time (Spark on its own would retry the barrier stage and wait minutes for
free slots). A replacement worker joins, and the rerun with ``ckpt_restore`` continues at the next epoch. The program
prints one JSON report.

A small image folder keeps the data preparation short; whether the model learns is for the notebook and
``test_distributor.py`` (on the default data) to show.
"""

from __future__ import annotations

import psutil
import pytest

from tests.processes import SPARK_MARKERS, TORCHRUN_MARKERS, processes_of

FAIL_LIMIT_S = 120  # from the kill to DistributorError in the driver


def our_processes(work: str) -> list[int]:
    """Spark and torchrun processes started with ``work`` as the course's work directory."""
    return processes_of(work, SPARK_MARKERS + TORCHRUN_MARKERS)


@pytest.fixture(scope="module")
def fault_run(cluster_session) -> dict:
    """The cluster session's report (conftest: the cluster is shared with test_cluster.py), plus what was left
    running afterwards."""
    report, _, work = cluster_session
    assert "ended_early" not in report, report["ended_early"]
    return {**report, "left_running": our_processes(str(work))}


@pytest.mark.slow
def test_a_killed_worker_fails_the_job_fast_with_a_clear_message(fault_run):
    assert fault_run["first_run"] == "failed", fault_run
    assert fault_run["error_type"] == "DistributorError"
    assert fault_run["seconds_to_fail"] < FAIL_LIMIT_S
    message = fault_run["message"]
    assert "TorchDistributor training with 2 processes on Spark workers failed" in message
    assert "lost the executor(s) on" in message or "task failed" in message
    assert "ckpt_restore=" in message and fault_run["last_checkpoint"] in message
    assert fault_run["last_checkpoint"].endswith("last.ckpt")
    print(f"\n{message}\n({fault_run['seconds_to_fail']:.1f} s from the kill)")


@pytest.mark.slow
def test_the_rerun_with_ckpt_restore_continues_from_the_last_checkpoint(fault_run):
    assert fault_run["alive_after_restart"] == 2
    resumed = fault_run["resumed"]
    saved = fault_run["saved_epoch"]
    epochs = [row["epoch"] for row in resumed["history"]]
    # the epochs continue after the checkpoint's, they do not start from zero
    assert epochs == list(range(saved + 1, saved + 3)), epochs
    assert resumed["epochs_run"] == saved + 3
    assert resumed["run_id"] and resumed["val_acc"] is not None


@pytest.mark.slow
def test_the_failed_run_is_marked_failed_in_mlflow(fault_run):
    assert fault_run["run_statuses"] == ["FAILED", "FINISHED"]


@pytest.mark.slow
def test_no_process_of_the_test_is_left(fault_run):
    assert not any(psutil.pid_exists(pid) for pid in fault_run["pids"])
    assert fault_run["pids_after_exit"] == []  # the replacement worker too
    assert fault_run["left_running"] == []
