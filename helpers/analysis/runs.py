"""Lesson 5: running the comparison and recording each run in MLflow.

- **Running it** (:func:`run_training`): the same model and data trained with Lightning's ``EarlyStopping``
  through ``HorovodRunner`` at a given device count (``np=-N`` on this machine, ``np=N`` on Spark). Rank 0
  records one MLflow run (``helpers.training.train``); the driver then tags it with what the comparison needs
  (device count, launcher, batch size, early-stopping settings, the sweep it belongs to) and logs its summary
  metrics (epochs until stop, best and final ``val_loss``, the job's time including start-up).
- **The epoch-size pitfall** (:class:`FixedStepsDataModule`): the original notebooks grew the per-device batch
  with the device count and kept the steps per epoch at the 1-device value, so one "epoch" on n devices was
  about n x n passes over the data. ``epoch_mode="fixed_steps"`` reproduces that on purpose; the right way,
  ``"one_pass"``, keeps the per-device batch and divides the steps (``PetastormDataModule``).
"""

from __future__ import annotations

import time
from typing import Any

from helpers import CourseInputError
from helpers.analysis.schema import EPOCH_MODES, FIXED_STEPS, ONE_PASS, TAG
from helpers.datamodule import PetastormDataModule
from helpers.loaders import steps_per_epoch
from helpers.tracking import run_name as new_run_name
from helpers.validation import check_flag

__all__ = ["FixedStepsDataModule", "new_sweep_id", "plan_sweep", "record_run", "run_training", "train_worker"]

# --- the pitfall's data module -------------------------------------------------------------------------------


class FixedStepsDataModule(PetastormDataModule):
    """The original notebooks' epochs, on purpose: the wrong way to compare device counts.

    Each of ``device_count`` devices takes ``batch_size * device_count`` rows per step, and an epoch has the
    1-device number of steps, ``ceil(rows / batch_size)``: an "epoch" on n devices reads about n x n times the
    training data. (``PetastormDataModule`` is the right way: per-device batch fixed, steps divided by n.)
    """

    def __init__(
        self,
        train_converter,
        val_converter,
        batch_size: int = 64,
        image_size: int = 32,
        device_id: int = 0,
        device_count: int = 1,
        workers_count: int = 2,
    ) -> None:
        super().__init__(
            train_converter,
            val_converter,
            batch_size * device_count,
            image_size,
            device_id=device_id,
            device_count=device_count,
            workers_count=workers_count,
        )
        self.steps_per_epoch = steps_per_epoch(len(train_converter), batch_size, 1)


def _datamodule_class(epoch_mode: str) -> type[PetastormDataModule]:
    if epoch_mode not in EPOCH_MODES:
        raise CourseInputError(f"epoch_mode={epoch_mode!r}: use {ONE_PASS!r} (right) or {FIXED_STEPS!r} (pitfall).")
    return PetastormDataModule if epoch_mode == ONE_PASS else FixedStepsDataModule


# --- running the comparison ------------------------------------------------------------------------------------


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


def train_worker(
    train_converter,
    val_converter,
    class_count: int,
    *,
    epoch_mode: str = ONE_PASS,
    batch_size: int = 32,
    image_size: int = 16,
    learning_rate: float = 0.01,
    max_epochs: int = 6,
    early_stopping: dict[str, Any] | None = None,
    experiment: str | None = None,
    tracking_uri: str | None = None,
    accelerator: str = "cpu",
    mixed_precision: bool = False,
    seed: int = 0,
    run_name: str | None = None,
    extra_params: dict[str, Any] | None = None,
):
    """Runs in every Horovod process: this rank's shard, the lesson 2 model, ``train`` with ``HorovodStrategy``
    and the precision :func:`helpers.devices.precision_for` picks for this process's device.

    Returns ``train``'s ``TrainResult`` (with the MLflow run id on rank 0).
    """
    import horovod.torch as hvd
    import pytorch_lightning as pl

    from helpers.devices import precision_for
    from helpers.horovod_strategy import HorovodStrategy
    from helpers.model import LitClassificationModel
    from helpers.training import train

    hvd.init()
    pl.seed_everything(seed, verbose=False)
    datamodule = _datamodule_class(epoch_mode)(
        train_converter, val_converter, batch_size, image_size, device_id=hvd.rank(), device_count=hvd.size()
    )
    model = LitClassificationModel(class_count, learning_rate=learning_rate, image_size=image_size)
    return train(
        model,
        datamodule,
        max_epochs=max_epochs,
        accelerator=accelerator,
        strategy=HorovodStrategy(),
        precision=precision_for(mixed_precision, accelerator == "gpu"),
        early_stopping=early_stopping,
        mlflow_experiment=experiment,
        tracking_uri=tracking_uri,
        run_name=run_name,
        extra_params=extra_params,
        progress_bar=False,
    )


def run_training(
    devices: int,
    train_converter,
    val_converter,
    class_count: int,
    *,
    experiment: str,
    sweep: str,
    epoch_mode: str = ONE_PASS,
    launcher: str = "local",
    batch_size: int = 32,
    image_size: int = 16,
    learning_rate: float = 0.01,
    max_epochs: int = 6,
    min_delta: float = 0.01,
    patience: int = 10,
    stopping_threshold: float | None = None,
    accelerator: str = "cpu",
    mixed_precision: bool = False,
    seed: int = 0,
    tracking_uri: str | None = None,
):
    """Train once on ``devices`` Horovod processes and record it in MLflow for the comparison; return the
    ``TrainResult`` (rank 0's).

    ``launcher="local"`` runs ``HorovodRunner(np=-devices)`` on this machine (1 device goes through Horovod too,
    so every run has the same launcher); ``"spark"`` runs ``HorovodRunner(np=devices)`` on the active
    SparkSession's workers. ``batch_size`` is per device in ``"one_pass"`` mode and the 1-device batch in
    ``"fixed_steps"`` mode (which multiplies it by ``devices``). The run gets the tags ``course.*`` (sweep,
    devices, launcher, epoch_mode, batch sizes, steps per epoch, early-stopping settings, the stop reason
    Lightning reported) and the metrics ``epochs_run``, ``best_val_loss``, ``last_val_loss``, ``val_acc``,
    ``job_time_s`` (the whole job: process start-up, data readers, training), next to ``train``'s own
    ``wall_time_s`` (the fit alone) and per-epoch history. ``accelerator="gpu"`` gives every process a GPU of
    its own (checked before a local job starts: see ``HorovodRunner(use_gpu=True)``); ``mixed_precision`` trains
    with ``precision_for(True, ...)``, recorded as the run's ``precision`` parameter.
    """
    from helpers.horovod_runner import HorovodRunner

    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise CourseInputError(f"devices={devices!r}: pass a positive integer.")
    if launcher not in ("local", "spark"):
        raise CourseInputError(f"launcher={launcher!r}: use 'local' (np=-N, this machine) or 'spark' (np=N).")
    _datamodule_class(epoch_mode)
    check_flag("mixed_precision", mixed_precision)
    rows = len(train_converter)
    device_batch = batch_size * devices if epoch_mode == FIXED_STEPS else batch_size
    steps = steps_per_epoch(rows, batch_size, 1 if epoch_mode == FIXED_STEPS else devices)
    early_stopping = {"min_delta": min_delta, "patience": patience, "stopping_threshold": stopping_threshold}
    run_name = new_run_name(epoch_mode, f"devices{devices}")
    started = time.perf_counter()
    runner = HorovodRunner(np=-devices if launcher == "local" else devices, use_gpu=accelerator == "gpu")
    result = runner.run(
        train_worker,
        train_converter=train_converter,
        val_converter=val_converter,
        class_count=class_count,
        epoch_mode=epoch_mode,
        batch_size=batch_size,
        image_size=image_size,
        learning_rate=learning_rate,
        max_epochs=max_epochs,
        early_stopping=early_stopping,
        experiment=experiment,
        tracking_uri=tracking_uri,
        accelerator=accelerator,
        mixed_precision=mixed_precision,
        seed=seed,
        run_name=run_name,
        extra_params={"epoch_mode": epoch_mode, "steps_per_epoch": steps, "train_rows": rows},
    )
    job_time_s = time.perf_counter() - started
    record_run(
        result,
        sweep=sweep,
        devices=devices,
        launcher=launcher,
        epoch_mode=epoch_mode,
        batch_size=device_batch,
        steps=steps,
        train_rows=rows,
        min_delta=min_delta,
        patience=patience,
        stopping_threshold=stopping_threshold,
        max_epochs=max_epochs,
        job_time_s=job_time_s,
        tracking_uri=tracking_uri,
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
    job_time_s: float | None = None,
    tracking_uri: str | None = None,
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
        "epoch_mode": epoch_mode,
        "batch_size": batch_size,
        "global_batch_size": batch_size * devices,
        "steps_per_epoch": steps,
        "train_rows": train_rows,
        "min_delta": min_delta,
        "patience": patience,
        "stopping_threshold": stopping_threshold,
        "max_epochs": max_epochs,
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
