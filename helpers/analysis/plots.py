"""Lesson 5's figures: time and speedup against devices, val_loss curves with their stop points, the pitfall."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from helpers.analysis.replay import stop_reason, val_loss_histories
from helpers.analysis.schema import ONE_PASS

__all__ = ["plot_pitfall", "plot_scaling", "plot_val_loss"]


def _label(row) -> str:
    """A run's legend label: its device count and, if known, its epoch mode."""
    return f"{row['devices']} dev, {row['epoch_mode']}" if "epoch_mode" in row else f"{row['devices']} dev"


def _plot_measured(left, right, rows: pd.DataFrame, time_column: str, name: str) -> None:
    """One epoch mode's runs: a line through the median of each device count; with repeated runs (seeds), each run
    as an unconnected marker of the same colour."""
    medians = rows.groupby("devices", sort=True)[[time_column, "speedup"]].median()
    repeated = bool(rows["devices"].duplicated().any())
    label = f"{name} median per device count" if repeated else f"measured {name}"
    for ax, column in ((left, time_column), (right, "speedup")):
        (line,) = ax.plot(medians.index, medians[column], marker="o", label=label.strip())
        if repeated:
            ax.plot(
                rows["devices"],
                rows[column],
                linestyle="none",
                marker="x",
                color=line.get_color(),
                label=f"{name} each run (seed)".strip(),
            )


def plot_scaling(speedups: pd.DataFrame, time_column: str = "wall_time_s", title: str = ""):
    """Time (left) and speedup (right) against devices: per epoch mode, a line through each device count's median
    and, with repeated runs (seeds), each run as a marker; the linear ideal dashed.

    Args:
        speedups: a :func:`helpers.analysis.tables.speedup_table`.
        time_column: the time it compared.
        title: the figure's title; empty: none.

    Returns:
        The matplotlib figure; the ideal lines are time on 1 device / n and speedup = n.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    if "epoch_mode" in speedups.columns:
        groups = list(speedups.groupby("epoch_mode", sort=False))
    else:
        groups = [("", speedups)]
    counts = sorted({1, *speedups["devices"].astype(int)})
    ones = speedups[speedups["devices"] == 1]
    for name, rows in groups:
        if not (rows["devices"] == 1).any():
            rows = pd.concat([ones, rows])  # the same 1-device runs are this mode's baseline too
        _plot_measured(left, right, rows, time_column, name)
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
    """Each run's val_loss curve from MLflow, with its stop point, its best epoch and the stopping threshold.

    Args:
        table: a :func:`helpers.analysis.tables.runs_table`.
        uri: the tracking URI; default: the one set in this process, else the course's local store.
        title: the axes' title.

    Returns:
        The matplotlib figure: the stop point is an x (the legend gives the reason), the best epoch a circle, the
        stopping threshold (if any) a dotted line.
    """
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
    """val_loss of every run against epochs (left) and against passes over the training data (right).

    Args:
        speedups: a :func:`helpers.analysis.tables.speedup_table` of both epoch modes.
        uri: the tracking URI; default: the one set in this process, else the course's local store.

    Returns:
        The matplotlib figure: solid lines for one-pass runs, dashed for fixed-steps runs.
    """
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
