"""The local Spark standalone cluster: real master, worker, executor and Python worker processes, no mocks.

Each cluster session runs in a subprocess (a small driver script run with this interpreter), because a process can
hold only one SparkContext and the shared local ``spark`` fixture must stay usable. The scripts print one JSON
report line; the tests assert on it. Every script uses its own work directory, and "our processes" are found by
that directory in their environment, so Spark runs of other test sessions on the machine do not count.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from helpers import CourseInputError
from helpers.cluster import ClusterStartError, LocalCluster, executor_memory_mb, parse_memory_mb
from tests.processes import alive, driver_errors, processes_of, run_driver, start_driver

# Generous: cluster start takes 15-40 s on 2 busy cores.
START_TIMEOUT = 150
SCRIPT_TIMEOUT = 420

# The driver scripts run with the repository on PYTHONPATH and share the test's process helpers.
PRELUDE = (
    "import json, os, sys, time\n"
    "from tests.processes import alive, processes_of\n"
    "WORK = os.environ['COURSE_WORK_DIR']\n"
)

MAIN_SCRIPT = (
    PRELUDE
    + '''
from helpers.cluster import LocalCluster, alive_workers, master_state
from helpers.spark import get_spark

SIZING = ("spark.executor.cores", "spark.executor.memory", "spark.task.cpus", "spark.cores.max")

def sizing(spark):
    conf = spark.sparkContext.getConf()
    return {key: conf.get(key, None) for key in SIZING}

def where_am_i(rows):
    """Runs in a Spark Python worker: the executor JVM above it, that executor's parent, this interpreter."""
    import sys
    import psutil
    executor = next(
        (p for p in psutil.Process().parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline())), None
    )
    return [{"executor": executor and executor.pid, "parent": executor and executor.ppid(),
             "python": sys.executable, "rows": len(list(rows))}]

report = {"driver_python": sys.executable}
with LocalCluster(workers=2, start_timeout=START_TIMEOUT) as cluster:
    report.update(master_url=cluster.master_url, ui_url=cluster.ui_url, pids=cluster.pids,
                  worker_pids=cluster.worker_pids())
    state = master_state(cluster.ui_url)
    report["alive_workers"] = alive_workers(state)
    report["aliveworkers_field"] = state.get("aliveworkers")
    report["running"] = processes_of(WORK)
    report["sizing"] = sizing(cluster.spark)
    report["tasks"] = cluster.spark.sparkContext.parallelize(range(80), 8).mapPartitions(where_am_i).collect()

    with LocalCluster(workers=2, master_url=cluster.master_url, start_timeout=START_TIMEOUT) as guest:
        report["guest_pids"] = guest.pids
        report["guest_master"] = guest.spark.sparkContext.master
        report["guest_sum"] = guest.spark.sparkContext.parallelize(range(100), 4).sum()
        report["guest_sizing"] = sizing(guest.spark)
    report["after_guest_alive_workers"] = alive_workers(master_state(cluster.ui_url))
    report["after_guest_running"] = alive(cluster.pids)

    killed = cluster.kill_worker(1)
    start = time.monotonic()
    while cluster.alive_workers() != 1 and time.monotonic() - start < 60:
        time.sleep(0.2)
    report["seconds_to_notice"] = time.monotonic() - start
    report["alive_after_kill"] = cluster.alive_workers()
    report["killed_pid"] = killed
    report["killed_running"] = alive([killed])
report["left_after_exit"] = processes_of(WORK)
report["pids_after_exit"] = alive(report["pids"])
local = get_spark(cores=1)
report["local_after_exit"] = [local.sparkContext.master, sizing(local)]
local.stop()
print("REPORT " + json.dumps(report))
'''
)

# The exit hook below is registered before helpers.cluster is imported, so it runs after the cluster's own.
ERROR_AND_EXIT_SCRIPT = (
    PRELUDE
    + """
import atexit

report = {}

def check_at_exit():
    report["exit_left"] = processes_of(WORK)
    report["exit_pids_running"] = alive(report["exit_pids"])
    print("REPORT " + json.dumps(report), flush=True)

atexit.register(check_at_exit)

from helpers.cluster import LocalCluster

cluster = LocalCluster(workers=1, start_timeout=START_TIMEOUT)
try:
    with cluster:
        report["error_pids"] = cluster.pids
        report["error_running"] = processes_of(WORK)
        raise RuntimeError("boom inside the with block")
except RuntimeError as error:
    report["error"] = str(error)
report["error_left"] = processes_of(WORK)
report["error_pids_running"] = alive(report["error_pids"])

abandoned = LocalCluster(workers=1, start_timeout=START_TIMEOUT).start()
report["exit_pids"] = abandoned.pids
report["exit_running"] = processes_of(WORK)
"""
)


SIGTERM_SCRIPT = (
    PRELUDE
    + """
from helpers.cluster import LocalCluster

cluster = LocalCluster(workers=1, start_timeout=START_TIMEOUT).start()
print("PIDS " + json.dumps(cluster.pids), flush=True)
time.sleep(SCRIPT_TIMEOUT)
"""
)


def start_script(source: str, work: Path) -> subprocess.Popen:
    """Start a driver script with the cluster tests' time limits defined in it."""
    return start_driver(source, work, START_TIMEOUT=START_TIMEOUT, SCRIPT_TIMEOUT=SCRIPT_TIMEOUT)


def run_script(source: str, work: Path) -> tuple[dict, str]:
    """Run a driver script to its end; return its report and its output."""
    return run_driver(source, work, SCRIPT_TIMEOUT, START_TIMEOUT=START_TIMEOUT, SCRIPT_TIMEOUT=SCRIPT_TIMEOUT)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> tuple[dict, str]:
    """One 2-worker cluster: registration, a job, a guest connection, a killed worker, then exit."""
    return run_script(MAIN_SCRIPT, tmp_path_factory.mktemp("cluster-main"))


@pytest.fixture(scope="module")
def error_run(tmp_path_factory) -> dict:
    """A cluster left by an exception, then one abandoned until the interpreter exits."""
    report, _ = run_script(ERROR_AND_EXIT_SCRIPT, tmp_path_factory.mktemp("cluster-error"))
    return report


@pytest.mark.slow
def test_both_workers_register_and_the_ui_is_printed(main_run):
    report, stdout = main_run
    assert report["alive_workers"] == 2
    assert report["aliveworkers_field"] == 2
    assert report["master_url"].startswith("spark://127.0.0.1:")
    assert f"web UI {report['ui_url']}" in stdout
    assert len(report["pids"]) == 3 and report["pids"][1:] == report["worker_pids"]
    # The master, the 2 workers and their 2 executors (at least) were running, all found by our work directory.
    assert set(report["pids"]) <= set(report["running"])
    assert len(report["running"]) >= 5


@pytest.mark.slow
def test_tasks_run_in_one_executor_jvm_per_worker_with_this_interpreter(main_run):
    report, _ = main_run
    tasks = report["tasks"]
    assert sum(task["rows"] for task in tasks) == 80
    executors = {task["executor"] for task in tasks}
    assert None not in executors
    assert len(executors) == 2
    # Each executor JVM is a child of a different worker JVM that the cluster started.
    assert {task["parent"] for task in tasks} == set(report["worker_pids"])
    assert {task["python"] for task in tasks} == {report["driver_python"]}


@pytest.mark.slow
def test_executors_are_sized_to_fit_the_workers(main_run):
    report, _ = main_run
    fitted = {
        "spark.executor.cores": "1",
        "spark.executor.memory": "768m",
        "spark.task.cpus": "1",
        "spark.cores.max": "2",
    }
    assert report["sizing"] == fitted
    # Also when the py4j gateway was already running (the guest connects from the same driver process) ...
    assert report["guest_sizing"] == fitted
    # ... and a local session started afterwards in that process does not inherit the sizing.
    assert report["local_after_exit"] == ["local[1]", dict.fromkeys(fitted)]


@pytest.mark.slow
def test_connecting_to_a_master_starts_nothing_and_stops_nothing(main_run):
    report, _ = main_run
    assert report["guest_pids"] == []
    assert report["guest_master"] == report["master_url"]
    assert report["guest_sum"] == sum(range(100))
    assert report["after_guest_alive_workers"] == 2
    assert report["after_guest_running"] == report["pids"]


@pytest.mark.slow
def test_killing_a_worker_is_seen_by_the_master(main_run):
    report, _ = main_run
    assert report["killed_pid"] == report["worker_pids"][1]
    assert report["killed_running"] == []
    assert report["alive_after_kill"] == 1
    assert report["seconds_to_notice"] < 60


@pytest.mark.slow
def test_nothing_is_left_after_the_with_block(main_run):
    report, _ = main_run
    assert report["pids_after_exit"] == []
    assert report["left_after_exit"] == []


@pytest.mark.slow
def test_an_error_in_the_with_block_still_stops_everything(error_run):
    assert error_run["error"] == "boom inside the with block"
    assert len(error_run["error_pids"]) == 2
    assert set(error_run["error_pids"]) <= set(error_run["error_running"])
    assert error_run["error_pids_running"] == []
    assert error_run["error_left"] == []


@pytest.mark.slow
def test_interpreter_exit_stops_a_cluster_never_stopped(error_run):
    assert len(error_run["exit_pids"]) == 2
    assert set(error_run["exit_pids"]) <= set(error_run["exit_running"])
    assert error_run["exit_pids_running"] == []
    assert error_run["exit_left"] == []


@pytest.mark.slow
def test_sigterm_to_the_driver_stops_the_cluster_before_it_dies(tmp_path):
    process = start_script(SIGTERM_SCRIPT, tmp_path)
    try:
        pids_line = next((line for line in process.stdout if line.startswith("PIDS ")), None)
        assert pids_line, f"the cluster did not start: {driver_errors(tmp_path)}"
        pids = json.loads(pids_line[len("PIDS ") :])
        assert len(alive(pids)) == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == -signal.SIGTERM
    finally:
        process.kill()
    # Checked at once: the handler stopped them before the driver died of the signal.
    assert alive(pids) == []
    assert processes_of(str(tmp_path)) == []


@pytest.mark.slow
def test_a_start_timeout_names_the_log_and_kills_what_started(tmp_path):
    cluster = LocalCluster(workers=1, start_timeout=0.5, work=tmp_path)
    with pytest.raises(ClusterStartError, match=r"master\.log"):
        cluster.start()
    assert len(cluster.pids) == 1
    assert not any(psutil.pid_exists(pid) for pid in cluster.pids)
    assert cluster.spark is None
    assert (cluster.log_dir / "master.log").exists()
    assert str(cluster.log_dir).startswith(str(tmp_path / "cluster"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 0},
        {"workers": 1.5},
        {"workers": True},
        {"cores_per_worker": 0},
        {"memory_per_worker": "lots"},
        {"memory_per_worker": "1024"},
        {"memory_per_worker": 1024},
        {"memory_per_worker": "256m"},
        {"master_url": "local[2]"},
    ],
)
def test_bad_input_is_refused(kwargs):
    with pytest.raises(CourseInputError):
        LocalCluster(**kwargs)


def test_kill_worker_needs_a_started_worker():
    with pytest.raises(CourseInputError, match="started 0 workers"):
        LocalCluster().kill_worker(0)


def test_memory_sizes():
    assert parse_memory_mb("1g") == 1024
    assert parse_memory_mb("512M") == 512
    assert parse_memory_mb("2048mb") == 2048
    # Executors fit their worker and are never below Spark's 450 MB minimum.
    assert executor_memory_mb(512) == 450
    assert executor_memory_mb(1024) == 768 < 1024
