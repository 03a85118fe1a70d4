"""Runs on the driver host of the multi-host test cluster (helpers.multihost): connects to its master as lesson 4 does
and reports, as one JSON line, what the cluster path must get right across hosts: the address the driver advertises,
where the executors run, the environment the training processes get, the shared folder, and a TorchDistributor job
whose 3 processes meet across hosts, one of them on a host whose name resolves to 127.0.1.1, and (where Horovod is
installed) a Horovod-on-Spark allreduce with no interface named.

Usage: ``python -m tests.scripts.multihost_driver MASTER_URL WORKERS`` with ``COURSE_WORK_DIR`` on the shared folder
and ``COURSE_WORKER_ENV`` naming the variables to hand on.
"""

from __future__ import annotations

import json
import os
import sys

from helpers.cluster import LocalCluster
from helpers.devices import horovod_installed
from helpers.distributor import make_distributor, run_with_distributor
from helpers.horovod_runner import HorovodRunner
from helpers.shared_storage import check_shared_folder
from helpers.workdir import work_dir


def where(_rows):
    """In a task: this host's name and the variables the driver handed on."""
    import os
    import socket

    yield socket.gethostname(), os.environ.get("COURSE_PROBE")


def allreduce() -> dict:
    """In every training process: one allreduce over the process group, and what chose its interface."""
    import os
    import socket

    import torch
    import torch.distributed as dist

    from helpers.network import pin_interface

    pin_interface()  # what helpers.training.train does before Lightning starts the process group
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    report = {
        "host": socket.gethostname(),
        "resolves_to": socket.gethostbyname(socket.gethostname()),
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "probe": os.environ.get("COURSE_PROBE"),
        "world": dist.get_world_size(),
        "sum": total.item(),
    }
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    dist.destroy_process_group()
    return gathered


def hvd_allreduce() -> dict:
    """In every Horovod process: one allreduce, and where it ran."""
    import socket

    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {"host": socket.gethostname(), "size": hvd.size(), "sum": total.item()}


def main(master_url: str, workers: int) -> None:
    with LocalCluster(workers=workers, master_url=master_url, start_timeout=120) as cluster:
        spark = cluster.spark
        tasks = spark.sparkContext.parallelize(range(workers), workers).barrier().mapPartitions(where).collect()
        report = {
            "driver_host": spark.conf.get("spark.driver.host"),
            "tasks": tasks,
            "shared_hosts": check_shared_folder(spark, work_dir()),
            "ranks": run_with_distributor(make_distributor(workers, local_mode=False), allreduce),
        }
        if horovod_installed():  # no interface named: Horovod's own probe between the tasks chooses it
            report["horovod"] = HorovodRunner(np=workers).run(hvd_allreduce)
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("COURSE_STALL_TIMEOUT_S", "60")
    main(sys.argv[1], int(sys.argv[2]))
