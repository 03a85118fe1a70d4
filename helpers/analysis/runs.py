"""Lesson 5: running the comparison and recording each run in MLflow.

:func:`run_training` trains the same model and data with Lightning's ``EarlyStopping`` at a given device count,
with either launcher (``helpers.worker.launch_training``). Rank 0 records one MLflow run; the driver then tags it
with what the comparison needs (device count, launcher, where it ran, batch sizes, early-stopping settings, the
sweep it belongs to) and logs its summary metrics (epochs until stop, best and final ``val_loss``, the job's time
including start-up). ``settings.epoch_mode="fixed_steps"`` reproduces the original notebooks' epoch pitfall on
purpose (``helpers.datamodule.FixedStepsDataModule``).
"""

from __future__ import annotations

import time
from typing import Any

from helpers import CourseInputError
from helpers.analysis.schema import FIXED_STEPS, TAG
from helpers.loaders import steps_per_epoch
from helpers.tracking import run_name as new_run_name
from helpers.validation import whole_number
from helpers.worker import TrainSettings, launch_training

__all__ = ["new_sweep_id", "plan_sweep", "record_run", "run_training"]

EARLY_STOPPING_KEYS = ("min_delta", "patience", "stopping_threshold")


def new_sweep_id() -> str:
    """A fresh id for one comparison (one notebook run): every run of it gets the tag ``course.sweep``."""
    return new_run_name("sweep")


def plan_sweep(max_devices: int, base_settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of a like-for-like scaling sweep up to ``max_devices``, from the 1-device ``base_settings``.

    ``base_settings`` holds at least ``batch_size`` (per device), ``learning_rate`` (on 1 device) and
    ``train_rows``. Device counts: 1 (the baseline), doubling while at most ``max_devices``, and ``max_devices``
    itself, keeping only counts at which every device gets a full batch (``devices x batch_size <= train_rows``).
    Each run is a copy of ``base_settings`` (same seed, data and early-stopping settings) with ``devices``, the
    same per-device ``batch_size``, ``global_batch_size = batch_size x devices``, ``learning_rate`` scaled
    linearly (x devices) and ``steps_per_epoch`` for one pass over the data. Sorted by devices.
    """
    batch, rows = base_settings["batch_size"], base_settings["train_rows"]
    max_devices = int(max_devices)
    counts = {max_devices} | {2**k for k in range(max_devices.bit_length()) if 2**k <= max_devices}
    return [
        {
            **base_settings,
            "devices": n,
            "batch_size": batch,
            "global_batch_size": batch * n,
            "learning_rate": base_settings["learning_rate"] * n,
            "steps_per_epoch": steps_per_epoch(rows, batch, n),
        }
        for n in sorted(counts)
        if n == 1 or n * batch <= rows
    ]


def run_training(
    devices: int,
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings,
    *,
    sweep: str,
    launcher: str = "horovod",
    on_spark: bool = False,
):
    """Train once on ``devices`` processes and record the run in MLflow for the comparison.

    Args:
        devices: how many training processes (1 goes through the launcher too, so every run starts alike).
        train_converter, val_converter, class_count: the data (lesson 1's converters, the number of classes).
        settings: the run's settings; ``learning_rate`` is the 1-device rate (the launcher scales it),
            ``batch_size`` the per-device batch in ``"one_pass"`` mode and the 1-device batch in
            ``"fixed_steps"`` mode; ``early_stopping`` a dict with ``min_delta``, ``patience`` and
            ``stopping_threshold``; ``mlflow_experiment`` is required.
        sweep: the comparison this run belongs to (:func:`new_sweep_id`).
        launcher: ``"horovod"`` or ``"torch_distributor"``.
        on_spark: run on the Spark workers instead of this machine.

    Returns:
        Rank 0's ``TrainResult``. The run, named ``<epoch_mode>-devices<n>-seed<seed>-<sweep>`` like its checkpoint
        folder (one per run, repeats with other seeds included), gets the ``course.*`` tags and the summary metrics
        ``epochs_run``, ``best_val_loss``, ``last_val_loss``, ``val_acc`` and ``job_time_s`` (the whole job: process
        start-up, data readers, training) next to ``train``'s ``wall_time_s`` (the fit alone) and per-epoch history;
        its ``placement`` tag is ``"spark"``, ``"local-gpu"`` or ``"local"`` (CPU processes on this machine).

    Raises:
        CourseInputError: no experiment, early-stopping settings without the three keys, or bad settings.
        JobError: training failed.
    """
    whole_number("devices", devices)
    if not settings.mlflow_experiment:
        raise CourseInputError("run_training records an MLflow run: pass settings with mlflow_experiment=...")
    stopping = settings.early_stopping
    if not isinstance(stopping, dict) or set(stopping) != set(EARLY_STOPPING_KEYS):
        raise CourseInputError(f"early_stopping={stopping!r}: pass a dict with exactly {EARLY_STOPPING_KEYS}.")
    rows = len(train_converter)
    fixed = settings.epoch_mode == FIXED_STEPS
    steps = steps_per_epoch(rows, settings.batch_size, 1 if fixed else devices)
    params = {"epoch_mode": settings.epoch_mode, "steps_per_epoch": steps, "train_rows": rows}
    settings = settings.replace(
        run_name=f"{settings.epoch_mode}-devices{devices}-seed{settings.seed}-{sweep}",
        extra_params={**settings.extra_params, **params},
    )
    started = time.perf_counter()
    result = launch_training(
        launcher, devices, train_converter, val_converter, class_count, settings, on_spark=on_spark
    )
    record_run(
        result,
        sweep=sweep,
        devices=devices,
        launcher=launcher,
        placement="spark" if on_spark else "local-gpu" if settings.use_gpu else "local",
        epoch_mode=settings.epoch_mode,
        batch_size=settings.batch_size * devices if fixed else settings.batch_size,
        steps=steps,
        train_rows=rows,
        max_epochs=settings.max_epochs,
        seed=settings.seed,
        job_time_s=time.perf_counter() - started,
        tracking_uri=settings.tracking_uri,
        **stopping,
    )
    return result


def record_run(
    result,
    *,
    sweep: str,
    devices: int,
    launcher: str,
    epoch_mode: str,
    batch_size: int,
    steps: int,
    train_rows: int,
    min_delta: float,
    patience: int,
    stopping_threshold: float | None,
    max_epochs: int,
    seed: int | None = None,
    job_time_s: float | None = None,
    tracking_uri: str | None = None,
    placement: str = "local",
) -> None:
    """Tag ``result``'s MLflow run for the comparison and log its summary metrics (see :func:`run_training`).

    ``batch_size`` is the per-device batch the run used, ``steps`` its steps per epoch. Use it directly for a run
    made without :func:`run_training` (e.g. a plain ``train`` call, with ``launcher="plain"``).
    """
    from mlflow.tracking import MlflowClient

    from helpers.tracking import resolve_uri

    if not getattr(result, "mlflow_run_id", None):
        raise CourseInputError("the result has no MLflow run id: train with mlflow_experiment=... (rank 0's result).")
    client = MlflowClient(resolve_uri(tracking_uri))
    tags = {
        "lesson": 5,
        "sweep": sweep,
        "devices": devices,
        "launcher": launcher,
        "placement": placement,
        "epoch_mode": epoch_mode,
        "batch_size": batch_size,
        "global_batch_size": batch_size * devices,
        "steps_per_epoch": steps,
        "train_rows": train_rows,
        "min_delta": min_delta,
        "patience": patience,
        "stopping_threshold": stopping_threshold,
        "max_epochs": max_epochs,
        "seed": seed,
        "stopped_reason": result.stopped_reason,
    }
    for key, value in tags.items():
        client.set_tag(result.mlflow_run_id, TAG + key, "" if value is None else str(value))
    metrics = {
        "job_time_s": job_time_s,
        "epochs_run": result.epochs_run,
        "best_val_loss": result.best_val_loss,
        "last_val_loss": result.last_val_loss,
        "val_acc": result.val_acc,
    }
    for key, value in metrics.items():
        if value is not None:
            client.log_metric(result.mlflow_run_id, key, float(value))
