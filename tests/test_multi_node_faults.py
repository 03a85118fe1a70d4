"""A worker dies during TorchDistributor training on the local cluster: the job fails fast, the rerun resumes.

One driver script (a subprocess: a process holds one SparkContext, and the shared local ``spark`` fixture must stay
usable) starts a 2-worker ``LocalCluster``, trains the lesson 2 model with Lightning DDP on both workers, and as
soon as the first epoch's checkpoint exists SIGKILLs worker 1 with its executor and training process, as a lost
machine would die. The job must fail with ``DistributorError`` naming what happened and the last checkpoint, within
a bounded time (Spark on its own would retry the barrier stage and wait minutes for free slots). A replacement
worker joins, and the rerun with ``ckpt_restore`` continues at the next epoch. The script prints one JSON report.

A small image folder keeps the data preparation short; whether the model learns is for the notebook and
``test_distributor.py`` (on the default data) to show.
"""

from __future__ import annotations

import psutil
import pytest

from tests.image_folders import make_image_folder
from tests.processes import SPARK_MARKERS, TORCHRUN_MARKERS, processes_of, run_driver

SCRIPT_TIMEOUT = 480
FAIL_LIMIT_S = 120  # from the kill to DistributorError in the driver

SCRIPT = """
import json, os, sys, threading, time
from pathlib import Path

report = {}
from helpers.cluster import LocalCluster
from helpers.distributor import DistributorError
from helpers.worker import train_with_distributor, TrainSettings
from helpers.loaders import prepare_data

WORK = Path(os.environ["COURSE_WORK_DIR"])
CKPT = WORK / "checkpoints" / "faults"
settings = TrainSettings(batch_size=16, image_size=16, learning_rate=0.02, max_epochs=8, early_stopping=False,
                         default_dir=str(CKPT), mlflow_experiment="faults")

with LocalCluster(workers=2, cores_per_worker=1, start_timeout=180) as cluster:
    report["pids"] = cluster.pids
    _, train_converter, val_converter, class_names = prepare_data(DATA_DIR, num_devices=2, spark=cluster.spark)
    outcome = {}

    def first_run():
        try:
            outcome["result"] = train_with_distributor(train_converter, val_converter, len(class_names), settings)
        except BaseException as error:
            outcome["error"] = error
            outcome["failed_at"] = time.monotonic()

    thread = threading.Thread(target=first_run)
    thread.start()
    while not (CKPT / "last.ckpt").exists() and thread.is_alive():
        time.sleep(0.2)
    if not thread.is_alive():  # it ended before its first checkpoint: nothing to test, say why
        report["ended_early"] = repr(outcome.get("error") or outcome.get("result"))[-3000:]
        print("REPORT " + json.dumps(report), flush=True)
        sys.exit(1)
    time.sleep(1.0)  # let the checkpoint file be complete
    import torch
    report["saved_epoch"] = torch.load(CKPT / "last.ckpt", map_location="cpu", weights_only=False)["epoch"]
    killed_at = time.monotonic()
    report["killed_pid"] = cluster.kill_worker(1)
    thread.join(timeout=SCRIPT_TIMEOUT)
    error = outcome.get("error")
    report["first_run"] = "finished" if "result" in outcome else "hung" if thread.is_alive() else "failed"
    if error is not None:
        report["error_type"] = type(error).__name__
        report["message"] = str(error)
        report["seconds_to_fail"] = outcome["failed_at"] - killed_at
        report["last_checkpoint"] = getattr(error, "last_checkpoint", None)
        cluster.restart_worker(1)
        report["alive_after_restart"] = cluster.alive_workers()
        resumed = train_with_distributor(
            train_converter, val_converter, len(class_names),
            settings.replace(ckpt_restore=error.last_checkpoint, max_epochs=report["saved_epoch"] + 3),
        )
        report["resumed"] = {"epochs_run": resumed.epochs_run, "history": resumed.history,
                             "val_acc": resumed.val_acc, "run_id": resumed.mlflow_run_id}
        from mlflow.tracking import MlflowClient
        from helpers.tracking import tracking_uri
        client = MlflowClient(tracking_uri())
        runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
        report["run_statuses"] = sorted(run.info.status for run in runs)
print("REPORT " + json.dumps(report), flush=True)
"""


def our_processes(work: str) -> list[int]:
    """Spark and torchrun processes started with ``work`` as the course's work directory."""
    return processes_of(work, SPARK_MARKERS + TORCHRUN_MARKERS)


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory) -> dict:
    """Run the driver script to its end; its report, plus what was left running afterwards."""
    work = tmp_path_factory.mktemp("faults-work")
    data = make_image_folder(tmp_path_factory.mktemp("faults-data"), {"dark": 60, "light": 60}, size=(16, 16))
    report, _ = run_driver(SCRIPT, work, SCRIPT_TIMEOUT, DATA_DIR=str(data), SCRIPT_TIMEOUT=SCRIPT_TIMEOUT)
    assert "ended_early" not in report, report["ended_early"]
    report["left_running"] = our_processes(str(work))
    return report


@pytest.mark.slow
def test_a_killed_worker_fails_the_job_fast_with_a_clear_message(fault_run):
    assert fault_run["first_run"] == "failed", fault_run
    assert fault_run["error_type"] == "DistributorError"
    assert fault_run["seconds_to_fail"] < FAIL_LIMIT_S
    message = fault_run["message"]
    assert "TorchDistributor training with 2 processes on Spark workers failed" in message
    assert "lost an executor" in message or "task failed" in message
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
    assert fault_run["left_running"] == []
