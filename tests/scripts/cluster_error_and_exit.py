"""A cluster left by an exception, then one abandoned until the interpreter exits; prints the report at exit.

Usage: ``python -m tests.scripts.cluster_error_and_exit START_TIMEOUT`` with ``COURSE_WORK_DIR`` set. The exit hook
is registered before ``helpers.cluster`` is imported, so it runs after the cluster's own.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

from tests.processes import alive, processes_of

WORK = os.environ["COURSE_WORK_DIR"]
report: dict = {}


def check_at_exit() -> None:
    """After the cluster's own exit hook: what is left of the abandoned cluster."""
    report["exit_left"] = processes_of(WORK)
    report["exit_pids_running"] = alive(report["exit_pids"])
    print("REPORT " + json.dumps(report), flush=True)


def main(start_timeout: float) -> None:
    atexit.register(check_at_exit)
    from helpers.cluster import LocalCluster

    cluster = LocalCluster(workers=1, start_timeout=start_timeout)
    try:
        with cluster:
            report["error_pids"] = cluster.pids
            report["error_running"] = processes_of(WORK)
            raise RuntimeError("boom inside the with block")
    except RuntimeError as error:
        report["error"] = str(error)
    report["error_left"] = processes_of(WORK)
    report["error_pids_running"] = alive(report["error_pids"])

    abandoned = LocalCluster(workers=1, start_timeout=start_timeout).start()
    report["exit_pids"] = abandoned.pids
    report["exit_running"] = processes_of(WORK)


if __name__ == "__main__":
    main(float(sys.argv[1]))
