"""Lesson 5: early stopping at several device counts, compared from MLflow.

Three parts:

- **Running the comparison** (:func:`run_training`): the same model and data trained with Lightning's
  ``EarlyStopping`` through ``HorovodRunner`` at a given device count (``np=-N`` on this machine, ``np=N`` on
  Spark). Rank 0 records one MLflow run (``helpers.training.train``); the driver then tags it with what the
  comparison needs (device count, launcher, batch size, early-stopping settings, the sweep it belongs to) and
  logs its summary metrics (epochs until stop, best and final ``val_loss``, the job's time including start-up).
- **The epoch-size pitfall** (:class:`FixedStepsDataModule`): the original notebooks grew the per-device batch
  with the device count and kept the steps per epoch at the 1-device value, so one "epoch" on n devices was
  about n x n passes over the data. ``epoch_mode="fixed_steps"`` reproduces that on purpose; the right way,
  ``"one_pass"``, keeps the per-device batch and divides the steps (``PetastormDataModule``).
- **Analysis from MLflow only** (:func:`runs_table`, :func:`speedup_table`, :func:`stop_reason`,
  :func:`stop_reasons`, the plots, :func:`claim_report`): nothing here reads variables of the training code;
  every number comes back through ``mlflow.search_runs`` and the runs' metric histories.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from helpers import CourseInputError
from helpers.datamodule import PetastormDataModule
from helpers.devices import check_flag
from helpers.training import steps_per_epoch

__all__ = [
    "EPOCH_MODES",
    "FIXED_STEPS",
    "ONE_PASS",
    "STOP_REASONS",
    "TAG",
    "FixedStepsDataModule",
    "claim_report",
    "new_sweep_id",
    "plot_pitfall",
    "plot_scaling",
    "plot_val_loss",
    "pitfall_report",
    "plan_sweep",
    "record_run",
    "run_training",
    "runs_table",
    "speedup_table",
    "stop_reason",
    "stop_reasons",
    "val_loss_histories",
]

ONE_PASS = "one_pass"  # the right way: an epoch is one pass over the data whatever the device count
FIXED_STEPS = "fixed_steps"  # the original notebooks' way: per-device batch x n, steps per epoch fixed
EPOCH_MODES = (ONE_PASS, FIXED_STEPS)
STOP_REASONS = ("stopping_threshold", "patience", "max_epochs", "non_finite_metric")

TAG = "course."  # prefix of the tags this module sets on a run
_TAGS = {  # tag suffix -> (table column, type)
    "lesson": ("lesson", str),
    "sweep": ("sweep", str),
    "devices": ("devices", int),
    "launcher": ("launcher", str),
    "epoch_mode": ("epoch_mode", str),
    "batch_size": ("batch_size", int),
    "global_batch_size": ("global_batch_size", int),
    "steps_per_epoch": ("steps_per_epoch", int),
    "train_rows": ("train_rows", int),
    "min_delta": ("min_delta", float),
    "patience": ("patience", int),
    "stopping_threshold": ("stopping_threshold", float),
    "max_epochs": ("max_epochs", int),
    "stopped_reason": ("logged_stop_reason", str),
}
_METRICS = ("wall_time_s", "job_time_s", "epochs_run", "best_val_loss", "last_val_loss", "val_acc")


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
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


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
    run_name = f"{epoch_mode}-devices{devices}-{sweep}"
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


# --- the table ------------------------------------------------------------------------------------------------


def _convert(value: Any, kind: type) -> Any:
    """A tag string as ``kind``; empty or missing -> None (NaN for floats)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value in ("", "None"):
        return math.nan if kind is float else None
    return kind(float(value)) if kind is int else kind(value)


def runs_table(
    experiment: str, uri: str | None = None, sweep: str | None = None, filter_string: str = ""
) -> pd.DataFrame:
    """The lesson's runs of ``experiment`` from ``mlflow.search_runs``, one row per finished run, typed columns.

    Columns: ``run_id``, ``run_name``, ``start_time``, the ``course.*`` tags without the prefix (``devices``,
    ``launcher``, ``epoch_mode``, ``batch_size``, ``global_batch_size``, ``steps_per_epoch``, ``train_rows``,
    ``min_delta``, ``patience``, ``stopping_threshold`` (NaN when none), ``max_epochs``, ``sweep``, and
    ``logged_stop_reason``: the reason Lightning reported), and the metrics ``wall_time_s``, ``job_time_s``,
    ``epochs_run``, ``best_val_loss``, ``last_val_loss``, ``val_acc``. ``sweep`` keeps one comparison's runs;
    ``filter_string`` adds an MLflow filter. Sorted by epoch mode, then devices, then start time. An experiment
    without such runs gives an empty table with these columns.
    """
    import mlflow

    from helpers.tracking import resolve_uri

    mlflow.set_tracking_uri(resolve_uri(uri))
    filters = [f"tags.`{TAG}lesson` = '5'", "attributes.status = 'FINISHED'"]
    if sweep:
        filters.append(f"tags.`{TAG}sweep` = '{sweep}'")
    if filter_string:
        filters.append(filter_string)
    if mlflow.get_experiment_by_name(experiment) is None:
        raw = pd.DataFrame()
    else:
        raw = mlflow.search_runs(
            experiment_names=[experiment], filter_string=" and ".join(filters), output_format="pandas"
        )
    columns = ["run_id", "run_name", "start_time"] + [column for column, _ in _TAGS.values()] + list(_METRICS)
    if raw.empty:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(
        {"run_id": raw["run_id"], "run_name": raw.get("tags.mlflow.runName"), "start_time": raw["start_time"]}
    )
    for suffix, (column, kind) in _TAGS.items():
        values = raw.get(f"tags.{TAG}{suffix}", pd.Series([None] * len(raw), index=raw.index))
        table[column] = [_convert(value, kind) for value in values]
    for metric in _METRICS:
        table[metric] = raw.get(f"metrics.{metric}", pd.Series([math.nan] * len(raw), index=raw.index)).astype(float)
    table["epochs_run"] = table["epochs_run"].astype("Int64")
    table["stopping_threshold"] = table["stopping_threshold"].astype(float)
    table["min_delta"] = table["min_delta"].astype(float)
    return table.sort_values(["epoch_mode", "devices", "start_time"], ignore_index=True)[columns]


def speedup_table(
    table: pd.DataFrame,
    time_column: str = "wall_time_s",
    baseline_time: float | None = None,
    group: str | None = "epoch_mode",
) -> pd.DataFrame:
    """``table`` with ``speedup`` = time on 1 device / time on n, and ``efficiency`` = speedup / n, added.

    The baseline is ``baseline_time`` when given (taken to be a 1-device time), else, within each ``group``
    (default: each epoch mode; ``None``: the whole table), the median time of the runs at the smallest device
    count d0, with ``efficiency`` = speedup x d0 / n (so d0 = 1 gives speedup / n). Also adds
    ``time_per_epoch_s`` and, when the table has the batch columns, ``data_passes`` (training rows read / rows)
    and ``time_per_pass_s``. Raises ``CourseInputError`` for a table without ``devices`` or ``time_column``.
    """
    missing = {"devices", time_column} - set(table.columns)
    if missing:
        raise CourseInputError(f"the table has no column(s) {sorted(missing)}: pass runs_table(...)'s table.")
    out = table.copy()
    out["devices"] = out["devices"].astype(int)
    out[time_column] = out[time_column].astype(float)
    groups = (
        [out.index]
        if group is None or group not in out.columns
        else [rows.index for _, rows in out.groupby(group, sort=False)]
    )
    out["speedup"] = math.nan
    out["efficiency"] = math.nan
    for index in groups:
        rows = out.loc[index]
        if baseline_time is not None:
            base_devices, base_time = 1, float(baseline_time)
        else:
            base_devices = int(rows["devices"].min())
            base_time = float(rows.loc[rows["devices"] == base_devices, time_column].median())
        out.loc[index, "speedup"] = base_time / rows[time_column]
        out.loc[index, "efficiency"] = out.loc[index, "speedup"] * base_devices / rows["devices"]
    if "epochs_run" in out.columns:
        out["time_per_epoch_s"] = out[time_column] / out["epochs_run"].astype(float)
    if {"epochs_run", "steps_per_epoch", "batch_size", "train_rows"} <= set(out.columns):
        read = (
            out["epochs_run"].astype(float)
            * out["steps_per_epoch"].astype(float)
            * out["batch_size"].astype(float)
            * out["devices"]
        )
        out["data_passes"] = read / out["train_rows"].astype(float)
        out["time_per_pass_s"] = out[time_column] / out["data_passes"]
    return out


# --- why a run stopped ----------------------------------------------------------------------------------------


def stop_reason(
    val_losses: Sequence[float],
    min_delta: float = 0.01,
    patience: int = 10,
    stopping_threshold: float | None = None,
    max_epochs: int | None = None,
) -> tuple[str, int]:
    """Replay Lightning's ``EarlyStopping(monitor="val_loss", mode="min")`` on a run's per-epoch ``val_losses``.

    Returns ``(reason, epoch)``: the first epoch (0-based) after whose validation a rule fired, and which:
    ``"non_finite_metric"`` (NaN or inf), ``"stopping_threshold"`` (val_loss < threshold; checked before
    patience), ``"patience"`` (``patience`` epochs in a row without improving on the best by more than
    ``min_delta``); ``"max_epochs"`` (the last epoch) when none fired and the run reached ``max_epochs`` (or
    ``max_epochs`` is None); ``"unknown"`` when none fired and the history ends early (an interrupted run).
    """
    if not isinstance(patience, int) or patience < 0:
        raise CourseInputError(f"patience={patience!r}: pass a non-negative integer.")
    delta = abs(float(min_delta))
    threshold = (
        None if stopping_threshold is None or math.isnan(float(stopping_threshold)) else float(stopping_threshold)
    )
    best, wait = math.inf, 0
    for epoch, value in enumerate(float(v) for v in val_losses):
        if not math.isfinite(value):
            return "non_finite_metric", epoch
        if threshold is not None and value < threshold:
            return "stopping_threshold", epoch
        if value + delta < best:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return "patience", epoch
    last = len(val_losses) - 1
    if max_epochs is None or len(val_losses) >= max_epochs:
        return "max_epochs", last
    return "unknown", last


def val_loss_histories(table: pd.DataFrame, uri: str | None = None) -> dict[str, list[float]]:
    """Each run's per-epoch ``val_loss`` from its MLflow metric history, by run id."""
    from helpers.tracking import metric_history

    return {run_id: [value for _, value in metric_history(run_id, "val_loss", uri)] for run_id in table["run_id"]}


def stop_reasons(table: pd.DataFrame, uri: str | None = None) -> pd.DataFrame:
    """Why each run of ``table`` stopped, replayed from its val_loss history and its tagged settings.

    Columns: ``run_id``, ``devices``, ``epoch_mode``, ``epochs_run``, ``stop_epoch``, ``stop_reason`` (replayed
    with :func:`stop_reason`), ``logged_stop_reason`` (what Lightning reported at the time) and ``agrees``.
    """
    histories = val_loss_histories(table, uri)
    rows = []
    for row in table.itertuples(index=False):
        reason, epoch = stop_reason(
            histories[row.run_id], row.min_delta, int(row.patience), row.stopping_threshold, int(row.max_epochs)
        )
        rows.append(
            {
                "run_id": row.run_id,
                "devices": row.devices,
                "epoch_mode": row.epoch_mode,
                "epochs_run": row.epochs_run,
                "stop_epoch": epoch,
                "stop_reason": reason,
                "logged_stop_reason": row.logged_stop_reason,
                "agrees": reason == row.logged_stop_reason,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "run_id",
            "devices",
            "epoch_mode",
            "epochs_run",
            "stop_epoch",
            "stop_reason",
            "logged_stop_reason",
            "agrees",
        ],
    )


# --- plots ----------------------------------------------------------------------------------------------------


def _label(row) -> str:
    return f"{row['devices']} dev, {row['epoch_mode']}" if "epoch_mode" in row else f"{row['devices']} dev"


def plot_scaling(speedups: pd.DataFrame, time_column: str = "wall_time_s", title: str = ""):
    """Wall time (left) and speedup (right) against devices from a :func:`speedup_table`, one line per epoch
    mode, with the linear ideal dashed: time on 1 device / n, and speedup = n."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    if "epoch_mode" in speedups.columns:
        groups = list(speedups.groupby("epoch_mode", sort=False))
    else:
        groups = [("", speedups)]
    counts = sorted({1, *speedups["devices"].astype(int)})
    ones = speedups[speedups["devices"] == 1]
    for name, rows in groups:
        if not ones.empty and not (rows["devices"] == 1).any():
            rows = pd.concat([ones.iloc[[0]], rows])  # the same 1-device run is this mode's baseline too
        rows = rows.sort_values("devices")
        label = f"measured {name}".strip()
        left.plot(rows["devices"], rows[time_column], marker="o", label=label)
        right.plot(rows["devices"], rows["speedup"], marker="o", label=label)
    # the baseline time every speedup was computed against: time x speedup, from any row
    first = speedups.iloc[0]
    base_time = float(first[time_column]) * float(first["speedup"])
    left.plot(counts, [base_time / n for n in counts], linestyle="--", color="grey", label="linear ideal: t1 / n")
    right.plot(counts, counts, linestyle="--", color="grey", label="linear ideal: speedup = n")
    left.set(xlabel="devices", ylabel=f"{time_column} (s)", title="Training time")
    right.set(xlabel="devices", ylabel="speedup", title="Speedup against 1 device")
    for ax in (left, right):
        ax.set_xticks(counts)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_val_loss(table: pd.DataFrame, uri: str | None = None, title: str = "val_loss per epoch"):
    """Each run's val_loss curve from MLflow, its stop point marked with an x (labelled with the reason), its
    best epoch with a circle, and the stopping threshold (if any) as a dotted line."""
    histories = val_loss_histories(table, uri)
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for row in table.to_dict("records"):
        values = histories[row["run_id"]]
        if not values:
            continue
        reason, stop = stop_reason(
            values, row["min_delta"], int(row["patience"]), row["stopping_threshold"], int(row["max_epochs"])
        )
        (line,) = ax.plot(range(len(values)), values, marker=".", label=f"{_label(row)}: {reason}")
        ax.plot([stop], [values[stop]], marker="x", markersize=11, markeredgewidth=2.5, color=line.get_color())
        best = min(range(len(values)), key=values.__getitem__)
        ax.plot([best], [values[best]], marker="o", markersize=9, fillstyle="none", color=line.get_color())
    thresholds = table["stopping_threshold"].dropna().unique() if "stopping_threshold" in table else []
    for threshold in thresholds:
        ax.axhline(threshold, linestyle=":", color="grey", label="stopping_threshold")
    ax.set(xlabel="epoch", ylabel="val_loss", title=f"{title} (x: stop, o: best)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_pitfall(speedups: pd.DataFrame, uri: str | None = None):
    """val_loss of every run against epochs (left) and against passes over the training data (right)."""
    histories = val_loss_histories(speedups, uri)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.4), sharey=True)
    for row in speedups.to_dict("records"):
        values = histories[row["run_id"]]
        passes_per_epoch = row["steps_per_epoch"] * row["batch_size"] * row["devices"] / row["train_rows"]
        style = "-" if row["epoch_mode"] == ONE_PASS else "--"
        (line,) = left.plot(range(1, len(values) + 1), values, style, marker=".", label=_label(row))
        right.plot(
            [passes_per_epoch * (i + 1) for i in range(len(values))],
            values,
            style,
            marker=".",
            color=line.get_color(),
            label=_label(row),
        )
    left.set(xlabel="epochs completed", ylabel="val_loss", title="Per 'epoch': not like for like")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set(xlabel="passes over the training data", title="Per pass over the data")
    left.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- the original material's claims against this run -----------------------------------------------------------


def claim_report(speedups: pd.DataFrame, time_column: str = "wall_time_s") -> list[str]:
    """Sentences that set the original material's three claims against the measured runs of one epoch mode.

    The claims: (1) about half the training time with more resources (speedup about 2), (2) speedup below linear,
    (3) the single device stopped at a lower validation loss than the multi-device runs. Claim 1 is judged on the
    largest device count, with the time per epoch alongside (runs that stop after different numbers of epochs
    mix two effects); claim 3 treats differences within the runs' ``min_delta`` as no difference, as early
    stopping itself does. Every number in the sentences comes from ``speedups`` (a :func:`speedup_table`).
    """
    if speedups.empty or 1 not in set(speedups["devices"].astype(int)):
        return ["No 1-device run in the table: nothing to compare against."]
    rows = speedups.sort_values("devices")
    one = rows[rows["devices"] == 1].iloc[0]
    more = rows[rows["devices"] > 1]
    if more.empty:
        return ["Only 1-device runs in the table: add device counts to compare."]
    top = more.iloc[-1]
    n = int(top["devices"])
    ratio = top[time_column] / one[time_column]
    verdict = (
        "about half, as claimed"
        if 0.4 <= ratio <= 0.6
        else "faster, but not about half"
        if ratio < 1
        else "not faster at all"
    )
    lines = [
        f"Claim 1, about half the time with more resources: {n} devices took {ratio:.2f} x the 1-device time "
        f"({top[time_column]:.1f} s against {one[time_column]:.1f} s, speedup {top['speedup']:.2f}): {verdict}."
    ]
    if "time_per_epoch_s" in rows.columns:
        per_epoch = one["time_per_epoch_s"] / top["time_per_epoch_s"]
        lines.append(
            f"  Per epoch: {top['time_per_epoch_s']:.1f} s on {n} devices against {one['time_per_epoch_s']:.1f} s "
            f"on 1 (speedup per epoch {per_epoch:.2f}); epochs until stop: {int(top['epochs_run'])} against "
            f"{int(one['epochs_run'])}"
            + (
                ", so part of the difference in total time is when the runs stopped, not how fast they computed."
                if int(top["epochs_run"]) != int(one["epochs_run"])
                else "."
            )
        )
    effs = ", ".join(f"{int(r.devices)} devices {r.efficiency:.0%}" for r in more.itertuples())
    below = bool((more["efficiency"] < 1).all())
    lines.append(
        f"Claim 2, sub-linear speedup: parallel efficiency {effs}: "
        + (
            "below linear at every device count, as claimed."
            if below
            else "at or above linear at some device count, against the claim."
        )
    )
    tolerance = float(one["min_delta"]) if "min_delta" in rows.columns else 0.0
    multi_best = more["best_val_loss"].astype(float)
    diffs = multi_best - float(one["best_val_loss"])
    if (diffs > tolerance).all():
        verdict = "lower by more than min_delta, as claimed"
    elif (diffs.abs() <= tolerance).all():
        verdict = f"the same within min_delta ({tolerance:g}), which early stopping itself counts as no change"
    elif (diffs < -tolerance).all():
        verdict = "higher by more than min_delta, against the claim"
    else:
        verdict = "neither lower nor higher at every device count"
    lines.append(
        f"Claim 3, the single device stops at a lower loss: best val_loss {one['best_val_loss']:.3f} on 1 device "
        f"against {', '.join(f'{v:.3f}' for v in multi_best)} on "
        f"{', '.join(str(int(d)) for d in more['devices'])} devices: {verdict}."
    )
    return lines


def pitfall_report(speedups: pd.DataFrame, time_column: str = "wall_time_s") -> list[str]:
    """Sentences comparing, at each device count above 1, the fixed-steps runs with the one-pass runs.

    ``speedups`` is a :func:`speedup_table` of both epoch modes against the same 1-device baseline (``group=None``);
    every number comes from it.
    """
    needed = {"epoch_mode", "devices", "data_passes", "epochs_run", "time_per_epoch_s", "speedup", "best_val_loss"}
    if not needed <= set(speedups.columns):
        raise CourseInputError(f"the table lacks {sorted(needed - set(speedups.columns))}: pass speedup_table(...).")
    lines = []
    for n in sorted(set(speedups.loc[speedups["devices"] > 1, "devices"].astype(int))):
        at_n = speedups[speedups["devices"] == n]
        right = at_n[at_n["epoch_mode"] == ONE_PASS]
        wrong = at_n[at_n["epoch_mode"] == FIXED_STEPS]
        if right.empty or wrong.empty:
            continue
        r, w = right.iloc[0], wrong.iloc[0]
        per_epoch_r = r["data_passes"] / r["epochs_run"]
        per_epoch_w = w["data_passes"] / w["epochs_run"]
        lines.append(
            f"{n} devices: one 'epoch' read {per_epoch_w:.1f} passes over the data the original way against "
            f"{per_epoch_r:.1f} the right way ({per_epoch_w / per_epoch_r:.1f} x). It stopped after "
            f"{int(w['epochs_run'])} epoch(s) ({w['data_passes']:.1f} passes, best val_loss {w['best_val_loss']:.3f}) "
            f"against {int(r['epochs_run'])} epoch(s) ({r['data_passes']:.1f} passes, best val_loss "
            f"{r['best_val_loss']:.3f}); time per epoch {w['time_per_epoch_s']:.1f} s against "
            f"{r['time_per_epoch_s']:.1f} s; 'speedup' {w['speedup']:.2f} against {r['speedup']:.2f}."
        )
    if not lines:
        return ["No device count has runs in both epoch modes: nothing to compare."]
    return lines
