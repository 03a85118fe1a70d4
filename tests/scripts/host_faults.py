"""Runs on the driver host of the multi-host test cluster (helpers.multihost): trains lesson 2's model on 3 processes
across the workers, and once the first checkpoint exists asks the test to take a worker host away (its link down, or
frozen); reports how the job ended, then resumes on the hosts left and reports that too. One scenario after another,
in one Spark application; tests/test_multihost.py says what is checked.

The test and this script talk through files in the shared folder: ``<name>.ready`` (this script: take the host
away now), ``<name>.fault`` (the test: done, with the time it was), ``<name>.done`` (this script: resumed, look at
the hosts left), ``<name>.back`` (the test: the host is back), ``<name>.json`` (this script: the scenario's report,
also written when it ended before its first checkpoint, without a ``.ready``).

Usage: ``python -m tests.scripts.host_faults MASTER_URL SIGNALS_DIR LAUNCHER:FAULT ...`` with the parameter file's
``runner.env`` (work folder, stall and heartbeat bounds) in the environment.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from helpers.cluster import LocalCluster
from helpers.loaders import prepare_data
from helpers.lost_hosts import executor_hosts
from helpers.spark import LOG4J2_CONFIG, QUICK_JVM_OPTIONS, executor_count
from helpers.workdir import work_dir
from helpers.worker import TrainSettings, launch_training

PROCESSES = 3
SIGNAL_TIMEOUT_S = 300
#: the driver's logging, and how its JVM came to exit if it does mid-job (a scenario that ended early, see
#: tests/fixtures/log4j2-exits.properties): Log4j 2 merges the files listed
EXITS_LOGGED = {
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()},"
    f"{Path(__file__).parents[1].joinpath('fixtures', 'log4j2-exits.properties').as_uri()} {QUICK_JVM_OPTIONS}"
}


def wait_for(path: Path, timeout: float = SIGNAL_TIMEOUT_S) -> str:
    """The text of ``path`` once it exists (the other side's signal)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout:g} s")
        time.sleep(0.2)
    return path.read_text()


def settings_for(name: str) -> TrainSettings:
    """Many more epochs than run before the fault (an epoch takes seconds), a checkpoint folder of its own."""
    return TrainSettings(
        batch_size=16, image_size=16, learning_rate=0.02, max_epochs=200, early_stopping=False,
        default_dir=str(work_dir() / "checkpoints" / name), mlflow_experiment="host-faults",
    )  # fmt: skip


def ask_for_the_fault(checkpoint: Path, ready: Path, training_ended: threading.Event) -> None:
    """In a thread beside the training: once ``checkpoint`` exists, ask the test to take the host away."""
    while not checkpoint.exists() and not training_ended.is_set():
        time.sleep(0.2)
    if not training_ended.is_set():
        ready.write_text("now")


def scenario(spark, data, launcher: str, fault: str, signals: Path) -> dict:
    """Train, lose a host after the first checkpoint, see the job end, resume on the hosts left."""
    import torch

    name = f"{launcher}-{fault}"
    _, train, val, classes = data
    settings = settings_for(name)
    report: dict = {"scenario": name, "started_on": PROCESSES, "executors_at_start": dict(executor_hosts(spark))}
    ended = threading.Event()
    asking = threading.Thread(
        target=ask_for_the_fault, args=(Path(settings.default_dir) / "last.ckpt", signals / f"{name}.ready", ended)
    )
    asking.start()
    try:  # in this (the main) thread, as in a notebook: the launchers use the thread's active SparkSession
        launch_training(launcher, PROCESSES, train, val, len(classes), settings, on_spark=True)
        report["first_run"] = "finished"
    except Exception as error:
        report.update(first_run="failed", failed_at=time.time(), error_type=type(error).__name__, message=str(error),
                      last_checkpoint=getattr(error, "last_checkpoint", None))  # fmt: skip
    ended.set()
    asking.join()
    if not (signals / f"{name}.ready").exists():
        return {**report, "ended_early": report.get("message", "it finished")[-3000:]}
    report["seconds_to_fail"] = report.pop("failed_at", time.time()) - float(wait_for(signals / f"{name}.fault"))
    last = report.get("last_checkpoint")
    if last:
        saved = torch.load(last, map_location="cpu", weights_only=False)["epoch"]
        resumed = launch_training(
            launcher, PROCESSES - 1, train, val, len(classes),
            settings.replace(ckpt_restore=last, max_epochs=saved + 3, default_dir=None), on_spark=True,
        )  # fmt: skip
        report.update(saved_epoch=saved, resumed_epochs=[row["epoch"] for row in resumed.history])
    (signals / f"{name}.done").write_text("look")
    wait_for(signals / f"{name}.back")
    deadline = time.monotonic() + SIGNAL_TIMEOUT_S
    while executor_count(spark) < PROCESSES and time.monotonic() < deadline:  # the host's new executor
        time.sleep(0.5)
    return report


def main(master_url: str, signals: str, scenarios: list[str]) -> None:
    with LocalCluster(workers=PROCESSES, master_url=master_url, start_timeout=180, spark_conf=EXITS_LOGGED) as cluster:
        data = prepare_data(None, num_devices=PROCESSES, spark=cluster.spark)
        for launcher_and_fault in scenarios:
            launcher, fault = launcher_and_fault.split(":")
            name, folder = f"{launcher}-{fault}", Path(signals)
            try:
                report = scenario(cluster.spark, data, launcher, fault, folder)
            except Exception:  # reported, and the test is not left waiting for its signals
                report = {"scenario": name, "crashed": traceback.format_exc()[-4000:]}
                if (folder / f"{name}.ready").exists() and not (folder / f"{name}.done").exists():
                    (folder / f"{name}.done").write_text("crashed")
                    wait_for(folder / f"{name}.back")
            (folder / f"{name}.json").write_text(json.dumps(report))
    sys.stdout.flush()
    os._exit(0)  # not waiting for Horovod's threads that still wait on a lost host's task service


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
