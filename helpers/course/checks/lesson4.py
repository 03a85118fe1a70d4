"""Checks for lesson 4: multi-node scaling. They run on the notebook's cluster (``spark``) and read its own
``WORKERS`` and ``USE_GPU``: 4.1 starts small Horovod jobs on the workers, 4.3 one short TorchDistributor job (plus
calls of the training function in this process under a simulated ``torchrun`` environment), 4.4 writes its own
MLflow runs and 4.5 its own checkpoint folders, so no verdict depends on how well the lesson's training went."""

from __future__ import annotations

import os
import random
import shutil
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from helpers.course.checks import (
    CannotCheck,
    close,
    is_whole,
    register,
    require,
    whole_number,
)
from helpers.course.checks.function_check import Call, Case, FunctionCheck, FunctionChecks, Returns, Seen, Watched
from helpers.course.checks.ranks import check_dir, recorded_fits, torchrun_env
from helpers.logs import logger_levels

__all__ = [
    "TABLE_COLUMNS",
    "cluster_task_slots",
    "ddp_training_function",
    "launch_on_workers_check",
    "launcher_comparison",
    "resume_check",
    "torch_distributor_setup",
]

TABLE_COLUMNS = ("wall_time_s", "val_loss", "val_acc")


def _workers(namespace) -> int:
    """The notebook's own number of training processes (``WORKERS``)."""
    return whole_number(namespace.get("WORKERS", 2), "WORKERS")


# ---------------------------------------------------------------------------------------------------------- 4.1


class RankZeroReport(dict):
    """Rank 0's report from :func:`_where_rank`: a type of its own, as ``train_hvd`` returns a result on rank 0 and
    None on the others (a collective named after the value's type then has a different name on rank 0)."""


#: The stall bound of the check's Horovod jobs: ranks that wait in differently named collectives fail in half a
#: minute (the ranks meet in ``hvd.init()``, so a correct answer's gather waits a second at most)
_CHECK_STALL_S = "30"


def _where_rank(tag: int) -> dict[str, Any]:
    """In each Horovod process: its rank and size, ``tag`` (proves the keyword arguments arrived) and the Spark task
    process above it (an executor JVM, or a local master's Python worker daemon; None outside Spark); a
    :class:`RankZeroReport` on rank 0."""
    import horovod.torch as hvd
    import psutil

    hvd.init()
    marks = ("CoarseGrainedExecutorBackend", "pyspark.daemon")
    task = next((p.pid for p in psutil.Process().parents() if any(m in " ".join(p.cmdline()) for m in marks)), None)
    report = {"rank": hvd.rank(), "size": hvd.size(), "executor": task, "tag": tag}
    return RankZeroReport(report) if hvd.rank() == 0 else report


def _tag(count: int) -> int:
    """The keyword argument ``fn`` is given in the call for ``count`` processes: a number the answer cannot know."""
    return random.Random(count).randrange(10**6)


def _process_counts(namespace: Mapping[str, Any]) -> list[Case]:
    """4.1's calls: for 1 process and for the notebook's ``WORKERS``. Horovod must be installed here (it is not on
    Databricks Runtime 16.0 ML and later), else the answer cannot be checked: it is not run."""
    from helpers import CourseInputError
    from helpers.devices import require_horovod

    workers = _workers(namespace)
    try:
        require_horovod("This exercise (Horovod on Spark)")
    except CourseInputError as missing:
        raise CannotCheck(str(missing)) from None
    return [Case((count,)) for count in sorted({1, workers})]


def _short_stalls(_case: tuple, _given: Call) -> Any:
    """The check's Horovod jobs stall out after :data:`_CHECK_STALL_S` seconds, not the default minutes."""
    from helpers.jobs import STALL_TIMEOUT_ENV

    return mock.patch.dict(os.environ, {STALL_TIMEOUT_ENV: _CHECK_STALL_S})


def _launch_hint(_case: tuple, error: Any) -> str:
    """What to fix after the answer's launch raised ``error``: a stall between differently named collectives (the
    default name of ``hvd.allgather_object`` is the value's type) gets its own hint."""
    from helpers.jobs import StalledCollectiveError

    _, stall, stalled = str(getattr(error, "reason", None) or "").partition(f"{StalledCollectiveError.__name__}: ")
    if stall:
        return (
            f"the ranks never met in one collective ({stalled}). Horovod pairs collectives up by name, and "
            "hvd.allgather_object names its own after the type of the value, which differs where rank 0 returns "
            "another type (train_hvd: a result on rank 0, None on the others): give it a name"
        )
    return "run fn(**kwargs) in num_workers Horovod processes in Spark tasks and gather every rank's value"


def _every_rank_problem(case: tuple[int], returned: Any, _given: Call) -> str | None:
    """What is wrong with what the answer returned for ``case[0]`` processes of :func:`_where_rank`, or None: it
    must be every rank's report, in rank order, each from a Spark task."""
    count = case[0]
    if not isinstance(returned, list | tuple) or not all(isinstance(r, dict) for r in returned):
        return (
            f"returned {returned!r:.300}, expected a list of every rank's value: `run` hands back rank 0's value "
            "only, so gather every rank's inside the function it runs (hvd.allgather_object)"
        )
    if len(returned) != count:
        return f"returned {len(returned)} values, expected one per process: start num_workers"
    ranks = [(r.get("rank"), r.get("size")) for r in returned]
    if ranks != [(rank, count) for rank in range(count)]:
        return (
            f"returned the values of (rank, size) {ranks}, expected ranks 0 to {count - 1} of {count}, in rank "
            "order: each process's own value, gathered (hvd.allgather_object gathers in rank order)"
        )
    if any(r.get("tag") != _tag(count) for r in returned):
        return "ran fn without its keyword arguments: call fn(**kwargs) in every process"
    on_driver = [r["rank"] for r in returned if r.get("executor") is None]
    if on_driver:
        return (
            f"ran ranks {on_driver} on the driver, not in Spark tasks: np=-N starts N processes on this machine, "
            "np=+N starts them as Spark tasks on the workers"
        )
    return None


#: ``launch_on_workers(fn, num_workers, **kwargs)``: ``fn(**kwargs)`` runs as Horovod processes in Spark tasks and
#: every rank's value comes back, in rank order; called for 1 process and for the notebook's ``WORKERS`` (given the
#: notebook's ``globals()``, with an active SparkSession whose workers the processes run on)
launch_on_workers_check = register("4.1")(
    FunctionCheck(
        "4.1",
        answer="launch_on_workers",
        fixed=[],
        from_namespace=_process_counts,
        arguments=lambda case: Call((_where_rank, case[0]), {"tag": _tag(case[0])}),
        around=_short_stalls,
        judge=_every_rank_problem,
        show=lambda case: f"fn, {case[0]}, tag={_tag(case[0])}",
        hint=_launch_hint,
        passed="",
        passed_namespace=lambda own: (
            f"every rank's value came back, in rank order, from {' and '.join(str(c.args[0]) for c in own)} "
            "Horovod processes in Spark tasks"
        ),
    )
)


# ---------------------------------------------------------------------------------------------------------- 4.2


def distributor_cases(seed: int = 42) -> list[tuple[int, int]]:
    """``(workers, gpus_per_worker)`` clusters for 4.2: CPUs only, one GPU per worker, a random cluster of 3 to 6
    workers with a different number of 3 to 8 GPUs each (no sum, count or product of the two stands in for another)
    and one of 3 to 6 workers without GPUs."""
    rng = random.Random(seed)
    workers = rng.randint(3, 6)
    gpus = rng.choice([count for count in range(3, 9) if count != workers])
    return [(2, 0), (1, 1), (workers, gpus), (rng.randint(3, 6), 0)]


def _distributor_problem(case: tuple[int, int], distributor: Any, _given: tuple) -> str | None:
    """What is wrong with the TorchDistributor planned for ``case``'s cluster: one process per GPU, or per worker,
    on the workers; None if nothing."""
    from pyspark.ml.torch.distributor import TorchDistributor

    workers, gpus = case
    if not isinstance(distributor, TorchDistributor):
        return f"returned {distributor!r}, not a TorchDistributor"
    if distributor.local_mode:
        return "has local_mode=True: that starts every process on the driver; the workers need local_mode=False"
    machines = f"{workers} worker{'s' if workers > 1 else ''}"
    cluster = f"{machines} with {gpus} GPU{'s' if gpus > 1 else ''} each" if gpus else f"{machines} without GPUs"
    expected = workers * gpus if gpus else workers
    if distributor.num_processes != expected:
        rule = f"one process per GPU ({workers} x {gpus})" if gpus else "one process per worker"
        return f"has num_processes={distributor.num_processes}, expected {expected} for {cluster}: {rule}"
    if distributor.use_gpu != (gpus > 0):
        return f"has use_gpu={distributor.use_gpu}: " + (
            "give each process its own GPU (use_gpu=True)" if gpus else "there is no GPU to use (use_gpu=False)"
        )
    return None


def _any_cluster(_case: tuple, _given: tuple):
    """TorchDistributor checks the cluster's GPUs when it is made: let it accept use_gpu=True on any cluster here."""
    from pyspark.ml.torch.distributor import Distributor

    return mock.patch.object(Distributor, "_get_num_tasks", lambda distributor: distributor.num_processes)


def _layout(num_processes: int, local_mode: bool) -> dict[str, int]:
    """DDP's layout under TorchDistributor: one node of N devices locally, N nodes of one device on workers."""
    return {"devices": num_processes, "num_nodes": 1} if local_mode else {"devices": 1, "num_nodes": num_processes}


def _same_layout(got: Any, expected: dict[str, int]) -> bool:
    return len(got) == len(expected) and all(is_whole(got.get(key)) and got[key] == n for key, n in expected.items())


#: ``make_torch_distributor(workers, gpus_per_worker)``, a job planned from the cluster it runs on, and
#: ``trainer_layout(num_processes, local_mode)`` for DDP under it; nothing is launched
torch_distributor_setup = register("4.2")(
    FunctionChecks(
        (
            FunctionCheck(
                "4.2",
                answer="make_torch_distributor",
                fixed=distributor_cases(),
                judge=_distributor_problem,
                around=_any_cluster,
                forbid=("helpers.distributor:make_distributor", "helpers.distributor:ddp_layout"),
                hint="TorchDistributor(num_processes=..., local_mode=False, use_gpu=...): one process per GPU",
                passed="one process per GPU (or per worker) on the workers",
            ),
            FunctionCheck(
                "4.2",
                answer="trainer_layout",
                fixed=[(processes, local) for processes in (1, 2) for local in (False, True)],
                draw=lambda rng: (rng.randint(3, 16), rng.random() < 0.5),
                draws=4,
                reference=_layout,
                returns=Returns("a dict of devices and num_nodes", lambda got: isinstance(got, Mapping), _same_layout),
                keywords=True,
                forbid=("helpers.distributor:ddp_layout",),
                hint=lambda case, got: (
                    "torchrun starts them all on one node (the driver)"
                    if case[1]
                    else "every Spark task is a node with one process"
                ),
                passed="devices=1, num_nodes=N there and devices=N, num_nodes=1 locally",
            ),
        )
    )
)


# ---------------------------------------------------------------------------------------------------------- 4.4


_CHECK_EXPERIMENT = "lesson-4-check"  # where the check writes its runs (and deletes them again)
_CHECK_LAUNCHERS = (("horovod", "torch_distributor"), ("deepspeed", "ray", "horovod_local"))


def _lessons_store(namespace: Mapping[str, Any]) -> list[Case]:
    """The check's two sets of launchers, each with its seed, in the notebook's MLflow store."""
    from helpers.tracking import tracking_uri

    uri = tracking_uri(namespace.get("MLFLOW_TRACKING_URI"))
    return [Case((launchers, seed, uri)) for seed, launchers in enumerate(_CHECK_LAUNCHERS)]


def _check_runs(uri: str, launchers: tuple[str, ...]) -> dict[str, Any]:
    """The check's runs of ``launchers`` in ``uri`` (by their names), ``{launcher: Run}``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(_CHECK_EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return {
        run.info.run_name.removeprefix("check-"): run
        for run in runs
        if run.info.run_name in {f"check-{n}" for n in launchers}
    }


def _written_runs(case: tuple) -> tuple[dict[str, str]]:
    """One finished run per launcher of ``case``, each metric logged at 3 steps with seeded random values; the
    answer's call: ``{launcher: run_id}``."""
    from mlflow.tracking import MlflowClient

    launchers, seed, uri = case
    _delete_runs(case, None)  # left by a check that was interrupted: the runs are found by their names
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(_CHECK_EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(_CHECK_EXPERIMENT)
    rng, run_ids = random.Random(seed), {}
    for launcher in launchers:
        run_id = run_ids[launcher] = client.create_run(experiment_id, run_name=f"check-{launcher}").info.run_id
        for step in range(3):
            values = {
                "wall_time_s": rng.uniform(5, 500),
                "val_loss": rng.uniform(0.05, 2.5),
                "val_acc": rng.uniform(0.1, 0.99),
                "train_loss_epoch": rng.uniform(0.05, 2.5),  # as a real run has
                "epoch": float(step),
            }
            for key, value in values.items():
                client.log_metric(run_id, key, value, step=step)
        client.set_terminated(run_id)
    return (run_ids,)


def _delete_runs(case: tuple, _made: tuple | None) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(case[2])
    for run in _check_runs(case[2], case[0]).values():
        client.delete_run(run.info.run_id)


def _table_problem(case: tuple, table: Any, _given: tuple) -> str | None:
    """What is wrong with the answer's table: one row per launcher, exactly ``TABLE_COLUMNS``, each its run's last
    value of the metric (read back from MLflow here)."""
    launchers = case[0]
    index = getattr(table, "index", None)
    if index is None or sorted(map(str, index)) != sorted(launchers):
        return (
            f"has the index {None if index is None else list(index)}: one row per launcher, named by the keys of "
            "run_ids"
        )
    missing = [column for column in TABLE_COLUMNS if column not in table.columns]
    if missing:
        return f"has no {missing[0]!r} column (columns: {list(table.columns)})"
    extra = [str(column) for column in table.columns if column not in TABLE_COLUMNS]
    if extra:
        return f"also has {extra}: keep only {list(TABLE_COLUMNS)}, the columns the comparison reads"
    runs = _check_runs(case[2], launchers)
    for column in TABLE_COLUMNS:
        for launcher in launchers:
            got, expected = table.loc[launcher, column], runs[launcher].data.metrics[column]
            if not close(got, expected, rel=1e-6):
                return (
                    f"has {column} {got!r} for {launcher}, but its run's last value is {expected:.6g}: read "
                    "client.get_run(run_id).data.metrics (the last value of each metric)"
                )
    return None


#: ``launcher_table(run_ids)``: one row per launcher (the index) with the last ``wall_time_s``, ``val_loss`` and
#: ``val_acc`` of each run, read from MLflow; checked on runs the check writes to the notebook's store under other
#: launcher names (in the experiment ``lesson-4-check``, deleted afterwards)
launcher_comparison = register("4.4")(
    FunctionCheck(
        "4.4",
        answer="launcher_table",
        fixed=[],
        from_namespace=_lessons_store,
        arguments=_written_runs,
        cleanup=_delete_runs,
        judge=_table_problem,
        show=lambda case: f"<run ids of {list(case[0])}>",
        forbid=("helpers.analysis:runs_table", "helpers.tracking:metric_history"),
        hint="a DataFrame with a row per launcher and the last wall_time_s, val_loss and val_acc of its run",
        passed="",
        passed_namespace="the last wall time, val_loss and val_acc of every run, one row per launcher",
    )
)


# ---------------------------------------------------------------------------------------------------------- 4.3

#: The course's helpers that would do exercise 4.3 for the learner.
_DDP_HELPERS = (
    "helpers.worker:train_process",
    "helpers.worker:_rank_and_strategy",
    "helpers.worker:launch_training",
    "helpers.worker:train_hvd",
    "helpers.worker:train_with_distributor",
    "helpers.distributor:run_with_distributor",
    "helpers.distributor:ddp_layout",
    "helpers.distributor:make_distributor",
)


def _fit_problem(
    fits: list[dict[str, Any]], rank: int, world_size: int, local_mode: bool, use_gpu: bool, settings: Any = None
) -> str | None:
    """What is wrong with the first Trainer ``rank`` fitted, or None: the layout for the mode, DDP, this rank's
    shard, the right accelerator, and (for ``settings``) the epochs, batch size and scaled learning rate."""
    if not fits:
        return "never fits a Trainer: call train(...) or trainer.fit(...)"
    fit = fits[0]
    expected = (world_size, 1) if local_mode else (1, world_size)
    if (fit["devices"], fit["num_nodes"]) != expected:
        return (
            f"builds a Trainer with devices={fit['devices']}, num_nodes={fit['num_nodes']}, expected "
            f"devices={expected[0]}, num_nodes={expected[1]}: read the layout from WORLD_SIZE and the mode "
            "(local_mode, or LOCAL_WORLD_SIZE)"
        )
    if "DDP" not in fit["strategy"]:
        return f"builds a Trainer with the strategy {fit['strategy']}: use strategy='ddp'"
    if fit["shard"][1] is not None and fit["shard"] != [rank, world_size]:
        return (
            f"gives the Trainer a datamodule that reads shard {fit['shard'][0]} of {fit['shard'][1]}: use "
            "device_id=RANK and device_count=WORLD_SIZE from os.environ"
        )
    if fit["gpu"] != use_gpu:
        return (
            f"trains on the {'GPU' if fit['gpu'] else 'CPU'} but settings.use_gpu is {use_gpu}: "
            "accelerator='gpu' if settings.use_gpu else 'cpu'"
        )
    return _settings_problem(fit, settings, world_size) if settings is not None else None


def _settings_problem(fit: dict[str, Any], settings: Any, world_size: int) -> str | None:
    """What the Trainer does not take from the settings it was given, or None: epochs, batch size, and the learning
    rate scaled by the world size (a model without a ``learning_rate`` attribute is not judged on it)."""
    if fit["max_epochs"] != settings.max_epochs:
        return (
            f"runs {fit['max_epochs']} epochs, settings.max_epochs is {settings.max_epochs}: pass "
            "max_epochs=settings.max_epochs"
        )
    if fit["batch_size"] is not None and fit["batch_size"] != settings.batch_size:
        return (
            f"reads batches of {fit['batch_size']}, settings.batch_size is {settings.batch_size}: each process "
            "takes settings.batch_size rows per step"
        )
    scaled = settings.learning_rate * world_size
    if fit["learning_rate"] is not None and not close(fit["learning_rate"], scaled, rel=1e-9):
        return (
            f"gives the model the learning rate {fit['learning_rate']!r}, expected settings.learning_rate x "
            f"WORLD_SIZE = {scaled:g}: the global batch is WORLD_SIZE times larger, so scale the rate as Horovod's "
            "strategy did"
        )
    return None


def _quick(settings: Any, **changes: Any) -> Any:
    """The lesson's settings for one short training by the check: one epoch, no MLflow run, no checkpoint to restore,
    checkpoints in a folder of the check's; then ``changes``."""
    folder = str(check_dir("4.3-checkpoints"))
    quick = {"max_epochs": 1, "mlflow_experiment": None, "ckpt_restore": None, "default_dir": folder, "run_name": None}
    return settings.replace(**{**quick, **changes})


def _ddp_arguments(namespace: Mapping[str, Any], **changes: Any) -> tuple:
    """``ddp_train``'s arguments but ``local_mode``, from the notebook's converters, classes and settings."""
    train_converter, val_converter, class_names, settings = require(
        namespace, "train_converter", "val_converter", "class_names", "settings"
    )
    return train_converter, val_converter, len(class_names), _quick(settings, **changes)


def _simulated_ranks(namespace: Mapping[str, Any]) -> list[Case]:
    """The calls made in this process, ``(arguments, local_mode, world_size, rank)``: the first and last rank of a
    job on one node and of one on the workers, both of other sizes than the lesson's, with settings of the check's
    own (whether the answer uses the ones it is given)."""
    rng = random.Random(45)
    own = {"max_epochs": rng.randint(2, 5), "batch_size": rng.randint(5, 13)}
    args = _ddp_arguments(
        namespace, use_gpu=False, mixed_precision=False, **own, learning_rate=rng.choice([0.003, 0.007, 0.03])
    )
    jobs = ((True, rng.randint(3, 4)), (False, rng.randint(3, 6)))
    return [Case((args, local, size, rank)) for local, size in jobs for rank in (0, size - 1)]


@contextmanager
def _simulated_rank(case: tuple, _given: Call) -> Iterator[Seen]:
    """This process as a rank of a ``torchrun`` job (the case's), its Trainers recorded and stopped at ``fit``."""
    _args, local_mode, world_size, rank = case
    seen = Seen(fits=[])
    with torchrun_env(rank, world_size, local_mode), recorded_fits(seen["fits"], stop=True):
        yield seen


def _where(local_mode: bool) -> str:
    return "on one node (local mode)" if local_mode else "on the workers"


def _simulated_problem(case: tuple, got: Watched, _given: Call) -> str | None:
    args, local_mode, world_size, rank = case
    problem = _fit_problem(got.seen["fits"], rank, world_size, local_mode, use_gpu=False, settings=args[3])
    return problem and f"as rank {rank} of {world_size} {_where(local_mode)} {problem}"


def _workers_job(namespace: Mapping[str, Any]) -> list[Case]:
    """The call made in the real job, ``(arguments, workers, use_gpu)``: the lesson's settings for one epoch, on the
    notebook's ``WORKERS`` processes (on GPUs where ``USE_GPU``), on the cluster of its ``spark``."""
    require(namespace, "spark")
    return [Case((_ddp_arguments(namespace), _workers(namespace), bool(namespace.get("USE_GPU", False))))]


def _on_the_workers(processes: int, job, kwargs: dict[str, Any]) -> None:
    """Run ``job(**kwargs)`` in ``processes`` TorchDistributor processes on the active session's workers (on GPUs
    where the case says so), cancelled as soon as a task fails or an executor is lost."""
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    from helpers.distributor import run_sealed, watched_job
    from helpers.spark import configure_python_env

    spark = SparkSession.getActiveSession()
    configure_python_env()
    with watched_job(spark, processes):
        distributor = TorchDistributor(num_processes=processes, local_mode=False, use_gpu=kwargs["cases"][0][2])
        run_sealed(distributor, job, **kwargs)


@contextmanager
def _fits_recorded(_case: tuple, _given: Call) -> Iterator[Seen]:
    """In a rank of the real job: its Trainers recorded, and fitted."""
    seen = Seen(fits=[])
    with recorded_fits(seen["fits"], stop=False):
        yield seen


def _workers_problem(case: tuple, per_rank: list[Watched], _given: Call) -> str | None:
    """Every rank fitted the right Trainer; rank 0 alone returned something."""
    _args, workers, use_gpu = case
    for rank, got in enumerate(per_rank):
        problem = _fit_problem(got.seen["fits"], rank, workers, local_mode=False, use_gpu=use_gpu)
        if problem:
            return f"as rank {rank} of {workers} on the workers {problem}"
    if per_rank[0].returned is None:
        return "returned None on rank 0: return train's result (or what you want back) on rank 0"
    also = [rank for rank, got in enumerate(per_rank) if rank and got.returned is not None]
    if also:
        return (
            f"returned a result on rank(s) {also} too: return it on rank 0 only (None elsewhere); run() keeps rank "
            "0's and drops the others"
        )
    return None


def _ddp_call(args: tuple, local_mode: bool) -> str:
    """How a hint shows ``ddp_train``'s arguments (a call on the notebook's converters and settings)."""
    return f"train_converter, val_converter, {args[2]}, settings, local_mode={local_mode}"


def _remove_checkpoints(case: tuple, _made: Call) -> None:
    """Remove the checkpoint folder of the case's settings (the check's own, see :func:`_quick`)."""
    shutil.rmtree(case[0][3].default_dir, ignore_errors=True)


_DDP_DECLARED = dict(
    answer="ddp_train", fixed=(), forbid=_DDP_HELPERS, cleanup=_remove_checkpoints, effect_only=True, passed=""
)

#: ``ddp_train(train_converter, val_converter, class_count, settings, local_mode)``: what TorchDistributor runs.
#: Called here as ranks of simulated ``torchrun`` jobs (other world sizes, both modes, settings of the check's own,
#: stopped at ``fit``), then run for one epoch on the notebook's ``WORKERS`` processes on its workers: every rank's
#: Trainer must have the layout, strategy, shard and accelerator, and rank 0 alone return something.
ddp_training_function = register("4.3")(
    FunctionChecks(
        (
            FunctionCheck(
                "4.3",
                **_DDP_DECLARED,
                from_namespace=_simulated_ranks,
                show=lambda case: _ddp_call(case[0], case[1]),
                arguments=lambda case: Call(case[0], {"local_mode": case[1]}),
                around=_simulated_rank,
                judge=_simulated_problem,
                hint="read RANK, WORLD_SIZE and LOCAL_WORLD_SIZE from os.environ and train with the settings given",
                passed_namespace="the right Trainer in both modes",
            ),
            FunctionCheck(
                "4.3",
                **_DDP_DECLARED,
                from_namespace=_workers_job,
                show=lambda case: _ddp_call(case[0], False),
                arguments=lambda case: Call(case[0], {"local_mode": False}),
                processes=lambda cases: cases[0][1],
                launch=_on_the_workers,
                around=_fits_recorded,
                collect=lambda _result, _case: True,  # only whether it returned: a Trainer need not come back
                judge=_workers_problem,
                hint=(
                    "ddp_train runs in every TorchDistributor process on the workers: use only its arguments and "
                    "what it imports there (not the notebook's spark or other globals)"
                ),
                passed_namespace=lambda own: f"{own[0].args[1]} DDP processes trained on the workers and rank 0 "
                "returned",
            ),
        )
    )
)


# ---------------------------------------------------------------------------------------------------------- 4.5


def _tiny_lightning() -> tuple[type, type]:
    """A 2-class linear LightningModule and a datamodule of 16 random rows: a real fit in milliseconds."""
    import pytorch_lightning as pl
    import torch

    class TinyModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class TinyData(pl.LightningDataModule):
        def train_dataloader(self):
            generator = torch.Generator().manual_seed(0)
            data = torch.utils.data.TensorDataset(
                torch.randn(16, 4, generator=generator), torch.randint(0, 2, (16,), generator=generator)
            )
            return torch.utils.data.DataLoader(data, batch_size=8)

    return TinyModel, TinyData


def _epoch_counter():
    """A Lightning callback whose ``epochs`` lists the epochs a fit actually ran."""
    import pytorch_lightning as pl

    class EpochsRun(pl.Callback):
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self.epochs.append(trainer.current_epoch)

    return EpochsRun()


def _trainer(max_epochs: int, callbacks: list, folder: Path | None = None):
    """A quiet CPU Trainer; with ``folder`` it keeps a checkpoint of every epoch there and ``last.ckpt``."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    if folder is not None:
        callbacks = [*callbacks, ModelCheckpoint(dirpath=str(folder), save_top_k=-1, save_last=True)]
    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=folder is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _interrupted_run(folder: Path, epochs: int, torn: bool) -> None:
    """A folder as a lost job leaves it: checkpoints of epochs 0..epochs-1 and ``last.ckpt``; with ``torn`` the
    worker died while writing the newest epoch's files, which are cut off halfway."""
    model_class, data_class = _tiny_lightning()
    _trainer(epochs, [], folder).fit(model_class(), datamodule=data_class())
    if torn:
        newest = [folder / "last.ckpt", *folder.glob(f"epoch={epochs - 1}-*.ckpt")]
        for path in newest:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


_SAVED_EPOCHS = 12  # more than 10: sorting the file names as text puts epoch=9 after epoch=11
_RESUMED_TO = _SAVED_EPOCHS + 2  # the Trainer's max_epochs


def _interrupted_folder(case: tuple[str, int, bool]) -> tuple:
    """The call of a 4.5 case ``(what, epochs saved, torn)``: a Trainer of :data:`_RESUMED_TO` epochs that counts
    the epochs it runs, a tiny model and datamodule, and a new folder as a lost job left it (see
    :func:`_interrupted_run`), empty where no epoch was saved."""
    _, saved, torn = case
    folder = check_dir("4.5")
    folder.mkdir(parents=True)
    model_class, data_class = _tiny_lightning()
    with _quiet_resume(case, ()):
        if saved:
            _interrupted_run(folder, saved, torn)
        # the checkpoints' own callback as well: without it Lightning warns (as lesson 2 teaches)
        trainer = _trainer(_RESUMED_TO, [_epoch_counter()], folder)
    return trainer, model_class(), data_class(), str(folder)


@contextmanager
def _quiet_resume(_case: tuple, _given: tuple) -> Iterator[None]:
    """Lightning's info quiet, and no warning that the folder is reused: it is the interrupted run's, on purpose."""
    import logging

    from helpers.training import CHECKPOINT_FOLDER_REUSED

    with logger_levels({"pytorch_lightning": logging.ERROR}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CHECKPOINT_FOLDER_REUSED)
        yield


def _resumed_problem(case: tuple, got: Any, given: tuple) -> str | None:
    """What is wrong with the epochs a 4.5 answer's fit ran, or None (what it returns is not asked for)."""
    _, saved, torn = case
    ran = next(callback.epochs for callback in given[0].callbacks if hasattr(callback, "epochs"))
    start = saved - 1 if torn else saved
    if ran == list(range(start, _RESUMED_TO)):
        return None
    return (
        f"ran epochs {ran}, expected {start} to {_RESUMED_TO - 1}: pass the newest readable checkpoint as "
        "trainer.fit(..., ckpt_path=...), None when there is none"
    )


#: ``resume_training(trainer, model, datamodule, checkpoint_dir)`` continues from the readable checkpoint with the
#: most progress, on folders the check writes (more than 10 epochs, a torn newest file, none)
resume_check = register("4.5")(
    FunctionCheck(
        "4.5",
        answer="resume_training",
        fixed=[
            ("a complete folder", _SAVED_EPOCHS, False),
            ("the newest files torn", _SAVED_EPOCHS, True),
            ("no checkpoint yet", 0, False),
        ],
        arguments=_interrupted_folder,
        around=_quiet_resume,
        judge=_resumed_problem,
        effect_only=True,
        cleanup=lambda case, made: shutil.rmtree(made[3], ignore_errors=True),
        show=lambda case: (
            f"<Trainer of max_epochs={_RESUMED_TO}>, <model>, <datamodule>, <{case[0]}: {case[1]} epochs saved>"
        ),
        forbid=("helpers.jobs:last_checkpoint",),
        hint="read each .ckpt's epoch and global_step, skip the files that cannot be read, fit from the newest",
        passed=f"resumed at epoch {_SAVED_EPOCHS}, at {_SAVED_EPOCHS - 1} past a torn file, at 0 without checkpoints",
    )
)


# ---------------------------------------------------------------------------------------------------------- 4.6


def _slots(executors: int, cores: int, task_cpus: int, gpus: int, task_gpus: float) -> int:
    """The reference: task slots per executor by cores, and by GPUs (as Spark counts shares) when tasks ask for
    them, times executors."""
    from helpers.spark import gpu_task_slots

    per_executor = cores // task_cpus
    if task_gpus > 0:
        per_executor = min(per_executor, gpu_task_slots(gpus, task_gpus))
    return executors * per_executor


def _draw_cluster(rng: random.Random) -> tuple[int, int, int, int, float]:
    """A cluster the check generates: executors, cores and GPUs each, and what each task asks for."""
    return (
        rng.randint(1, 9),
        rng.choice([4, 6, 8, 12, 16, 32]),
        rng.choice([1, 2, 4]),
        rng.choice([0, 1, 2, 4, 8]),
        rng.choice([0.0, 0.25, 0.3, 0.35, 0.4, 0.5, 1.0, 2.0]),
    )


#: (stretch) ``max_processes(executors, cores, task_cpus, gpus, task_gpus)``: how many training processes a barrier
#: job can start at once, on the clusters of the text and 30 the check draws; calling ``helpers.spark.task_slots`` or
#: ``gpu_task_slots`` is delegating
cluster_task_slots = register("4.6")(
    FunctionCheck(
        "4.6",
        answer="max_processes",
        fixed=[
            (2, 1, 1, 0, 0.0),
            (2, 8, 2, 0, 0.0),
            (3, 16, 4, 4, 1.0),
            (2, 8, 1, 2, 1.0),
            (4, 4, 1, 2, 0.5),
            (3, 6, 4, 0, 0.0),
            (3, 8, 1, 1, 2.0),
            (1, 16, 1, 3, 0.3),  # 3 per GPU: 9, where gpus // task_gpus says 10
            (1, 16, 1, 3, 0.4),  # 2 per GPU: 6, where gpus // task_gpus says 7
            (2, 32, 1, 2, 0.2222),  # 4 per GPU (Spark's own example): 16, not 18
            (1, 16, 1, 2, 0.35),  # 2 per GPU: 4, where rounding 1 / 0.35 says 6
        ],
        draw=_draw_cluster,
        draws=30,
        reference=_slots,
        keywords=True,
        forbid=("helpers.spark:task_slots", "helpers.spark:gpu_task_slots"),
        hint="each executor runs cores // task_cpus tasks, and with task_gpus > 0 no more than its GPUs hold: "
        "floor(1 / task_gpus) tasks per GPU for task_gpus <= 0.5, else gpus // task_gpus",
        passed="task slots right on {n} clusters",
    )
)
