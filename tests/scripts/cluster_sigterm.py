"""Start a 1-worker cluster, print ``PIDS [..]``, then wait to be sent SIGTERM.

Usage: ``python -m tests.scripts.cluster_sigterm START_TIMEOUT WAIT_S`` with ``COURSE_WORK_DIR`` set.
"""

from __future__ import annotations

import json
import sys
import time

from helpers.cluster import LocalCluster


def main(start_timeout: float, wait_s: float) -> None:
    cluster = LocalCluster(workers=1, start_timeout=start_timeout).start()
    print("PIDS " + json.dumps(cluster.pids), flush=True)
    time.sleep(wait_s)


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]))
