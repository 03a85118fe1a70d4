"""Checks for lesson 4: multi-node scaling. They run on the notebook's cluster (``spark``); 4.2 starts a small
Horovod job on its workers (a few seconds), 4.4 reads the two training runs back from MLflow."""

from __future__ import annotations

import math
from typing import Any

from helpers.checks import CheckFailed, NotAttempted, register, require, require_implemented

LAUNCHERS = ("horovod", "torch_distributor")
TABLE_COLUMNS = ("wall_time_s", "val_loss", "val_acc")


def _where_job() -> list[dict[str, Any]]:
    """In each Horovod process: its rank and the Spark executor JVM it runs under (None on the driver)."""
    import horovod.torch as hvd
    import psutil

    hvd.init()
    executor = next(
        (p.pid for p in psutil.Process().parents() if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline())), None
    )
    return hvd.allgather_object({"rank": hvd.rank(), "size": hvd.size(), "executor": executor})


@register("4.1")
def repartition_for_cluster(namespace) -> str:
    """``cluster_devices(spark)``: the task slots; ``repartition_for(df, num_devices)``: 2 non-empty partitions per
    device."""
    from helpers.distributor import task_slots

    cluster_devices, repartition_for, spark = require(namespace, "cluster_devices", "repartition_for", "spark")
    expected = task_slots(spark)
    got = cluster_devices(spark)
    if got is None:
        raise NotAttempted("cluster_devices returns nothing yet")
    if got != expected:
        raise CheckFailed(f"cluster_devices(spark) = {got!r}, but the cluster runs {expected} tasks at once: count "
                          "the task slots (spark.sparkContext.defaultParallelism over spark.task.cpus)")
    rows = 40
    df = spark.range(rows).coalesce(1)
    for devices in (1, expected, expected + 1):
        out = repartition_for(df, devices)
        if out is None:
            raise NotAttempted("repartition_for returns nothing yet")
        sizes = out.rdd.glom().map(len).collect()
        if len(sizes) != 2 * devices:
            raise CheckFailed(f"repartition_for(df, {devices}) has {len(sizes)} partitions, expected {2 * devices}: "
                              "two per device, so every device gets work and a slow one can be balanced")
        if sum(sizes) != rows:
            raise CheckFailed(f"repartition_for(df, {devices}) has {sum(sizes)} rows instead of {rows}")
        if min(sizes) == 0:
            raise CheckFailed(f"repartition_for(df, {devices}) leaves empty partitions {sizes}: use repartition, "
                              "which spreads rows evenly (coalesce only merges partitions)")
    return f"{expected} devices -> {2 * expected} partitions, none empty"


@register("4.2")
def launch_on_workers_check(namespace) -> str:
    """``launch_on_workers(fn, num_workers, **kwargs)``: ``fn`` runs as Horovod processes in Spark executors."""
    launch_on_workers, workers = require(namespace, "launch_on_workers", "WORKERS")
    require_implemented(launch_on_workers)
    ranks = launch_on_workers(_where_job, workers)
    if ranks is None:
        raise NotAttempted("launch_on_workers returns nothing yet: return what HorovodRunner(...).run returns")
    if not isinstance(ranks, list) or len(ranks) != workers:
        raise CheckFailed(f"expected {workers} Horovod processes, got {ranks!r}: use HorovodRunner(np=num_workers)")
    on_driver = [r["rank"] for r in ranks if r["executor"] is None]
    if on_driver:
        raise CheckFailed(f"ranks {on_driver} ran on the driver, not in a Spark executor: np=-N starts N processes "
                          "on this machine, np=+N starts them as Spark tasks on the workers")
    executors = {r["executor"] for r in ranks}
    return f"{workers} Horovod processes ran as Spark tasks in {len(executors)} executor(s)"


@register("4.3")
def torch_distributor_setup(namespace) -> str:
    """``make_torch_distributor(num_processes, use_gpu)`` on the workers; ``trainer_layout`` for DDP under it."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from helpers.distributor import ddp_layout

    make_torch_distributor, trainer_layout = require(namespace, "make_torch_distributor", "trainer_layout")
    use_gpu = bool(namespace.get("USE_GPU", False))
    workers = int(namespace.get("WORKERS", 2))
    distributor = make_torch_distributor(workers, use_gpu)
    if distributor is None:
        raise NotAttempted("make_torch_distributor returns nothing yet")
    if not isinstance(distributor, TorchDistributor):
        raise CheckFailed(f"make_torch_distributor returned a {type(distributor).__name__}, not a TorchDistributor")
    if distributor.local_mode:
        raise CheckFailed("local_mode=True runs every process on the driver and leaves the workers idle: "
                          "use local_mode=False")
    if distributor.num_processes != workers:
        raise CheckFailed(f"num_processes={distributor.num_processes}, expected {workers}: one process per task slot")
    if distributor.use_gpu != use_gpu:
        raise CheckFailed(f"use_gpu={distributor.use_gpu} but USE_GPU={use_gpu}: pass use_gpu through")
    for processes, local_mode in [(2, False), (4, False), (2, True), (3, True)]:
        got = trainer_layout(processes, local_mode)
        if got is None:
            raise NotAttempted("trainer_layout returns nothing yet")
        expected = ddp_layout(processes, local_mode)
        if dict(got) != expected:
            where = "torchrun starts them all on one node (the driver)" if local_mode else \
                "every Spark task is a node with one process"
            raise CheckFailed(f"trainer_layout({processes}, local_mode={local_mode}) = {dict(got)}, expected "
                              f"{expected}: {where}")
    return f"{workers} processes on the workers; the Trainer sees devices=1, num_nodes={workers}"


@register("4.4")
def launcher_comparison(namespace) -> str:
    """``launcher_table(run_ids)``: one row per launcher with the run's wall time, final val_loss and val_acc from
    MLflow; both runs trained on 2 processes to the accuracy floor."""
    from mlflow.tracking import MlflowClient

    from helpers.tracking import tracking_uri

    launcher_table, hvd_result, ddp_result = require(namespace, "launcher_table", "hvd_result", "ddp_result")
    floor = float(namespace.get("ACCURACY_FLOOR", 0.8))
    workers = int(namespace.get("WORKERS", 2))
    run_ids = {"horovod": getattr(hvd_result, "mlflow_run_id", None),
               "torch_distributor": getattr(ddp_result, "mlflow_run_id", None)}
    missing = [name for name, run_id in run_ids.items() if not run_id]
    if missing:
        raise CheckFailed(f"no MLflow run for {', '.join(missing)}: train with an mlflow_experiment")
    client = MlflowClient(tracking_uri(namespace.get("MLFLOW_TRACKING_URI")))
    runs = {name: client.get_run(run_id) for name, run_id in run_ids.items()}
    for name, run in runs.items():
        if run.data.params.get("world_size") != str(workers):
            raise CheckFailed(f"the {name} run trained on world_size={run.data.params.get('world_size')}, "
                              f"expected {workers}")
        acc = run.data.metrics.get("val_acc", float("nan"))
        if not acc >= floor:
            raise CheckFailed(f"the {name} run reached val_acc {acc:.3f}, below the floor {floor}")
    table = launcher_table(run_ids)
    if table is None:
        raise NotAttempted("launcher_table returns nothing yet")
    if sorted(map(str, table.index)) != sorted(run_ids):
        raise CheckFailed(f"the table's index is {list(table.index)}: use the launcher names {list(run_ids)}")
    for column in TABLE_COLUMNS:
        if column not in table.columns:
            raise CheckFailed(f"the table has no {column!r} column (columns: {list(table.columns)})")
        for name, run in runs.items():
            expected, got = run.data.metrics[column], float(table.loc[name, column])
            if not math.isclose(expected, got, rel_tol=1e-6):
                raise CheckFailed(f"{column} of {name} is {got}, but its MLflow run says {expected}: read the "
                                  "run's metrics (client.get_run(run_id).data.metrics)")
    accs = ", ".join(f"{name} {runs[name].data.metrics['val_acc']:.2f}" for name in run_ids)
    return f"both launchers trained {workers} processes past val_acc {floor} ({accs})"
