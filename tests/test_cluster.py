"""The local Spark standalone cluster: real master, worker, executor and Python worker processes, no mocks.

Each cluster session runs in a subprocess (a driver program of tests/scripts/ run with this interpreter), because a
process can hold only one SparkContext and the shared local ``spark`` fixture must stay usable. The programs print one
JSON report line; the tests assert on it. Every script uses its own work directory, and "our processes" are found by
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
from helpers.cluster import ClusterStartError, LocalCluster, executor_memory_mb, parse_memory_mb, slot_executor_size
from helpers.spark import QUICK_JVM_OPTIONS
from tests.processes import alive, driver_errors, processes_of, run_driver, start_driver

# Generous: cluster start takes 15-40 s on 2 busy cores.
START_TIMEOUT = 150
SCRIPT_TIMEOUT = 420


def start_script(script: str, work: Path, *args: object) -> subprocess.Popen:
    """Start a driver program of tests/scripts/ with the cluster tests' start timeout."""
    return start_driver(script, work, START_TIMEOUT, *args)


def run_script(script: str, work: Path) -> tuple[dict, str]:
    """Run a driver program of tests/scripts/ to its end; return its report and its output."""
    return run_driver(script, work, SCRIPT_TIMEOUT, START_TIMEOUT)


@pytest.fixture(scope="module")
def main_run(cluster_session) -> tuple[dict, str]:
    """The 2-worker cluster session (conftest): registration, a job, a killed and replaced worker (during the
    training of test_multi_node_faults.py), a guest connection, then exit."""
    report, stdout, _ = cluster_session
    return report, stdout


@pytest.fixture(scope="module")
def error_run(tmp_path_factory) -> dict:
    """A cluster left by an exception, then one abandoned until the interpreter exits."""
    report, _ = run_script("cluster_error_and_exit", tmp_path_factory.mktemp("cluster-error"))
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
def test_the_driver_and_the_executors_run_with_the_course_s_jvm_options(main_run):
    report, _ = main_run
    quick = QUICK_JVM_OPTIONS.split()
    assert set(quick) <= set(report["driver_jvm_options"]), report["driver_jvm_options"]
    for task in report["tasks"]:
        assert set(quick) <= set(task["jvm_options"].split()), task


@pytest.mark.slow
def test_executors_are_sized_to_fit_the_workers(main_run):
    report, _ = main_run
    fitted = {
        "spark.executor.cores": "1",
        "spark.executor.memory": "450m",  # three quarters of a 512 MB worker, at least Spark's 450 MB
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
    assert report["after_guest_running"] == report["pids_before_guest"]


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
    process = start_script("cluster_sigterm", tmp_path, SCRIPT_TIMEOUT)
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


def test_lesson_4s_jvms_fit_a_laptop():
    # Lesson 4's defaults (LocalCluster(workers=2, cores_per_worker=1)): every JVM's heap cap together stays under
    # 3 GB, which leaves an 8 GB laptop room for the kernel, the Python workers and 2 training processes
    # (benchmarks/results.md, part 4, measures the whole process tree).
    heaps = LocalCluster(workers=2, cores_per_worker=1).heaps_mb()
    assert set(heaps) == {"driver", "master", "worker-0", "worker-1", "executor-0", "executor-1"}
    assert sum(heaps.values()) <= 3 * 1024, heaps
    assert LocalCluster(master_url="spark://10.0.0.5:7077").heaps_mb() == {"driver": heaps["driver"]}


def test_connecting_where_the_masters_ui_cannot_be_read_sizes_executors_from_the_arguments_with_a_warning():
    guest = LocalCluster(
        workers=2,
        cores_per_worker=3,
        memory_per_worker="2g",
        master_url="spark://127.0.0.1:1",
        master_ui_url="http://127.0.0.1:1",
    )
    with pytest.warns(UserWarning, match=r"web UI http://127.0.0.1:1 cannot be read"):
        assert guest._executor_size() == (3, executor_memory_mb(2048), 0)


def test_on_a_running_cluster_every_task_slot_gets_an_executor_whatever_each_worker_offers():
    # The guide's reference set-up: 2 workers of 8 cores, 4 GPUs and 60 GB; one executor (one training process)
    # per GPU, each with 2 cores: 8 executors, not 2 with 6 GPUs idle.
    gpu = {"gpu": {"name": "gpu", "addresses": ["0", "1", "2", "3"]}}
    big = [{"cores": 8, "memory": 61440, "resources": gpu}] * 2
    assert slot_executor_size(big, by_gpu=True) == (2, executor_memory_mb(15360), 1)
    # On the CPU a 2-core worker beside a 1-core one holds 2 one-core executors, each fitting its memory share.
    mixed = [{"cores": 2, "memory": 1536, "resources": {}}, {"cores": 1, "memory": 1536, "resources": {}}]
    assert slot_executor_size(mixed, by_gpu=False) == (1, executor_memory_mb(768), 0)
    # A 2-core worker with 512 MB holds one executor at Spark's 450 MB minimum, not two that could not start.
    small = [{"cores": 2, "memory": 512, "resources": {}}]
    assert slot_executor_size(small, by_gpu=False) == (1, executor_memory_mb(512), 0)
