"""The course on a cluster of separate hosts: a Spark master, two workers (2 cores and 1), the driver and an MLflow
server, each with its own network namespace, hostname, /tmp and processes (helpers.multihost, the session fixture
``multihost``). Skipped, with the reason, where namespaces cannot be made (not root); CI runs as root.

What a cluster of several hosts needs that one machine's loopback hides: the driver advertising an address the
workers reach, executors following each worker's slots, the shared folder checked from every host, the parameter
file's environment reaching every training process, one interface choice for every launcher (a host whose name
resolves to 127.0.1.1 included), and lessons 4, 5 (ON_SPARK) and 6 running end to end with every check passing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers.course.build import read_notebook, structure
from helpers.course.checks import LOG_ENV, PASSED
from helpers.multihost import SHARED_MOUNT, MultiHostCluster, leftovers, namespaces_available
from helpers.workdir import REPO_ROOT

pytestmark = pytest.mark.slow

WORK = f"{SHARED_MOUNT}/work"
PROBE_ENV = {"COURSE_WORK_DIR": WORK, "COURSE_PROBE": "from-the-driver", "COURSE_WORKER_ENV": "COURSE_PROBE"}
LESSONS = ("04_multi_node_scaling", "05_early_stopping_analysis", "06_ray_and_deepspeed")


def driver_report(cluster: MultiHostCluster, timeout: float = 400) -> tuple[dict | None, str]:
    """Run tests/scripts/multihost_driver.py on the driver host; its report (None if it failed) and its output."""
    process = cluster.run(
        "driver", [sys.executable, "-m", "tests.scripts.multihost_driver", cluster.master_url, "3"], env=PROBE_ENV,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    out, _ = process.communicate(timeout=timeout)
    line = next((line for line in out.splitlines() if line.startswith("REPORT ")), None)
    return (json.loads(line.removeprefix("REPORT ")) if line else None), out


def test_every_host_is_a_host_of_its_own(multihost):
    names = {host: multihost.check_output(host, ["hostname"]).strip() for host in multihost.hosts}
    assert names == {host: host for host in multihost.hosts}
    multihost.check_output("driver", ["sh", "-c", "echo driver-only > /tmp/mine"])
    assert multihost.check_output("worker-1", ["sh", "-c", "ls /tmp"]).split().count("mine") == 0
    assert not any("Master" in line for line in multihost.processes("worker-1"))
    assert any("Master" in line for line in multihost.processes("spark-master"))
    multihost.check_output("worker-2", ["sh", "-c", f"echo from-worker-2 > {SHARED_MOUNT}/seen"])
    assert multihost.check_output("driver", ["cat", f"{SHARED_MOUNT}/seen"]).strip() == "from-worker-2"
    routes = multihost.check_output("driver", ["ip", "-4", "route"]).strip().splitlines()
    assert len(routes) == 1 and routes[0].startswith(str(multihost.network)), routes  # no route out
    address = multihost.hosts["worker-1"].address
    assert address in multihost.check_output("driver", ["getent", "hosts", "worker-1"])


def test_the_driver_is_reached_on_its_own_address_and_executors_follow_the_slots(multihost):
    hosts = multihost.hosts["worker-2"].netns
    hosts_file = Path("/etc/netns") / hosts / "hosts"
    original = hosts_file.read_text()
    # worker-2 as stock Debian names itself: left to itself, torch's Gloo would bind to 127.0.1.1 there
    with open(hosts_file, "w") as rewritten:  # in place: the host sees this file through a bind mount
        rewritten.write(original.replace(f"{multihost.hosts['worker-2'].address} worker-2", "127.0.1.1 worker-2"))
    try:
        report, out = driver_report(multihost)
    finally:
        with open(hosts_file, "w") as restored:
            restored.write(original)
    assert report is not None, out[-4000:]
    assert report["driver_host"] == multihost.hosts["driver"].address
    assert Counter(host for host, _ in report["tasks"]) == {"worker-1": 2, "worker-2": 1}
    assert {probe for _, probe in report["tasks"]} == {"from-the-driver"}
    assert report["shared_hosts"] == ["worker-1", "worker-2"]
    ranks = report["ranks"]
    assert Counter(rank["host"] for rank in ranks) == {"worker-1": 2, "worker-2": 1}
    assert {(rank["world"], rank["sum"], rank["probe"], rank["gloo_ifname"]) for rank in ranks} == {
        (3, 6.0, "from-the-driver", "eth0")
    }
    assert "127.0.1.1" in {rank["resolves_to"] for rank in ranks if rank["host"] == "worker-2"}


def test_a_worker_without_the_shared_folder_is_named_before_anything_runs(multihost):
    target = multihost.hosts["worker-2"].pid
    unmount = ["nsenter", "--target", str(target), "--mount", "umount", SHARED_MOUNT]
    remount = ["nsenter", "--target", str(target), "--mount", "mount", "--bind", str(multihost.shared), SHARED_MOUNT]
    subprocess.run(unmount, check=True)
    try:
        report, out = driver_report(multihost)
    finally:
        subprocess.run(remount, check=True)
    assert report is None
    error = next(line for line in out.splitlines() if "SharedFolderError" in line)
    assert f"worker-2 does not share {WORK} with the driver (driver)" in error, error


def test_lessons_4_5_and_6_run_on_the_cluster_with_every_check_passing(multihost):
    log = f"{SHARED_MOUNT}/checks.jsonl"
    command = [sys.executable, "-m", "helpers.course", "run", "--params", "params/multihost.yaml", "--out",
               f"{SHARED_MOUNT}/build", "--keep-going", "--only", *(name[:2] for name in LESSONS)]  # fmt: skip
    process = multihost.run("driver", command, env={LOG_ENV: log}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    out, _ = process.communicate(timeout=2400)
    assert process.returncode == 0, out[-6000:]
    records = [json.loads(line) for line in (multihost.shared / "checks.jsonl").read_text().splitlines()]
    assert [record for record in records if record["status"] != PASSED] == []
    on_the_laptop = {
        exercise for name in LESSONS
        for exercise in structure(read_notebook(REPO_ROOT / "solutions" / f"{name}.ipynb")).exercise_ids
    }  # fmt: skip
    assert {record["exercise"] for record in records} == on_the_laptop
    # the runs went to the tracking server on its own host, not to a SQLite file on the shared folder
    assert not (multihost.shared / "course-work" / "mlflow").exists()
    assert not list(multihost.shared.glob("course-work/**/*.db"))


def test_a_cluster_is_torn_down_after_an_error_and_on_sigterm(tmp_path):
    reason = namespaces_available()
    if reason:
        pytest.skip(reason)
    script = (
        "import os, signal, sys\n"
        "from helpers.multihost import MultiHostCluster\n"
        "cluster = MultiHostCluster(worker_cores=(1,), shared=sys.argv[2])\n"
        "if sys.argv[1] == 'error':\n"
        "    with cluster:\n"
        "        print(cluster.id, flush=True)\n"
        "        raise RuntimeError('a test failed')\n"
        "cluster.start()\n"
        "print(cluster.id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
    )
    for how in ("error", "sigterm"):
        done = subprocess.run(
            [sys.executable, "-c", script, how, str(tmp_path)], capture_output=True, text=True, timeout=300,
            cwd=REPO_ROOT,
        )  # fmt: skip
        cluster_id = done.stdout.split()[0]
        assert done.returncode != 0
        assert leftovers(cluster_id) == [], how
