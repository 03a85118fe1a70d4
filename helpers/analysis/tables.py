"""Lesson 5's runs from MLflow as a table, and speedup and efficiency computed from it.

Nothing here reads variables of the training code: every number comes back through ``mlflow.search_runs``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from helpers import CourseInputError
from helpers.analysis.schema import METRICS, TAG, TAGS

__all__ = ["medians_by_devices", "runs_table", "speedup_table"]


def _convert(value: Any, kind: type) -> Any:
    """A tag string as ``kind``; empty or missing -> None (NaN for floats)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value in ("", "None"):
        return math.nan if kind is float else None
    return kind(float(value)) if kind is int else kind(value)


def _search(experiment: str, filters: list[str]) -> pd.DataFrame:
    """``mlflow.search_runs`` of ``experiment`` with all ``filters``; empty when the experiment does not exist."""
    import mlflow

    if mlflow.get_experiment_by_name(experiment) is None:
        return pd.DataFrame()
    where = " and ".join(filters)
    return mlflow.search_runs(experiment_names=[experiment], filter_string=where, output_format="pandas")


def _typed(raw: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``mlflow.search_runs`` as the runs table: tags without their prefix, typed; the metrics."""
    table = pd.DataFrame(
        {"run_id": raw["run_id"], "run_name": raw.get("tags.mlflow.runName"), "start_time": raw["start_time"]}
    )
    for suffix, (column, kind) in TAGS.items():
        values = raw.get(f"tags.{TAG}{suffix}", pd.Series([None] * len(raw), index=raw.index))
        table[column] = [_convert(value, kind) for value in values]
    for metric in METRICS:
        table[metric] = raw.get(f"metrics.{metric}", pd.Series([math.nan] * len(raw), index=raw.index)).astype(float)
    table["epochs_run"] = table["epochs_run"].astype("Int64")
    table["stopping_threshold"] = table["stopping_threshold"].astype(float)
    table["min_delta"] = table["min_delta"].astype(float)
    return table


def runs_table(
    experiment: str, uri: str | None = None, sweep: str | None = None, filter_string: str = ""
) -> pd.DataFrame:
    """The lesson's runs of ``experiment`` from ``mlflow.search_runs``, one row per finished run, typed columns.

    Args:
        experiment: the MLflow experiment's name.
        uri: the tracking URI; default: the one set in this process, else the course's local store.
        sweep: keep only the runs of this comparison (the ``course.sweep`` tag).
        filter_string: an MLflow filter added to the others.

    Returns:
        Columns ``run_id``, ``run_name``, ``start_time``; the ``course.*`` tags without the prefix (see
        :data:`helpers.analysis.schema.TAGS`: ``devices``, ``epoch_mode``, ``batch_size``, ``min_delta``,
        ``patience``, ``stopping_threshold`` (NaN when none), ... and ``logged_stop_reason``, the reason
        Lightning reported); the metrics ``wall_time_s``, ``job_time_s``, ``epochs_run``, ``best_val_loss``,
        ``last_val_loss``, ``val_acc``. Sorted by epoch mode, then devices, then start time. An experiment
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
    raw = _search(experiment, filters)
    columns = ["run_id", "run_name", "start_time"] + [column for column, _ in TAGS.values()] + list(METRICS)
    if raw.empty:
        return pd.DataFrame(columns=columns)
    return _typed(raw).sort_values(["epoch_mode", "devices", "start_time"], ignore_index=True)[columns]


def _add_speedup(out: pd.DataFrame, time_column: str, baseline_time: float | None, group: str | None) -> None:
    """Add ``speedup`` and ``efficiency`` to ``out``, each ``group`` against its own baseline."""
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


def _add_passes(out: pd.DataFrame, time_column: str) -> None:
    """Add ``time_per_epoch_s`` and, when ``out`` has the batch columns, ``data_passes`` and ``time_per_pass_s``."""
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


def speedup_table(
    table: pd.DataFrame,
    time_column: str = "wall_time_s",
    baseline_time: float | None = None,
    group: str | None = "epoch_mode",
) -> pd.DataFrame:
    """``table`` with ``speedup`` = time on 1 device / time on n, and ``efficiency`` = speedup / n, added.

    Args:
        table: a :func:`runs_table` (at least ``devices`` and ``time_column``).
        time_column: the time to compare, e.g. ``"wall_time_s"`` (the fit) or ``"job_time_s"`` (the whole job).
        baseline_time: a 1-device time to compare against; default: within each ``group``, the median time of
            the runs at the smallest device count d0, with ``efficiency`` = speedup x d0 / n (d0 = 1 gives
            speedup / n).
        group: the column whose values get a baseline each (default: each epoch mode); ``None``: the whole table.

    Returns:
        A copy of ``table`` with ``speedup``, ``efficiency``, ``time_per_epoch_s`` and, when the table has the
        batch columns, ``data_passes`` (training rows read / rows) and ``time_per_pass_s``.

    Raises:
        CourseInputError: the table has no ``devices`` or no ``time_column`` column.
    """
    missing = {"devices", time_column} - set(table.columns)
    if missing:
        raise CourseInputError(f"the table has no column(s) {sorted(missing)}: pass runs_table(...)'s table.")
    out = table.copy()
    out["devices"] = out["devices"].astype(int)
    out[time_column] = out[time_column].astype(float)
    _add_speedup(out, time_column, baseline_time, group)
    _add_passes(out, time_column)
    return out


MEDIANS = ("wall_time_s", "job_time_s", "time_per_epoch_s", "speedup", "efficiency", "epochs_run", "best_val_loss")


def medians_by_devices(speedups: pd.DataFrame) -> pd.DataFrame:
    """One row per device count of a :func:`speedup_table` of one epoch mode, over its repeated runs (seeds).

    Returns:
        ``devices``, ``runs`` (how many), ``by_patience`` (how many early stopping's patience ended), the median
        of each of :data:`MEDIANS` the table has, and the runs' ``min_delta`` and ``patience``.

    Raises:
        CourseInputError: the table is not a ``speedup_table`` (no ``devices``, ``speedup`` or ``epochs_run``).
    """
    missing = {"devices", "speedup", "epochs_run"} - set(speedups.columns)
    if missing:
        raise CourseInputError(f"the table has no column(s) {sorted(missing)}: pass speedup_table(...)'s table.")
    runs = speedups.astype({"epochs_run": float})
    grouped = runs.groupby("devices", sort=True)
    out = grouped[[column for column in MEDIANS if column in runs.columns]].median()
    out.insert(0, "runs", grouped.size())
    reasons = runs["logged_stop_reason"] if "logged_stop_reason" in runs.columns else pd.Series("", index=runs.index)
    out.insert(1, "by_patience", (reasons == "patience").groupby(runs["devices"]).sum().astype(int))
    for setting in ("min_delta", "patience"):
        if setting in runs.columns:
            out[setting] = grouped[setting].first()
    return out.reset_index()
