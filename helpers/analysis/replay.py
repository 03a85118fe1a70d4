"""Why a run stopped: Lightning's early stopping replayed on the run's ``val_loss`` history from MLflow."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from helpers import CourseInputError

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
