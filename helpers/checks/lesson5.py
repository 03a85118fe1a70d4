"""Checks for lesson 5: the early-stopping comparison, analysed from MLflow.

They test behaviour: the student's functions run on small tables built here with known answers, and on the
lesson's real runs (compared with ``helpers.analysis``). None of them trains anything.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd

from helpers.checks import CheckFailed, NotAttempted, register, require, require_implemented


def _uri(namespace) -> str:
    from helpers.tracking import tracking_uri

    return tracking_uri(namespace.get("MLFLOW_TRACKING_URI"))


def _run_ids(frame: Any, what: str) -> set[str]:
    if frame is None:
        raise NotAttempted(f"{what} returns nothing yet: return what mlflow.search_runs returns")
    if not isinstance(frame, pd.DataFrame) or "run_id" not in frame.columns:
        raise CheckFailed(f"{what} returned a {type(frame).__name__} without a run_id column: return the "
                          "DataFrame from mlflow.search_runs(...)")
    return set(frame["run_id"])


@register("5.1")
def query_the_runs(namespace) -> str:
    """``query_runs(experiment, sweep)``: this sweep's FINISHED runs only, from ``mlflow.search_runs``.

    The check adds two decoy runs to the experiment (one of another sweep, one FAILED run of this sweep), queries,
    and deletes the decoys again.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers.analysis import TAG, runs_table

    query_runs, experiment, sweep = require(namespace, "query_runs", "EXPERIMENT", "SWEEP")
    require_implemented(query_runs)
    uri = _uri(namespace)
    expected = set(runs_table(experiment, uri, sweep=sweep)["run_id"])
    if not expected:
        raise CheckFailed(f"the experiment {experiment!r} has no finished runs of sweep {sweep}: run the training "
                          "cells above first")
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    other_sweep = f"{sweep}-decoy"
    decoys = []
    try:
        for tags, status in [({"sweep": other_sweep}, "FINISHED"), ({"sweep": sweep}, "FAILED")]:
            run = client.create_run(experiment_id, run_name="check-5.1-decoy",
                                    tags={TAG + "lesson": "5", **{TAG + k: v for k, v in tags.items()}})
            client.set_terminated(run.info.run_id, status)
            decoys.append(run.info.run_id)
        mlflow.set_tracking_uri(uri)
        got = _run_ids(query_runs(experiment, sweep), "query_runs")
        other = _run_ids(query_runs(experiment, other_sweep), "query_runs")
    finally:
        for run_id in decoys:
            client.delete_run(run_id)
    finished_other, failed_same = decoys
    if failed_same in got:
        raise CheckFailed("a FAILED run of the sweep came back: keep only runs with attributes.status = 'FINISHED' "
                          "(a crashed job's run must not enter the analysis)")
    if finished_other in got:
        raise CheckFailed("a run of another sweep came back: filter on the sweep tag, e.g. "
                          f"\"tags.`{TAG}sweep` = '...'\"")
    if got != expected:
        raise CheckFailed(f"{len(got)} runs came back, the sweep has {len(expected)} finished runs: search the "
                          "experiment by name (experiment_names=[...]) and filter on the sweep tag and the status")
    if other != {finished_other}:
        raise CheckFailed("query_runs(experiment, another_sweep) did not return just that sweep's run: use the "
                          "sweep argument, not the SWEEP variable")
    return f"{len(got)} finished runs of this sweep, none of another sweep, no failed run"


def _speedup_cases() -> list[pd.DataFrame]:
    """Small tables with known answers: unsorted rows, a non-default index, a super-linear point."""
    cases = [
        ([1, 2, 4, 8], [100.0, 60.0, 35.0, 25.0]),
        ([2, 1], [30.0, 24.0]),  # slower on 2 devices: speedup below 1
        ([4, 1, 2], [10.0, 50.0, 20.0]),  # super-linear at 4
    ]
    tables = []
    shuffle = random.Random(5)
    for devices, times in cases:
        rows = list(zip(devices, times))
        shuffle.shuffle(rows)
        tables.append(pd.DataFrame({"devices": [d for d, _ in rows], "wall_time_s": [t for _, t in rows],
                                    "run_id": [f"run-{d}" for d, _ in rows]},
                                   index=[10 + 3 * i for i in range(len(rows))]))
    return tables


@register("5.2")
def speedup_and_efficiency(namespace) -> str:
    """``speedup_efficiency(table)``: speedup = time(1 device) / time(n), efficiency = speedup / n, per row."""
    from helpers.analysis import ONE_PASS, speedup_table

    speedup_efficiency = require(namespace, "speedup_efficiency")
    require_implemented(speedup_efficiency)
    for table in _speedup_cases():
        original = table.copy()
        got = speedup_efficiency(table.copy())
        if got is None:
            raise NotAttempted("speedup_efficiency returns nothing yet: return the table with the new columns")
        if not isinstance(got, pd.DataFrame) or not {"speedup", "efficiency"} <= set(got.columns):
            raise CheckFailed("return a DataFrame with the columns speedup and efficiency added")
        base = float(original.loc[original["devices"] == 1, "wall_time_s"].iloc[0])
        for row in got.itertuples():
            n, time_s = int(row.devices), float(row.wall_time_s)
            if not math.isclose(row.speedup, base / time_s, rel_tol=1e-9):
                raise CheckFailed(f"devices={n}: speedup {row.speedup!r}, expected {base / time_s:.4g} = time on 1 "
                                  f"device ({base:g} s) / time on {n} ({time_s:g} s): take the 1-device row's "
                                  "time, not the first row's")
            if not math.isclose(row.efficiency, base / time_s / n, rel_tol=1e-9):
                raise CheckFailed(f"devices={n}: efficiency {row.efficiency!r}, expected speedup / devices = "
                                  f"{base / time_s / n:.4g}")
        if len(got) != len(original):
            raise CheckFailed(f"{len(got)} rows came back for {len(original)}: keep one row per run")
    table = namespace.get("table")
    message = "speedup and efficiency right on 3 made-up tables"
    if isinstance(table, pd.DataFrame) and "epoch_mode" in table and not table.empty:
        right = table[table["epoch_mode"] == ONE_PASS]
        got = speedup_efficiency(right.copy()).set_index("run_id")
        expected = speedup_table(right, group=None).set_index("run_id")
        for run_id, row in expected.iterrows():
            if not math.isclose(got.loc[run_id, "speedup"], row["speedup"], rel_tol=1e-9):
                raise CheckFailed(f"on the lesson's runs, run {run_id}: speedup {got.loc[run_id, 'speedup']!r}, "
                                  f"expected {row['speedup']:.4g}")
        message += f" and on the lesson's {len(right)} runs"
    return message


_STOP_CASES = [
    # (val_losses, min_delta, patience, stopping_threshold, max_epochs, reason, why)
    ([0.9, 0.7, 0.5, 0.45], 0.01, 10, 0.5, 20, "stopping_threshold",
     "val_loss 0.45 < stopping_threshold 0.5 at the last epoch"),
    ([0.9, 0.7, 0.6], 0.01, 2, None, 3, "max_epochs", "it improved every epoch and reached max_epochs"),
    ([0.9, 0.895, 0.89], 0.01, 2, None, 10, "patience",
     "changes of 0.005 are not improvements with min_delta 0.01: 2 epochs without improvement = patience 2"),
    ([0.9, 0.8, 0.85, 0.79, 0.6, 0.61, 0.62], 0.01, 2, None, 7, "patience",
     "the wait count resets at each improvement; it reaches 2 at the last epoch"),
    ([0.9, 0.8, 0.81, 0.75], 0.01, 2, None, 4, "max_epochs",
     "one epoch without improvement, then an improvement: patience 2 never runs out"),
    ([0.9, 0.89, 0.4], 0.01, 1, 0.5, 10, "patience",
     "patience 1 ran out at epoch 1 (0.89 is not better than 0.9 by more than 0.01), before the threshold"),
    ([0.9, 0.45], 0.01, 1, 0.5, 2, "stopping_threshold",
     "at the last epoch val_loss is below the threshold: the threshold is checked before max_epochs"),
    ([0.9, 0.9, 0.45], 0.01, 5, 0.45, 3, "max_epochs", "0.45 is not *below* a threshold of 0.45"),
]


@register("5.3")
def why_runs_stopped(namespace) -> str:
    """``why_stopped(val_losses, min_delta, patience, stopping_threshold, max_epochs)``: Lightning's rule."""
    from helpers.analysis import val_loss_histories

    why_stopped = require(namespace, "why_stopped")
    require_implemented(why_stopped)
    for losses, delta, patience, threshold, max_epochs, reason, why in _STOP_CASES:
        got = why_stopped(list(losses), delta, patience, threshold, max_epochs)
        if got is None:
            raise NotAttempted("why_stopped returns nothing yet")
        if got != reason:
            raise CheckFailed(f"why_stopped({losses}, min_delta={delta}, patience={patience}, "
                              f"stopping_threshold={threshold}, max_epochs={max_epochs}) = {got!r}, expected "
                              f"{reason!r}: {why}")
    table = namespace.get("table")
    if not isinstance(table, pd.DataFrame) or table.empty:
        return f"right on {len(_STOP_CASES)} made-up histories"
    histories = val_loss_histories(table, _uri(namespace))
    for row in table.itertuples():
        threshold = None if math.isnan(row.stopping_threshold) else row.stopping_threshold
        got = why_stopped(histories[row.run_id], row.min_delta, int(row.patience), threshold, int(row.max_epochs))
        if got != row.logged_stop_reason:
            raise CheckFailed(f"run {row.run_id} ({row.devices} devices, {row.epoch_mode}): {got!r} from its "
                              f"val_loss history {[round(v, 4) for v in histories[row.run_id]]}, but Lightning "
                              f"reported {row.logged_stop_reason!r}")
    return f"right on {len(_STOP_CASES)} made-up histories and on the lesson's {len(table)} runs"


@register("5.4")
def rows_read_per_epoch(namespace) -> str:
    """``rows_per_epoch(rows, batch_size, devices, epoch_mode)``: training rows all devices read in one epoch."""
    import math as m

    rows_per_epoch = require(namespace, "rows_per_epoch")
    require_implemented(rows_per_epoch)
    for rows, batch, devices in [(1438, 32, 1), (1438, 32, 2), (3670, 64, 4), (3670, 64, 8), (100, 10, 3)]:
        right = m.ceil(rows / (batch * devices)) * batch * devices
        wrong = m.ceil(rows / batch) * batch * devices * devices
        for mode, expected, hint in [
            ("one_pass", right, "steps = ceil(rows / (batch_size x devices)), each device reads batch_size rows a "
                                "step"),
            ("fixed_steps", wrong, "steps stay at the 1-device ceil(rows / batch_size) while each device reads "
                                   "batch_size x devices rows a step"),
        ]:
            got = rows_per_epoch(rows, batch, devices, mode)
            if got is None:
                raise NotAttempted("rows_per_epoch returns nothing yet")
            if got != expected:
                raise CheckFailed(f"rows_per_epoch({rows}, {batch}, {devices}, {mode!r}) = {got!r}, expected "
                                  f"{expected}: {hint}")
    passes = m.ceil(3670 / 64) * 64 * 8 * 8 / 3670
    return f"right: one 'epoch' on 8 devices the original way (3,670 images, batch 64) is {passes:.0f} passes"
