"""One 2-worker cluster: registration, a job, a guest connection, a killed worker, then exit; prints the report.

Usage: ``python -m tests.scripts.cluster_main START_TIMEOUT`` with ``COURSE_WORK_DIR`` set (tests/test_cluster.py).
"""

from __future__ import annotations

import json
import os
import sys
import time

from helpers.cluster import LocalCluster, alive_workers, master_state
from helpers.spark import get_spark
from tests.processes import alive, processes_of

SIZING = ("spark.executor.cores", "spark.executor.memory", "spark.task.cpus", "spark.cores.max")


def sizing(spark) -> dict:
    """The executor sizing settings of ``spark`` (None where unset)."""
    conf = spark.sparkContext.getConf()
    return {key: conf.get(key, None) for key in SIZING}


def where_am_i(rows) -> list[dict]:
    """Runs in a Spark Python worker: the executor JVM above it, that executor's parent, this interpreter."""
    import sys

    import psutil

    executor = next(
        (p for p in psutil.Process().parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline())), None
    )
    return [
        {
            "executor": executor and executor.pid,
            "parent": executor and executor.ppid(),
            "python": sys.executable,
            "rows": len(list(rows)),
        }
    ]


def registration(cluster: LocalCluster, work: str) -> dict:
    """What the master reports and which processes run, plus where a job's tasks ran."""
    state = master_state(cluster.ui_url)
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
    }


def guest(cluster: LocalCluster, start_timeout: float) -> dict:
    """A second LocalCluster that connects to the running master: it must start and stop nothing."""
    report = {}
    with LocalCluster(workers=2, master_url=cluster.master_url, start_timeout=start_timeout) as guest:
        report["guest_pids"] = guest.pids
        report["guest_master"] = guest.spark.sparkContext.master
        report["guest_sum"] = guest.spark.sparkContext.parallelize(range(100), 4).sum()
        report["guest_sizing"] = sizing(guest.spark)
    report["after_guest_alive_workers"] = alive_workers(master_state(cluster.ui_url))
    report["after_guest_running"] = alive(cluster.pids)
    return report


def kill_one(cluster: LocalCluster) -> dict:
    """Kill worker 1; how long the master takes to notice."""
    killed = cluster.kill_worker(1)
    start = time.monotonic()
    while cluster.alive_workers() != 1 and time.monotonic() - start < 60:
        time.sleep(0.2)
    return {
        "seconds_to_notice": time.monotonic() - start,
        "alive_after_kill": cluster.alive_workers(),
        "killed_pid": killed,
        "killed_running": alive([killed]),
    }


def main(start_timeout: float) -> None:
    work = os.environ["COURSE_WORK_DIR"]
    report = {"driver_python": sys.executable}
    with LocalCluster(workers=2, start_timeout=start_timeout) as cluster:
        report.update(registration(cluster, work))
        report.update(guest(cluster, start_timeout))
        report.update(kill_one(cluster))
    report["left_after_exit"] = processes_of(work)
    report["pids_after_exit"] = alive(report["pids"])
    local = get_spark(cores=1)
    report["local_after_exit"] = [local.sparkContext.master, sizing(local)]
    local.stop()
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(float(sys.argv[1]))
