"""The Ray part of the suite's one 2-worker cluster session (tests/scripts/cluster_session.py), judged by
tests/test_ray_on_spark.py and the 6.2 answers of tests/test_answers_lesson6.py: lesson 1's digits prepared on the
cluster, Ray clusters that do not fit refused, then one Ray cluster on its workers: its nodes and ports, Lightning DDP
on 2 Ray Train workers, a job whose rank 1 raises, a job whose rank 1's process is killed (without a retry, then with
one), every 6.2 answer through its check; then the shutdown.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

import cloudpickle
import psutil
from pyspark import cloudpickle as spark_cloudpickle

import tests.test_answers_lesson6 as lesson6_answers
from helpers.course.checks import _run
from helpers.processes import tree_memory

# Ray's workers cannot import the test module: its 6.2 answers travel by value (sealed by helpers.jobs.SealedCall
# with pyspark's cloudpickle, inside what Ray pickles with its own)
for _pickler in (cloudpickle, spark_cloudpickle):
    _pickler.register_pickle_by_value(lesson6_answers)


class _PeakMemory(threading.Thread):
    """Samples the resident memory of this process and all its descendants (Spark's JVMs, Ray's nodes)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_mb, self.done = 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.peak_mb = max(self.peak_mb, tree_memory(os.getpid())[0] // 2**20)


def _error(call) -> str:
    """``call()``'s exception as ``"Type: message"`` ("" if it raised none)."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _enter(context) -> None:
    """Enter and leave a context manager."""
    with context:
        pass


def _get(port: int, path: str) -> tuple[int | None, bytes]:
    """``GET http://127.0.0.1:port/path``: the status and body, or ``(None, b"")`` where no HTTP server answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except Exception:  # a gRPC port: not HTTP
        return None, b""


def _serves_ray_jobs(port: int) -> bool:
    """Whether ``127.0.0.1:port`` serves a Ray job API: the dashboard's (``/api/version`` answers Ray's version) or a
    dashboard agent's job agent (its POST route ``/api/job_agent/jobs/`` exists: a GET is refused with 405, not 404).
    Ray's metrics ports answer every path with their metrics, and Ray on Spark's own server refuses every GET."""
    status, body = _get(port, "/api/version")
    return (status == 200 and b'"ray_version"' in body) or _get(port, "/api/job_agent/jobs/")[0] == 405


def _rank_one_raises(uri: str) -> None:
    """Rank 0 opens an MLflow run and waits in a barrier that rank 1, raising, never joins."""
    import mlflow
    import torch.distributed as dist

    from helpers.jobs import record_mlflow_run

    if int(os.environ["RANK"]) == 0:
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("ray-failure")
        record_mlflow_run(mlflow.start_run().info.run_id, uri)
    dist.barrier()
    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.barrier()


def _runs(uri: str, experiment: str) -> list:
    """The MLflow runs of ``experiment``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def _alive(processes: list[psutil.Process]) -> list[int]:
    """The pids of ``processes`` still running (zombies, which only wait to be reaped, do not count)."""
    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return running


def _train_and_fail(ray_on_spark, data, report: dict, timings: dict) -> None:
    """Inside the Ray cluster: its nodes and ports, a training, a failing job, its processes."""
    from helpers.ray_launcher import RayJobError, run_with_ray
    from helpers.tracking import tracking_uri
    from helpers.worker import TrainSettings, train_with_ray

    _, train_converter, val_converter, class_names = data
    report["nodes"] = [
        {"address": n["NodeManagerAddress"], "head": n["head"], "cpus": n["Resources"].get("CPU", 0)}
        for n in ray_on_spark.nodes()
    ]
    listeners = ray_on_spark.listeners()
    report["listeners"] = [{**asdict(entry), "loopback": entry.loopback} for entry in listeners]
    report["job_api_ports"] = [entry.port for entry in listeners if _serves_ray_jobs(entry.port)]
    report["too_many_workers"] = _error(lambda: run_with_ray(print, 3))
    settings = TrainSettings(batch_size=32, image_size=16, learning_rate=0.02, max_epochs=2, mlflow_experiment="ray")
    started = time.monotonic()
    result = train_with_ray(train_converter, val_converter, len(class_names), settings, num_workers=2)
    timings["training"] = round(time.monotonic() - started, 1)
    uri = tracking_uri()
    report["result"] = {k: getattr(result, k) for k in ("val_acc", "best_val_loss", "epochs_run", "mlflow_run_id")}
    runs = _runs(uri, "ray")
    report["params"] = next(run.data.params for run in runs if run.info.run_id == result.mlflow_run_id)
    report["mlflow_runs"] = [run.info.status for run in runs]
    started = time.monotonic()
    try:
        run_with_ray(_rank_one_raises, 2, uri=uri)
        report["failure"] = {"type": None}
    except RayJobError as exc:
        report["failure"] = {"type": type(exc).__name__, "rank": exc.rank, "message": str(exc)}
    timings["failing_job"] = round(time.monotonic() - started, 1)
    report["failure"]["mlflow_runs"] = [run.info.status for run in _runs(uri, "ray-failure")]
    report["listeners_after_training"] = [
        {**asdict(entry), "loopback": entry.loopback} for entry in ray_on_spark.listeners()
    ]


def _lose_a_worker(report: dict, timings: dict) -> None:
    """Inside the Ray cluster: rank 1's process SIGKILLs itself, with no retry (helpers.ray_faults). The run with one
    retry is lesson 6's (its ``ray-restart-says`` output, which nbval compares)."""
    from helpers.ray_faults import lose_a_worker
    from helpers.ray_launcher import RayJobError, run_with_ray

    started = time.monotonic()
    try:
        run_with_ray(lose_a_worker, 2, kill_epoch=0)
        report["lost_worker_no_retry"] = {"type": None}
    except RayJobError as exc:
        report["lost_worker_no_retry"] = {"type": type(exc).__name__, "rank": exc.rank, "message": str(exc)}
    timings["lost_worker_no_retry"] = round(time.monotonic() - started, 1)


def _check_answers(data, report: dict, timings: dict) -> None:
    """Inside the Ray cluster: every 6.2 answer of the corpus through the check, as the lesson runs it."""
    _, train_converter, val_converter, class_names = data
    namespace = {
        "train_converter": train_converter,
        "val_converter": val_converter,
        "class_names": class_names,
        "WORKERS": 2,
        "USE_GPU": False,
    }
    report["verdicts"] = {}
    for name, (answer, _) in lesson6_answers.LOOPS.items():
        started = time.monotonic()
        report["verdicts"][name] = _run("6.2", {**namespace, "train_loop_per_worker": answer})
        timings[name] = round(time.monotonic() - started, 1)


def ray_on_the_cluster(cluster, work: Path) -> dict:
    """The Ray part of the session, on ``cluster`` (see the module's docstring): its report."""
    from helpers.data import embedded_digits
    from helpers.loaders import prepare_data
    from helpers.ray_on_spark import ray_cluster

    memory, timings = _PeakMemory(), {}
    memory.start()
    report: dict = {"timings_s": timings}
    spark = cluster.spark
    data = prepare_data(embedded_digits(work), num_devices=2, spark=spark)
    report["too_many_nodes"] = _error(lambda: _enter(ray_cluster(spark, workers=3)))
    report["too_wide_nodes"] = _error(lambda: _enter(ray_cluster(spark, cpus_per_worker=2)))
    started = time.monotonic()
    with ray_cluster(spark) as ray_on_spark:
        timings["ray_start"] = round(time.monotonic() - started, 1)
        _train_and_fail(ray_on_spark, data, report, timings)
        _lose_a_worker(report, timings)
        _check_answers(data, report, timings)
        processes = ray_on_spark.processes()
        started = time.monotonic()
    timings["ray_stop"] = round(time.monotonic() - started, 1)
    report["ray_processes"] = len(processes)
    report["left"] = _alive(processes)
    report["left_by_scan"] = [p.pid for p in ray_on_spark.processes()]
    report["temp_root_left"] = ray_on_spark.temp_root.exists()
    report["spark_rows_after"] = spark.range(100).count()
    memory.done.set()
    report["peak_rss_mb"] = memory.peak_mb
    return report
