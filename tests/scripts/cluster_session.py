"""The suite's one 2-worker cluster session, shared by tests/test_cluster.py, tests/test_ray_on_spark.py, the 6.2
answers of tests/test_answers_lesson6.py and tests/test_multi_node_faults.py (one cluster start and one driver instead
of two): registration and a job; Ray on Spark and Ray Train (tests/scripts/ray_session.py, while both workers are
there); TorchDistributor training that loses worker 1, a replacement worker and the resumed rerun
(tests/scripts/distributor_fault.py); a guest connection; then exit. Prints the report.

Usage: ``python -m tests.scripts.cluster_session DATA_DIR START_TIMEOUT TRAINING_TIMEOUT`` with ``COURSE_WORK_DIR``
set.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from helpers.cluster import LocalCluster, alive_workers, master_state
from helpers.spark import get_spark
from tests.processes import alive, processes_of
from tests.scripts.distributor_fault import lose_a_worker_and_resume
from tests.scripts.ray_session import ray_on_the_cluster

SIZING = ("spark.executor.cores", "spark.executor.memory", "spark.task.cpus", "spark.cores.max")


def sizing(spark) -> dict:
    """The executor sizing settings of ``spark`` (None where unset)."""
    conf = spark.sparkContext.getConf()
    return {key: conf.get(key, None) for key in SIZING}


def where_am_i(rows) -> list[dict]:
    """Runs in a Spark Python worker: the executor JVM above it, its JVM options, that executor's parent, this
    interpreter."""
    import sys

    import psutil

    executor = next(
        (p for p in psutil.Process().parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline())), None
    )
    return [
        {
            "executor": executor and executor.pid,
            "parent": executor and executor.ppid(),
            "jvm_options": executor and executor.environ().get("JAVA_TOOL_OPTIONS", ""),
            "python": sys.executable,
            "rows": len(list(rows)),
        }
    ]


def registration(cluster: LocalCluster, work: str) -> dict:
    """What the master reports and which processes run, plus where a job's tasks ran."""
    state = master_state(cluster.ui_url)
    driver_jvm = cluster.spark.sparkContext._jvm
    return {
        "master_url": cluster.master_url,
        "ui_url": cluster.ui_url,
        "pids": cluster.pids,
        "worker_pids": cluster.worker_pids(),
        "alive_workers": alive_workers(state),
        "aliveworkers_field": state.get("aliveworkers"),
        "running": processes_of(work),
        "sizing": sizing(cluster.spark),
        "tasks": cluster.spark.sparkContext.parallelize(range(80), 8).mapPartitions(where_am_i).collect(),
        "driver_jvm_options": list(
            driver_jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
        ),
    }


def guest(cluster: LocalCluster, start_timeout: float) -> dict:
    """A second LocalCluster that connects to the running master: it must start and stop nothing, and size its
    executors from the workers the master reports, not from its own arguments (which no worker could host)."""
    report = {}
    big = {"cores_per_worker": 4, "memory_per_worker": "4g"}
    with LocalCluster(
        workers=2, master_url=cluster.master_url, master_ui_url=cluster.ui_url, start_timeout=start_timeout, **big
    ) as guest:
        report["guest_pids"] = guest.pids
        report["guest_master"] = guest.spark.sparkContext.master
        report["guest_sum"] = guest.spark.sparkContext.parallelize(range(100), 4).sum()
        report["guest_sizing"] = sizing(guest.spark)
    report["after_guest_alive_workers"] = alive_workers(master_state(cluster.ui_url))
    report["after_guest_running"] = alive(cluster.pids)
    return report


def main(data_dir: str, start_timeout: float, training_timeout: float) -> None:
    work = os.environ["COURSE_WORK_DIR"]
    report = {"driver_python": sys.executable}
    with LocalCluster(workers=2, start_timeout=start_timeout) as cluster:
        report.update(registration(cluster, work))
        report["ray"] = ray_on_the_cluster(cluster, Path(work))
        report.update(lose_a_worker_and_resume(cluster, data_dir, training_timeout))
        report["pids_before_guest"] = cluster.pids
        report.update(guest(cluster, start_timeout))  # last: the guest stops the driver's SparkContext
    started = report["pids"] + cluster.pids  # the replacement worker too
    report["left_after_exit"] = processes_of(work)
    report["pids_after_exit"] = alive(started)
    local = get_spark(cores=1)
    report["local_after_exit"] = [local.sparkContext.master, sizing(local)]
    local.stop()
    print("REPORT " + json.dumps(report, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
