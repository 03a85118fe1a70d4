"""Ray on Spark (``helpers.ray_on_spark``) and Ray Train as a launcher (``helpers.ray_launcher``, ``train_with_ray``).

The fast tests pin the one-line input errors, and the wait for the head node's port, without starting Ray. The slow ones
judge the Ray part of the suite's one cluster session (the ``ray_session`` fixture: tests/scripts/ray_session.py in the
driver program tests/scripts/cluster_session.py, since a process holds one SparkContext and the shared local ``spark``
must stay usable): on its 2-worker ``LocalCluster``, lesson 1's digits, then one Ray cluster on its workers in which
Lightning DDP trains on 2 Ray Train workers, a job whose rank 1 raises fails, and a job whose rank 1's process is killed
fails without a retry; then the shutdown. With one retry, Ray Train replacing the killed process and resuming from its
checkpoint is lesson 6's ``ray-restart-says`` output, which nbval compares (tests/test_notebooks.py).
"""

from __future__ import annotations

import re
import socket
import threading

import pytest

from helpers import CourseInputError, ray_on_spark

CHANCE = 0.1  # ten classes


# -- fast: the one-line input errors, no Ray started ---------------------------------------------------------------


def test_counts_are_refused_before_anything_starts():
    from helpers.ray_on_spark import ray_cluster

    with pytest.raises(CourseInputError, match=r"^workers=0: pass a whole number of at least 1\.$"):
        with ray_cluster(workers=0):
            pass
    with pytest.raises(CourseInputError, match=r"^cpus_per_worker='1': pass a whole number"):
        with ray_cluster(cpus_per_worker="1"):
            pass


def test_a_local_session_has_no_executors_for_ray_nodes(spark):
    from helpers.ray_on_spark import ray_cluster

    with pytest.raises(CourseInputError, match=r"this session has none \(local mode\): start a LocalCluster"):
        with ray_cluster(spark):
            pass


def test_ray_train_needs_a_ray_cluster_and_a_worker_count():
    from helpers.ray_launcher import run_with_ray
    from helpers.worker import train_with_ray

    with pytest.raises(CourseInputError, match=r"^run_with_ray needs a running Ray cluster: start one with"):
        run_with_ray(print, 2)
    with pytest.raises(CourseInputError, match=r"^num_workers=0: pass a whole number"):
        run_with_ray(print, 0)
    with pytest.raises(CourseInputError, match=r"^num_workers=1\.5: pass a whole number"):
        train_with_ray(None, None, 10, num_workers=1.5)
    with pytest.raises(CourseInputError, match=r"^max_failures=-1: pass a whole number of at least 0\. Restarts"):
        run_with_ray(print, 2, max_failures=-1)


# -- slow: one Ray cluster on a 2-worker Spark cluster (the cluster session's Ray part, tests/scripts/ray_session.py)


def test_ray_on_spark_waits_for_its_head_node_s_port_until_it_opens_up_to_a_bound(monkeypatch):
    from ray.util.spark import cluster_init, utils

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    head = socket.socket()
    opened = threading.Timer(0.5, lambda: (head.bind(("127.0.0.1", port)), head.listen()))
    monkeypatch.setattr(ray_on_spark, "HEAD_START_BOUND_S", 30.0)
    with ray_on_spark._head_start_awaited():
        assert cluster_init._RAY_HEAD_STARTUP_TIMEOUT == 0  # no fixed sleep before Ray on Spark's look
        opened.start()
        assert cluster_init.is_port_in_use("127.0.0.1", port)  # the look waits for the port to open
        head.close()
        monkeypatch.setattr(ray_on_spark, "HEAD_START_BOUND_S", 0.3)
        assert not cluster_init.is_port_in_use("127.0.0.1", port)  # and gives up after the bound
    assert (cluster_init._RAY_HEAD_STARTUP_TIMEOUT, cluster_init.is_port_in_use) == (20, utils.is_port_in_use)


@pytest.mark.slow
def test_ray_starts_one_worker_node_per_spark_worker_all_on_loopback(ray_session):
    nodes = ray_session["nodes"]
    assert sorted(node["head"] for node in nodes) == [False, False, True]
    assert {node["address"] for node in nodes} == {"127.0.0.1"}
    assert [node["cpus"] for node in nodes if not node["head"]] == [1, 1]  # the head takes no task


@pytest.mark.slow
def test_no_ray_process_listens_beyond_loopback(ray_session):
    for moment in ("listeners", "listeners_after_training"):
        listeners = ray_session[moment]
        assert len({entry["pid"] for entry in listeners}) >= 4, listeners  # GCS, 2 raylets, the driver, agents...
        assert [entry for entry in listeners if not entry["loopback"]] == [], moment
    assert ray_session["job_api_ports"] == []  # no dashboard, no job API (ShadowRay), not even on loopback


@pytest.mark.slow
def test_a_ray_cluster_that_does_not_fit_the_spark_cluster_is_refused(ray_session):
    assert ray_session["too_many_nodes"].startswith("CourseInputError: ray_cluster(workers=3, cpus_per_worker=1)")
    assert "executors of 1 cores hold 2 Ray worker nodes" in ray_session["too_many_nodes"]
    assert "use cpus_per_worker=1 or fewer" in ray_session["too_wide_nodes"]
    assert ray_session["too_many_workers"] == (
        "CourseInputError: 3 Ray Train workers of 1 CPU need 3, but the Ray cluster has 2: use num_workers=2 or "
        "fewer, or more Ray worker nodes."
    )


@pytest.mark.slow
def test_ray_train_trains_on_two_workers_and_records_one_mlflow_run(ray_session):
    result, params = ray_session["result"], ray_session["params"]
    assert result["val_acc"] > 3 * CHANCE and result["best_val_loss"] < 2.0  # chance: 0.1 and ln(10) = 2.30
    assert result["epochs_run"] == 2
    assert (params["launcher"], params["world_size"], params["strategy"]) == ("ray", "2", "RayDDPStrategy")
    assert ray_session["mlflow_runs"] == ["FINISHED"]  # rank 0 only


@pytest.mark.slow
def test_a_failing_rank_gives_a_ray_job_error_naming_it_and_no_running_mlflow_run(ray_session):
    failure = ray_session["failure"]
    assert failure["type"] == "RayJobError" and failure["rank"] == 1
    assert failure["message"].startswith("Ray Train training with 2 workers failed after ")
    assert failure["message"].endswith("rank 1 raised ValueError: rank 1 broke on purpose.")
    assert failure["mlflow_runs"] == ["FAILED"]  # rank 0's, killed in its barrier, ended by the driver


@pytest.mark.slow
def test_a_killed_worker_ends_the_job_without_a_retry_naming_its_rank_and_pid(ray_session):
    failure = ray_session["lost_worker_no_retry"]
    assert failure["type"] == "RayJobError" and failure["rank"] == 1
    found = re.fullmatch(
        r"Ray Train training with 2 workers failed after \d+ s: rank 1 \(pid (\d+)\) died without a Python error "
        r"\(its process was killed, or ran out of memory\)\.",
        failure["message"],
    )
    assert found, failure["message"]  # not rank 0's echo ("Connection closed by peer"), nor Ray's many lines


@pytest.mark.slow
def test_shutdown_leaves_no_ray_process_and_spark_usable(ray_session):
    assert ray_session["ray_processes"] >= 6  # what the check below looked for
    assert ray_session["left"] == [] and ray_session["left_by_scan"] == []
    assert ray_session["temp_root_left"] is False
    assert ray_session["spark_rows_after"] == 100  # the executors' task slots are free again


@pytest.mark.slow
def test_ray_s_start_and_stop_say_nothing_a_learner_cannot_act_on(cluster_session):
    """Ray on Spark's own ``ray.init`` sets the ``ray`` logger to INFO and logs the connection (lesson 6's
    ``ray-start`` cell printed both lines); after the shutdown its job server warns, from its threads, that each
    worker node's Spark job ended (the ``ray-stop`` cell printed one warning per node): the driver says none of
    them, on either stream."""
    _, stdout, work = cluster_session
    said = stdout + (work / "driver.err").read_text()
    assert "Connecting to existing Ray cluster" not in said and "Connected to Ray cluster" not in said
    assert "hosting Ray worker node exit" not in said
