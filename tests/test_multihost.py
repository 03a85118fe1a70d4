"""The course on a cluster of separate hosts: a Spark master, two workers (2 cores and 1), the driver and an MLflow
server, each with its own network namespace, hostname, /tmp and processes (helpers.multihost, the session fixture
``multihost``). Skipped, with the reason, where namespaces cannot be made (not root); CI runs as root.

What a cluster of several hosts needs that one machine's loopback hides: the driver advertising an address the
workers reach, executors following each worker's slots, the shared folder checked from every host, the parameter
file's environment reaching every training process, one interface choice for every launcher (a host whose name
resolves to 127.0.1.1 included), and lessons 4, 5 (ON_SPARK) and 6 running end to end where Horovod is not installed,
with every check passing that does not need Horovod, behind a firewall that opens only the ports the instructor guide
lists (helpers.ports); behind the same firewall the preflight runs Horovod on Spark across the workers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata

import pytest

from helpers.course.build import read_notebook, structure
from helpers.course.checks import ERROR, LOG_ENV, PASSED
from helpers.course.run import kernel_env, load_params
from helpers.devices import horovod_installed
from helpers.multihost import EPHEMERAL_PORTS, SHARED_MOUNT, MultiHostCluster, leftovers, namespaces_available
from helpers.ports import needed_ports
from helpers.workdir import REPO_ROOT
from tests.processes import no_horovod_env
from tests.test_without_horovod import outputs

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

WORK = f"{SHARED_MOUNT}/work"
PROBE_ENV = {"COURSE_WORK_DIR": WORK, "COURSE_PROBE": "from-the-driver", "COURSE_WORKER_ENV": "COURSE_PROBE"}
PARAMS = load_params(REPO_ROOT / "params" / "multihost.yaml")
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
    # worker-2 names itself as stock Debian does: left to itself, torch's Gloo would bind to 127.0.1.1 there
    with multihost.name_resolving_to_loopback("worker-2"):
        report, out = driver_report(multihost)
    assert report is not None, told(out)
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
    if horovod_installed():
        assert (report["horovod"]["size"], report["horovod"]["sum"]) == (3, 6.0)


def test_a_worker_without_the_shared_folder_is_named_before_anything_runs(multihost):
    with multihost.without_shared_folder("worker-2"):
        report, out = driver_report(multihost)
    assert report is None
    error = next(line for line in out.splitlines() if line.startswith("helpers.shared_storage.SharedFolderError: "))
    assert f"worker-2 does not share {WORK} with the driver (driver)" in error, error


def test_lessons_4_5_and_6_pass_every_check_behind_a_firewall_open_only_to_the_listed_ports(multihost):
    # the ports docs/instructor.md lists (helpers.ports), and nothing else, open between the hosts, where Horovod is
    # not installed (Databricks Runtime 16.0 ML and later): lesson 4 trains with TorchDistributor alone, and lesson
    # 5's LAUNCHER="auto" picks it. Horovod across these hosts behind the same firewall: the healthy preflight, the
    # driver's probe and the host faults below.
    log = f"{SHARED_MOUNT}/checks.jsonl"
    command = [sys.executable, "-m", "helpers.course", "run", "--params", "params/multihost.yaml", "--out",
               f"{SHARED_MOUNT}/build", "--keep-going", "--only", "04", "05", "06"]  # fmt: skip
    with listed_ports_only(multihost, ray_nodes=2) as firewall:
        process = multihost.run("driver", command, env={LOG_ENV: log, **no_horovod_env(str(REPO_ROOT))},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        out, _ = process.communicate(timeout=1800)
        assert process.returncode == 0, f"{told(out)}\nports the firewall dropped: {firewall.dropped()}"
    records = [json.loads(line) for line in (multihost.shared / "checks.jsonl").read_text().splitlines()]
    # 4.1 is Horovod on Spark: where Horovod is missing its check says it could not be checked here (not the
    # learner's failure), in one line that says what to do
    not_passed = [record for record in records if record["status"] != PASSED]
    assert [{key: record[key] for key in NO_HOROVOD_41} for record in not_passed] == [NO_HOROVOD_41]
    on_the_laptop = {
        exercise for name in LESSONS
        for exercise in structure(read_notebook(REPO_ROOT / "solutions" / f"{name}.ipynb")).exercise_ids
    }  # fmt: skip
    assert {record["exercise"] for record in records} == on_the_laptop
    lesson_4 = outputs(multihost.shared / "build" / f"{LESSONS[0]}.ipynb")
    assert "this lesson trains with TorchDistributor only" in lesson_4
    # the runs went to the tracking server on its own host, not to a SQLite file on the shared folder
    assert not (multihost.shared / "course-work" / "mlflow").exists()
    assert not list(multihost.shared.glob("course-work/**/*.db"))
    launchers = multihost.check_output("driver", [sys.executable, "-c", LESSON_5_LAUNCHERS]).split()
    assert len(launchers) >= 2 and set(launchers) == {"torch_distributor"}, launchers  # every run of its sweep


NO_HOROVOD_41 = {
    "exercise": "4.1",
    "status": ERROR,
    "message": "This exercise (Horovod on Spark) needs Horovod, which is not installed here (Databricks Runtime 16.0 "
    "ML and later ship none; 15.4 LTS ML is the last): run `make setup` on your machine or use 15.4 LTS ML, or go on "
    "with lesson 4 and LAUNCHER='torch_distributor'.",
}


@contextmanager
def listed_ports_only(cluster: MultiHostCluster, ray_nodes: int = 0) -> Iterator:
    """A firewall between the hosts open only to the ports helpers.ports lists for params/multihost.yaml (Ray's
    ranges for ``ray_nodes`` worker nodes too); checked to stand before it is used."""
    allowed = needed_ports(PARAMS.env, cluster.master_url, cluster.mlflow_uri, EPHEMERAL_PORTS, ray_nodes)
    with cluster.firewall([(ports.first, ports.last) for ports in allowed]) as firewall:
        assert not reachable(cluster, "worker-1", "worker-2", UNLISTED_PORT)
        yield firewall


ERROR_LINE = re.compile(r"Error|Exception|Traceback|Killed|Signal \d+|exited with", re.IGNORECASE)


def told(out: str) -> str:
    """What a command printed, for a failed assertion: the lines naming an error, wherever they are (a launcher's
    cause is often far above the table it ends with), then the last 3000 characters."""
    errors = [line[:300] for line in out.splitlines() if ERROR_LINE.search(line)]
    return "\n".join(["lines naming an error:", *errors[:60], "the end:", out[-3000:]])


UNLISTED_PORT = 6000  # in no range of helpers.ports.needed_ports
# connect from one host to another's port, where a listener waits: prints whether the connection was made
REACH = """
import socket, sys, threading
listener = socket.create_server(("", int(sys.argv[2]))) if sys.argv[1] == "listen" else None
if listener:
    print("listening", flush=True)
    listener.settimeout(30)
    listener.accept()
else:
    try:
        socket.create_connection((sys.argv[3], int(sys.argv[2])), timeout=3)
        print("reached")
    except OSError:
        print("blocked")
"""


def reachable(cluster: MultiHostCluster, source: str, target: str, port: int) -> bool:
    """Whether ``source`` can open a TCP connection to ``port`` of ``target``, where a listener waits for it."""
    listener = cluster.run(target, [sys.executable, "-c", REACH, "listen", str(port)], stdout=subprocess.PIPE,
                           text=True)  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        out = cluster.check_output(source, [sys.executable, "-c", REACH, "connect", str(port), target])
        return out.strip() == "reached"
    finally:
        listener.kill()
        listener.wait()


# the launcher of every run of lesson 5's sweep, as MLflow on the tracking server recorded it
LESSON_5_LAUNCHERS = (
    "from helpers.analysis import runs_table; "
    f"print(*runs_table('lesson-5-scaling', {PARAMS.common['MLFLOW_TRACKING_URI']!r})['launcher'])"
)


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


def preflight(cluster: MultiHostCluster, *options: str, params: str = "params/multihost.yaml") -> tuple[int, dict, str]:
    """``python -m helpers.course preflight`` on the driver host with ``options``: its exit status, its rows by (item,
    host) as (result, found, what to do), and its output."""
    command = [sys.executable, "-m", "helpers.course", "preflight", "--params", params, *options]
    process = cluster.run("driver", command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = process.communicate(timeout=600)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("item "))
    rows = {}
    for line in lines[header + 1 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 4 and cells[2] in ("ok", "FAIL", "skip"):
            rows[(cells[0], cells[1])] = (cells[2], cells[3], cells[4] if len(cells) > 4 else "")
    return process.returncode, rows, out


# a healthy launcher row takes about 20 s alone; in ci29, beside another test's Spark and Ray processes on the same 2
# cores, the TorchDistributor row had no result within the default 90 s while the Horovod row passed
HEALTHY_BOUND_S = 240


def test_the_preflight_passes_every_row_on_a_healthy_cluster_behind_a_firewall_open_only_to_the_listed_ports(
    multihost,
):
    # its launcher rows run Horovod on Spark (HorovodRunner, as exercise 4.1 does) and TorchDistributor across the
    # workers: COURSE_HOROVOD_PORTS and COURSE_SPARK_PORTS are all they need
    with listed_ports_only(multihost) as firewall:
        status, rows, out = preflight(multihost, "--bound", str(HEALTHY_BOUND_S))
        out += f"\nports the firewall dropped: {firewall.dropped()}"
    assert status == 0, told(out)
    assert {result for result, _, _ in rows.values()} == {"ok"}, told(out)
    for item in ("versions", "java", "host name", "mlflow", "shared folder"):
        assert {host for (name, host) in rows if name == item} == {"worker-1", "worker-2"}, item
    assert "3 processes on worker-1, worker-2, interface eth0" in rows[("torch_distributor", "all")][1]
    if horovod_installed():
        assert rows[("horovod", "all")][0] == "ok"


def test_each_fault_of_a_host_fails_exactly_its_own_preflight_row(multihost):
    # four faults at once, each on its own host or service: each must show in its row, and nowhere else
    text = (REPO_ROOT / "params" / "multihost.yaml").read_text()
    unnamed = multihost.shared / "no-interface.yaml"  # the route chooses the interface; names are not trusted
    unnamed.write_text(re.sub(r"(?m)^\s*COURSE_NETWORK_INTERFACE:.*\n(\s+#.*\n)*", "", text))
    with (
        multihost.without_shared_folder("worker-2"),
        multihost.package_version("worker-1", "petastorm", "0.12.0"),
        multihost.name_resolving_to_loopback("worker-2"),
        multihost.mlflow_down(),
    ):
        status, rows, out = preflight(multihost, params=f"{SHARED_MOUNT}/{unnamed.name}")
    failed = {key: row for key, row in rows.items() if row[0] == "FAIL"}
    assert status == 1, told(out)
    assert set(failed) == {("shared folder", "worker-2"), ("versions", "worker-1"), ("host name", "worker-2"),
                           ("mlflow", "driver")}, told(out)  # fmt: skip
    assert f"petastorm 0.12.0 (driver {metadata.version('petastorm')})" in failed[("versions", "worker-1")][1]
    assert "127.0.1.1" in failed[("host name", "worker-2")][1]
    assert all(fix for _, _, fix in failed.values()), failed
    assert rows[("launchers", "all")][0] == "skip"


FIREWALL_BOUND_S = 30  # a healthy launcher row takes about 20 s here; blocked, it would wait the default 90 s


def test_the_preflight_fails_the_launcher_rows_when_a_firewall_blocks_the_ports_between_workers(multihost):
    # only Spark's pinned ports (COURSE_SPARK_PORTS in params/multihost.yaml) are open between workers
    spark = next(ports for ports in needed_ports(PARAMS.env, multihost.master_url, multihost.mlflow_uri,
                                                 EPHEMERAL_PORTS) if ports.who.startswith("Spark driver"))  # fmt: skip
    # each launcher row fails after --bound seconds
    with multihost.firewall([(spark.first, spark.last)], hosts=["worker-1", "worker-2"]):
        status, rows, out = preflight(multihost, "--bound", str(FIREWALL_BOUND_S))
    failed = {key: row for key, row in rows.items() if row[0] == "FAIL"}
    expected = {("torch_distributor", "all")} | ({("horovod", "all")} if horovod_installed() else set())
    assert status == 1 and set(failed) == expected, told(out)
    assert all("open the ports between the workers" in fix for _, _, fix in failed.values()), failed


# each launcher once and each fault once: both faults reach a launcher the same way (Spark's heartbeat expiry, seen
# by helpers.lost_hosts.ExecutorLoss), and each launcher's way of ending its job does not depend on the fault
HOST_FAULTS = ("torch_distributor:link_down", "horovod:frozen")
HEARTBEAT_S = 30  # params/multihost.yaml: COURSE_HEARTBEAT_TIMEOUT_S (the stall bound there is 180 s)
NOTICE_SLACK_S = 40  # after the bound: the driver's check every tenth of it, cancelling the job, Horovod's grace
# the launchers and the training processes (TorchDistributor writes its ranks' script as train.py)
TRAINING_MARKERS = (
    "torch.distributed.run",
    "torch_run_process_wrapper",
    "train.py",
    "gloo_exec_fn",
    "horovod.spark.task",
)


@pytest.fixture(scope="module")
def host_faults(multihost) -> list[dict]:
    """tests/scripts/host_faults.py on the driver host; worker-2 taken away as each scenario asks, and what was left
    running on worker-1 once the job ended and the rerun was done."""
    launchers = HOST_FAULTS if horovod_installed() else [s for s in HOST_FAULTS if s.startswith("torch")]
    signals = multihost.shared / "host-fault-signals"
    signals.mkdir(exist_ok=True)
    env = {**kernel_env(PARAMS), "COURSE_WORK_DIR": WORK}
    command = [sys.executable, "-m", "tests.scripts.host_faults", multihost.master_url,
               f"{SHARED_MOUNT}/{signals.name}", *launchers]  # fmt: skip
    process = multihost.run("driver", command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    left_on_worker_1, reports = {}, []
    for scenario in launchers:
        name = scenario.replace(":", "-")
        report = signals / f"{name}.json"
        while not (signals / f"{name}.ready").exists() and not report.exists() and process.poll() is None:
            time.sleep(0.2)
        if (signals / f"{name}.ready").exists():
            with (multihost.link_down if name.endswith("link_down") else multihost.frozen)("worker-2"):
                (signals / f"{name}.fault").write_text(repr(time.time()))
                while not (signals / f"{name}.done").exists() and process.poll() is None:
                    time.sleep(0.2)
                left_on_worker_1[name] = [line for line in multihost.processes("worker-1")
                                          if any(marker in line for marker in TRAINING_MARKERS)]  # fmt: skip
            (signals / f"{name}.back").write_text("back")
        while not report.exists() and process.poll() is None:
            time.sleep(0.2)
        if not report.exists():
            break
        reports.append({**json.loads(report.read_text()), "left_on_worker_1": left_on_worker_1.get(name)})
    out, _ = process.communicate(timeout=600)
    assert len(reports) == len(launchers), told(out)
    return [{**report, "driver_output": told(out)} for report in reports]


def ended_early(report: dict) -> str:
    """Why a scenario ended before its fault was made (or crashed), with what the driver printed; "" if it did not."""
    why = report.get("ended_early") or report.get("crashed")
    if not why:
        return ""
    return (
        f"{report['scenario']} (executors at its start: {report.get('executors_at_start')}): {why}\n"
        + report["driver_output"]
    )


def test_a_lost_host_ends_the_job_within_the_heartbeat_bound_naming_the_host_and_the_checkpoint(host_faults):
    for report in host_faults:
        assert not ended_early(report), ended_early(report)
        assert report.get("first_run") == "failed", report
        assert report["seconds_to_fail"] < HEARTBEAT_S + NOTICE_SLACK_S, report
        assert "worker-2" in report["message"] and report["last_checkpoint"] in report["message"], report
        assert report["message"].count("\n") == 0 or report["error_type"] == "HorovodWorkerError", report


def test_the_rerun_on_the_hosts_left_continues_from_the_checkpoint_and_nothing_is_left_running(host_faults):
    for report in host_faults:
        assert not ended_early(report), ended_early(report)
        saved = report["saved_epoch"]
        assert report["resumed_epochs"] == [saved + 1, saved + 2], report
        assert report["left_on_worker_1"] == [], report
