"""Why a run stopped: Lightning's early stopping replayed on the run's ``val_loss`` history from MLflow."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from helpers.validation import whole_number

__all__ = ["STOP_REASONS", "stop_reason", "stop_reasons", "val_loss_histories"]

STOP_REASONS = ("stopping_threshold", "patience", "max_epochs", "non_finite_metric")


def stop_reason(
    val_losses: Sequence[float],
    min_delta: float = 0.01,
    patience: int = 10,
    stopping_threshold: float | None = None,
    max_epochs: int | None = None,
) -> tuple[str, int]:
    """Replay Lightning's ``EarlyStopping(monitor="val_loss", mode="min")`` on a run's per-epoch ``val_losses``.

    Args:
        val_losses: the run's ``val_loss`` after each epoch.
        min_delta: an epoch improves only when it beats the best by more than this.
        patience: epochs in a row without improvement that stop the run.
        stopping_threshold: a val_loss below it stops the run; None or NaN: no threshold.
        max_epochs: the run's epoch limit; None: the history is complete.

    Returns:
        ``(reason, epoch)``: the first epoch (0-based) after whose validation a rule fired, and which:
        ``"non_finite_metric"`` (NaN or inf), ``"stopping_threshold"`` (checked before patience),
        ``"patience"``; else the last epoch, with ``"max_epochs"`` when the run reached ``max_epochs`` (or it is
        None) and ``"unknown"`` when the history ends early (an interrupted run).

    Raises:
        CourseInputError: ``patience`` is not a whole number of at least 0.
    """
    whole_number("patience", patience, minimum=0)
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
    """Each run's per-epoch ``val_loss`` from its MLflow metric history.

    Args:
        table: a :func:`helpers.analysis.tables.runs_table` (at least ``run_id``).
        uri: the tracking URI; default: the one set in this process, else the course's local store.

    Returns:
        ``{run_id: [val_loss of epoch 0, 1, ...]}``.
    """
    from helpers.tracking import metric_history

    return {run_id: [value for _, value in metric_history(run_id, "val_loss", uri)] for run_id in table["run_id"]}


_REASON_COLUMNS = [
    "run_id",
    "devices",
    "epoch_mode",
    "epochs_run",
    "stop_epoch",
    "stop_reason",
    "logged_stop_reason",
    "agrees",
]


def stop_reasons(table: pd.DataFrame, uri: str | None = None) -> pd.DataFrame:
    """Why each run of ``table`` stopped, replayed from its val_loss history and its tagged settings.

    Args:
        table: a :func:`helpers.analysis.tables.runs_table`.
        uri: the tracking URI; default: the one set in this process, else the course's local store.

    Returns:
        Columns ``run_id``, ``devices``, ``epoch_mode``, ``epochs_run``, ``stop_epoch``, ``stop_reason``
        (replayed with :func:`stop_reason`), ``logged_stop_reason`` (what Lightning reported at the time) and
        ``agrees``.
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
    return pd.DataFrame(rows, columns=_REASON_COLUMNS)
