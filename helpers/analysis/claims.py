"""The original material's claims, the epoch-size pitfall, and where 2 processes beat 1, in sentences.

Every number in the sentences comes from a :func:`helpers.analysis.tables.speedup_table` or a
:func:`helpers.analysis.step_scaling.measure_step_scaling` table, but for this machine's core count.
"""

from __future__ import annotations

import os

import pandas as pd

from helpers import CourseInputError
from helpers.analysis.schema import FIXED_STEPS, ONE_PASS
from helpers.analysis.step_scaling import STEP_COLUMNS
from helpers.analysis.tables import medians_by_devices

__all__ = ["claim_report", "pitfall_report", "step_scaling_report"]


def _claim_half_time(one: pd.Series, top: pd.Series, time_column: str, per_epoch: bool) -> list[str]:
    """Claim 1, about half the time with more resources, judged on the largest device count ``top``; with the
    time per epoch alongside when ``per_epoch`` (runs that stop after different numbers of epochs mix two
    effects)."""
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
    if per_epoch:
        speedup = one["time_per_epoch_s"] / top["time_per_epoch_s"]
        lines.append(
            f"  Per epoch: {top['time_per_epoch_s']:.1f} s on {n} devices against {one['time_per_epoch_s']:.1f} s "
            f"on 1 (speedup per epoch {speedup:.2f}); epochs until stop: {top['epochs_run']:g} against "
            f"{one['epochs_run']:g}"
            + (
                ", so part of the difference in total time is when the runs stopped, not how fast they computed."
                if top["epochs_run"] != one["epochs_run"]
                else "."
            )
        )
    return lines


def _claim_sub_linear(more: pd.DataFrame) -> str:
    """Claim 2, speedup below linear, judged on every device count above 1."""
    effs = ", ".join(f"{int(r.devices)} devices {r.efficiency:.0%}" for r in more.itertuples())
    below = bool((more["efficiency"] < 1).all())
    return f"Claim 2, sub-linear speedup: parallel efficiency {effs}: " + (
        "below linear at every device count, as claimed."
        if below
        else "at or above linear at some device count, against the claim."
    )


def _early_stopping(rows: pd.DataFrame) -> str:
    """What early stopping did at each device count: how many runs patience ended, and the median stop epoch."""
    runs, by_patience = int(rows["runs"].sum()), int(rows["by_patience"].sum())
    settings = (
        f" (patience {int(rows['patience'].iloc[0])}, min_delta {float(rows['min_delta'].iloc[0]):g})"
        if {"patience", "min_delta"} <= set(rows.columns)
        else ""
    )
    stops = ", ".join(f"{r.epochs_run:g} on {int(r.devices)} device(s)" for r in rows.itertuples())
    rest = "" if by_patience == runs else f"; the other {runs - by_patience} ended at max_epochs or the threshold"
    return (
        f"Early stopping{settings}: patience ended {by_patience} of {runs} runs{rest}. Epochs until it stopped "
        f"(median): {stops}."
    )


def _claim_lower_loss(one: pd.Series, more: pd.DataFrame, tolerance: float) -> str:
    """Claim 3, the single device stops at a lower loss; differences within ``tolerance`` count as none."""
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
    return (
        f"Claim 3, the single device stops at a lower loss: best val_loss {one['best_val_loss']:.3f} on 1 device "
        f"against {', '.join(f'{v:.3f}' for v in multi_best)} on "
        f"{', '.join(str(int(d)) for d in more['devices'])} devices: {verdict}."
    )


def claim_report(speedups: pd.DataFrame, time_column: str = "wall_time_s") -> list[str]:
    """Sentences on what early stopping did at each device count, and the original material's three claims against
    the measured runs of one epoch mode.

    The claims: (1) about half the training time with more resources (speedup about 2), (2) speedup below linear,
    (3) the single device stopped at a lower validation loss than the multi-device runs. Every figure is the median
    over a device count's runs (:func:`helpers.analysis.tables.medians_by_devices`: repeat the sweep with other
    seeds for more than one). Claim 1 is judged on the largest device count, with the time per epoch alongside;
    claim 3 treats differences within the runs' ``min_delta`` as no difference, as early stopping itself does.

    Args:
        speedups: a :func:`helpers.analysis.tables.speedup_table` of one epoch mode.
        time_column: the time it compared.

    Returns:
        The sentences; every number in them comes from ``speedups``. One sentence saying what is missing when
        the table has no 1-device run or no run on more devices.
    """
    if speedups.empty or 1 not in set(speedups["devices"].astype(int)):
        return ["No 1-device run in the table: nothing to compare against."]
    rows = medians_by_devices(speedups)
    one = rows[rows["devices"] == 1].iloc[0]
    more = rows[rows["devices"] > 1]
    if more.empty:
        return ["Only 1-device runs in the table: add device counts to compare."]
    tolerance = float(one["min_delta"]) if "min_delta" in rows.columns else 0.0
    repeats = int(rows["runs"].min())
    medians = [f"Medians over {repeats} runs (seeds) per device count."] if repeats > 1 else []
    return [
        *medians,
        _early_stopping(rows),
        *_claim_half_time(one, more.iloc[-1], time_column, "time_per_epoch_s" in rows.columns),
        _claim_sub_linear(more),
        _claim_lower_loss(one, more, tolerance),
    ]


def _pitfall_sentence(n: int, r: pd.Series, w: pd.Series) -> str:
    """The fixed-steps run ``w`` (wrong) against the one-pass run ``r`` (right), both on ``n`` devices."""
    per_epoch_r = r["data_passes"] / r["epochs_run"]
    per_epoch_w = w["data_passes"] / w["epochs_run"]
    return (
        f"{n} devices: one 'epoch' read {per_epoch_w:.1f} passes over the data the original way against "
        f"{per_epoch_r:.1f} the right way ({per_epoch_w / per_epoch_r:.1f} x). It stopped after "
        f"{int(w['epochs_run'])} epoch(s) ({w['data_passes']:.1f} passes, best val_loss {w['best_val_loss']:.3f}) "
        f"against {int(r['epochs_run'])} epoch(s) ({r['data_passes']:.1f} passes, best val_loss "
        f"{r['best_val_loss']:.3f}); time per epoch {w['time_per_epoch_s']:.1f} s against "
        f"{r['time_per_epoch_s']:.1f} s; 'speedup' {w['speedup']:.2f} against {r['speedup']:.2f}."
    )


def pitfall_report(speedups: pd.DataFrame) -> list[str]:
    """Sentences comparing, at each device count above 1, the fixed-steps runs with the one-pass runs.

    Args:
        speedups: a :func:`helpers.analysis.tables.speedup_table` of both epoch modes against the same 1-device
            baseline (``group=None``).

    Returns:
        One sentence per device count with runs in both modes; every number in them comes from ``speedups``.
        One sentence saying so when no device count has both.

    Raises:
        CourseInputError: the table lacks a column the sentences need (it is not a ``speedup_table``).
    """
    needed = {"epoch_mode", "devices", "data_passes", "epochs_run", "time_per_epoch_s", "speedup", "best_val_loss"}
    if not needed <= set(speedups.columns):
        raise CourseInputError(f"the table lacks {sorted(needed - set(speedups.columns))}: pass speedup_table(...).")
    lines = []
    for n in sorted(set(speedups.loc[speedups["devices"] > 1, "devices"].astype(int))):
        at_n = speedups[speedups["devices"] == n]
        right = at_n[at_n["epoch_mode"] == ONE_PASS]
        wrong = at_n[at_n["epoch_mode"] == FIXED_STEPS]
        if not right.empty and not wrong.empty:
            lines.append(_pitfall_sentence(n, right.iloc[0], wrong.iloc[0]))
    return lines or ["No device count has runs in both epoch modes: nothing to compare."]


def _batch_sentence(batch: int, one: pd.Series, two: pd.Series) -> str:
    """One global batch: the 1-process step ``one`` against the 2-process step ``two``."""
    n = int(two["processes"])
    return (
        f"Global batch {batch}: {two['step_ms']:.1f} ms per step on {n} processes against {one['step_ms']:.1f} ms on "
        f"1 (speedup {one['step_ms'] / two['step_ms']:.2f}; linear would be {one['step_ms'] / n:.1f} ms). Each "
        f"process computed for {two['compute_ms']:.1f} ms and spent {two['comm_ms']:.1f} ms in the allreduce and "
        f"waiting, {two['comm_ms'] / two['step_ms']:.0%} of its step."
    )


def _batches_compared(small: int, pair_s: tuple, large: int, pair_l: tuple) -> str:
    """The smallest global batch against the largest: compute grows, the allreduce and waiting do not."""
    (one_s, two_s), (one_l, two_l) = pair_s, pair_l
    speedup_s, speedup_l = one_s["step_ms"] / two_s["step_ms"], one_l["step_ms"] / two_l["step_ms"]
    verdict = (
        f"so at global batch {large} the {int(two_l['processes'])} processes beat 1"
        if speedup_l > 1
        else f"yet even at global batch {large} they did not beat 1 here (a machine busy with other work?)"
    )
    growth = two_l["compute_ms"] / two_s["compute_ms"]
    return (
        f"From global batch {small} to {large} the compute per step grew {growth:.1f} x, while the allreduce and "
        f"waiting went from {two_s['comm_ms']:.1f} to {two_l['comm_ms']:.1f} ms (the gradients are the same size "
        f"whatever the batch): their share of a step went from {two_s['comm_ms'] / two_s['step_ms']:.0%} to "
        f"{two_l['comm_ms'] / two_l['step_ms']:.0%} and the speedup from {speedup_s:.2f} to {speedup_l:.2f}, "
        f"{verdict}."
    )


def _sweep_medians(sweep: pd.DataFrame) -> pd.DataFrame:
    """The lesson's runs by device count (the index): how many, and the medians over them of the fit time per step
    (ms, validation included), the job's time and its start-up (s)."""
    steps = sweep["epochs_run"].astype(float) * sweep["steps_per_epoch"].astype(float)
    runs = pd.DataFrame(
        {
            "devices": sweep["devices"].astype(int),
            "step_ms": 1000 * sweep["wall_time_s"].astype(float) / steps,
            "job_time_s": sweep["job_time_s"].astype(float),
            "startup_s": sweep["job_time_s"].astype(float) - sweep["wall_time_s"].astype(float),
        }
    )
    grouped = runs.groupby("devices", sort=True)
    return grouped.median().assign(runs=grouped.size())


def _shared_cores(sweep: pd.DataFrame, n: int, gain: float) -> str:
    """Why ``n`` local processes trained ``gain`` x the images per second of one process: the sweep's 1-device run
    already had all of this machine's cores (a torch thread each), so the ``n`` shared them; empty where not every run
    trained on this machine's CPUs."""
    if "placement" not in sweep.columns or not (sweep["placement"] == "local").all():
        return ""
    cores = os.cpu_count() or 1
    had = f"their 1-device run already computed on all {cores} cores of this machine ({cores} torch threads)"
    if gain < 1:
        return (
            f": slower, as {had}, so the {n} processes split those cores instead of adding compute, and added the "
            "allreduce and waiting (the timing jobs above gave each process a core of its own)"
        )
    return f": faster, although {had}: the {n} processes used the same cores better than one process's {cores} threads"


def _sweep_sentence(sweep: pd.DataFrame) -> str:
    """The lesson's runs: the median fit time per step on 1 and on the most devices, the images per second that
    gives, why, and the job's start-up."""
    rows = _sweep_medians(sweep)
    one, top = rows.iloc[0], rows.iloc[-1]
    n, repeats = int(top.name), int(rows["runs"].min())
    gain = n * one["step_ms"] / top["step_ms"]  # the per-device batch is the same on every device count
    medians = f", medians over {repeats} runs per device count" if repeats > 1 else ""
    return (
        f"The lesson's runs above (batch {int(sweep['batch_size'].iloc[0])} per device{medians}): "
        f"{top['step_ms']:.1f} ms per step on {n} devices against {one['step_ms']:.1f} ms on 1 (fit time over "
        f"steps, validation included), so {n} devices trained {gain:.2f} x the images per second of 1"
        f"{_shared_cores(sweep, n, gain)}. {top['startup_s']:.1f} s of the {n}-device job's {top['job_time_s']:.1f} s "
        "went to starting processes and readers."
    )


def step_scaling_report(steps: pd.DataFrame, sweep: pd.DataFrame | None = None) -> list[str]:
    """Sentences on why 2 processes beat 1 at a large global batch and not at a small one.

    Args:
        steps: a :func:`helpers.analysis.step_scaling.measure_step_scaling` table with 1 and 2 processes at two or
            more global batches.
        sweep: optionally, the lesson's :func:`helpers.analysis.tables.speedup_table` of one epoch mode, for a
            sentence on its runs (medians over each device count's runs).

    Returns:
        One sentence per global batch, one comparing the smallest with the largest batch, one on start-up, and with
        ``sweep`` one on the lesson's runs; every number in them comes from the tables.

    Raises:
        CourseInputError: ``steps`` lacks a column, a 1-process row or a row on more processes for some batch.
    """
    if not set(STEP_COLUMNS) <= set(steps.columns):
        raise CourseInputError(
            f"the table lacks {sorted(set(STEP_COLUMNS) - set(steps.columns))}: pass measure_step_scaling(...)'s table."
        )
    pairs = {}
    for batch, rows in steps.groupby("global_batch"):
        one, more = rows[rows["processes"] == 1], rows[rows["processes"] > 1].sort_values("processes")
        if one.empty or more.empty:
            raise CourseInputError(f"global batch {batch} needs a 1-process row and one on more processes.")
        pairs[int(batch)] = (one.iloc[0], more.iloc[-1])
    lines = [_batch_sentence(batch, one, two) for batch, (one, two) in pairs.items()]
    lines.append(_batches_compared(*min(pairs.items()), *max(pairs.items())))
    job = steps.sort_values("processes").iloc[-1]
    lines.append(
        f"Fixed costs: the {int(job['processes'])}-process job took {job['job_s']:.1f} s, of which its steps took "
        f"{job['steps_s']:.1f} s; the rest (starting processes, imports, the rendezvous) does not shrink with "
        "more processes, so a short run gains even less than its steps do."
    )
    if sweep is not None:
        lines.append(_sweep_sentence(sweep))
    return lines
