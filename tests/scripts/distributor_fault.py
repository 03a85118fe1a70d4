"""A worker dies during TorchDistributor training on a 2-worker cluster; then the rerun resumes (part of
tests/scripts/cluster_session.py; tests/test_multi_node_faults.py says what is checked)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from helpers.cluster import LocalCluster
from helpers.loaders import prepare_data
from helpers.worker import TrainSettings, train_with_distributor
from tests.processes import alive

CKPT = Path(os.environ["COURSE_WORK_DIR"]) / "checkpoints" / "faults"
SETTINGS = TrainSettings(
    batch_size=16,
    image_size=16,
    learning_rate=0.02,
    max_epochs=200,  # far more than run before the kill: the first run must not end before it (an epoch takes <1 s)
    early_stopping=False,
    default_dir=str(CKPT),
    mlflow_experiment="faults",
)


def start_training(data, outcome: dict) -> threading.Thread:
    """The first training, in a thread; ``outcome`` gets its result or its error and when it failed."""
    _, train_converter, val_converter, class_names = data

    def first_run() -> None:
        try:
            outcome["result"] = train_with_distributor(train_converter, val_converter, len(class_names), SETTINGS)
        except BaseException as error:
            outcome["error"] = error
            outcome["failed_at"] = time.monotonic()

    thread = threading.Thread(target=first_run)
    thread.start()
    return thread


def kill_after_first_checkpoint(cluster: LocalCluster, thread: threading.Thread, outcome: dict, timeout: float) -> dict:
    """Wait for the first epoch's checkpoint, kill worker 1, wait (at most ``timeout`` s) for the training to end:
    what happened."""
    import torch

    while not (CKPT / "last.ckpt").exists() and thread.is_alive():
        time.sleep(0.2)
    if not thread.is_alive():  # it ended before its first checkpoint: nothing to test, say why
        return {"ended_early": repr(outcome.get("error") or outcome.get("result"))[-3000:]}
    killed_at = time.monotonic()
    report = {"killed_pid": cluster.kill_worker(1)}
    while cluster.alive_workers() != 1 and time.monotonic() - killed_at < 60:
        time.sleep(0.2)
    report["seconds_to_notice"] = time.monotonic() - killed_at
    report["alive_after_kill"] = cluster.alive_workers()
    report["killed_running"] = alive([report["killed_pid"]])
    thread.join(timeout=timeout)
    error = outcome.get("error")
    report["first_run"] = "finished" if "result" in outcome else "hung" if thread.is_alive() else "failed"
    if error is not None:
        report["error_type"] = type(error).__name__
        report["message"] = str(error)
        report["seconds_to_fail"] = outcome["failed_at"] - killed_at
        report["last_checkpoint"] = getattr(error, "last_checkpoint", None)
    if report.get("last_checkpoint"):  # read once the job is over: rank 0 may have saved later epochs before the kill
        checkpoint = torch.load(report["last_checkpoint"], map_location="cpu", weights_only=False)
        report["saved_epoch"] = checkpoint["epoch"]
    return report


def resume(cluster: LocalCluster, data, report: dict) -> dict:
    """Replace the lost worker and rerun from the failed run's last checkpoint; the MLflow run statuses."""
    from mlflow.tracking import MlflowClient

    from helpers.tracking import tracking_uri

    _, train_converter, val_converter, class_names = data
    cluster.restart_worker(1)
    alive = cluster.alive_workers()
    settings = SETTINGS.replace(ckpt_restore=report["last_checkpoint"], max_epochs=report["saved_epoch"] + 3)
    resumed = train_with_distributor(train_converter, val_converter, len(class_names), settings)
    client = MlflowClient(tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    return {
        "alive_after_restart": alive,
        "resumed": {
            "epochs_run": resumed.epochs_run,
            "history": resumed.history,
            "val_acc": resumed.val_acc,
            "run_id": resumed.mlflow_run_id,
        },
        "run_statuses": sorted(run.info.status for run in runs),
    }


def lose_a_worker_and_resume(cluster: LocalCluster, data_dir: str, timeout: float) -> dict:
    """Train on both workers, kill worker 1 after the first checkpoint (how long the master and the job take to
    notice), then rerun from the last checkpoint on a replacement worker."""
    data = prepare_data(data_dir, num_devices=2, spark=cluster.spark)
    outcome: dict = {}
    thread = start_training(data, outcome)
    report = kill_after_first_checkpoint(cluster, thread, outcome, timeout)
    if "error_type" in report:
        report.update(resume(cluster, data, report))
    return report
