"""Checks for lesson 5: designing the sweep, and the early-stopping comparison analysed from MLflow.

They test behaviour: the student's functions run on inputs generated here with a fixed seed (so the verdict is the
same on every run) and known answers from ``helpers.analysis``, computed before the answer runs; then on the
lesson's real runs where the namespace has them. An answer that calls the helper doing the exercise fails
(``own_work``). None of them trains anything.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from helpers.course.checks import (
    CheckFailed,
    close,
    is_whole,
    register,
    require,
)
from helpers.course.checks.function_check import NUMBER, Case, Collected, FunctionCheck, Returns

__all__ = [
    "acceptable_reasons",
    "karp_flatt",
    "query_the_runs",
    "rows_read_per_epoch",
    "serial_fraction_measured",
    "speedup_and_efficiency",
    "sweep_is_like_for_like",
    "why_runs_stopped",
]

_EPS = 1e-6  # a loss this close to a rule's boundary may fall either side through float rounding


def _uri(namespace) -> str:
    from helpers.tracking import tracking_uri

    return tracking_uri(namespace.get("MLFLOW_TRACKING_URI"))


# --- 5.2 query the runs -----------------------------------------------------------------------------------------


_DECOY = "check-5.2-decoy"  # the run name of the runs the check adds to the experiment, and removes again


def _lessons_sweep_runs(namespace: Mapping[str, Any]) -> list[Case]:
    """The lesson's experiment, sweep and tracking URI: the case 5.2 is checked on (the sweep must have finished
    runs)."""
    from helpers.analysis import runs_table

    experiment, sweep = require(namespace, "EXPERIMENT", "SWEEP")
    uri = _uri(namespace)
    if runs_table(experiment, uri, sweep=sweep).empty:
        raise CheckFailed(
            f"the experiment {experiment!r} has no finished runs of sweep {sweep}: run the training cells above first"
        )
    return [Case((experiment, sweep, uri))]


def _with_decoys(case: tuple[str, str, str]) -> list[tuple[str, str]]:
    """Two decoys added to the experiment (a finished run of another sweep, a FAILED run of this one), MLflow
    pointed at the lesson's store; the calls: the lesson's sweep, then the other one."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers.analysis import TAG

    experiment, sweep, uri = case
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    for decoy_sweep, status in [(f"{sweep}-decoy", "FINISHED"), (sweep, "FAILED")]:
        tags = {TAG + "lesson": "5", TAG + "sweep": decoy_sweep}
        client.set_terminated(client.create_run(experiment_id, run_name=_DECOY, tags=tags).info.run_id, status)
    mlflow.set_tracking_uri(uri)
    return [(experiment, sweep), (experiment, f"{sweep}-decoy")]


def _decoys(case: tuple[str, str, str]) -> dict[str, str]:
    """The check's decoy runs in the lesson's experiment, by status."""
    from mlflow.tracking import MlflowClient

    experiment, _, uri = case
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    found = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.runName` = '{_DECOY}'")
    return {run.info.status: run.info.run_id for run in found}


def _remove_decoys(case: tuple[str, str, str], _made: list) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(case[2])
    for run_id in _decoys(case).values():
        client.delete_run(run_id)


def _run_ids(frame: Any, case: tuple) -> Any:
    """The ``run_id`` column of a returned DataFrame; anything else as it is (the judge names it)."""
    if isinstance(frame, pd.DataFrame) and "run_id" in frame.columns:
        return Collected(ids=set(frame["run_id"]))
    return frame


def _query_problem(case: tuple[str, str, str], got: list[Any], _given: list) -> str | None:
    """What is wrong with the runs the two queries returned: the lesson's sweep's finished runs only, then just
    the other sweep's run."""
    from helpers.analysis import TAG, runs_table

    experiment, sweep, uri = case
    if not all(isinstance(read, Collected) for read in got):
        wrong = next(read for read in got if not isinstance(read, Collected))
        return (
            f"returned a {type(wrong).__name__} without a run_id column: return the DataFrame from "
            "mlflow.search_runs(...)"
        )
    ids, other = (read["ids"] for read in got)
    decoys, expected = _decoys(case), set(runs_table(experiment, uri, sweep=sweep)["run_id"])
    if decoys["FAILED"] in ids:
        return (
            "returned a FAILED run of the sweep: keep only runs with attributes.status = 'FINISHED' (a crashed job's "
            "run must not enter the analysis)"
        )
    if decoys["FINISHED"] in ids:
        return f"returned a run of another sweep: filter on the sweep tag, e.g. \"tags.`{TAG}sweep` = '...'\""
    if ids != expected:
        return (
            f"returned {len(ids)} runs, the sweep has {len(expected)} finished runs: search the experiment by name "
            "(experiment_names=[...]) and filter on the sweep tag and the status"
        )
    if other != {decoys["FINISHED"]}:
        return "did not return just that sweep's run for another sweep: use the sweep argument, not the SWEEP variable"
    return None


def _sweep_said(own: list[Case]) -> str:
    from helpers.analysis import runs_table

    experiment, sweep, uri = own[0].args
    return (
        f"{len(runs_table(experiment, uri, sweep=sweep))} finished runs of this sweep, none of another, no failed run"
    )


#: ``query_runs(experiment, sweep)``: this sweep's FINISHED runs only, from ``mlflow.search_runs``, asked for the
#: lesson's sweep and for another one, with two decoys the check adds to the experiment (and removes again)
query_the_runs = register("5.2")(
    FunctionCheck(
        "5.2",
        answer="query_runs",
        fixed=[],
        from_namespace=_lessons_sweep_runs,
        calls=_with_decoys,
        collect=_run_ids,
        cleanup=_remove_decoys,
        judge=_query_problem,
        show=lambda case: f"{case[0]!r}, <this sweep, then another>",
        forbid=("helpers.analysis:runs_table",),
        hint="mlflow.search_runs(experiment_names=[experiment], filter_string=...) on the sweep tag and the status",
        passed="",
        passed_namespace=_sweep_said,
    )
)


# --- 5.3 speedup and efficiency ---------------------------------------------------------------------------------


def _draw_runs(rng: random.Random) -> tuple[pd.DataFrame]:
    """A made-up run table: 1 device plus 1-4 other counts, rows shuffled, a non-default index, times from
    sub-linear to super-linear; the columns ``run_id``, ``epoch_mode`` (``"one_pass"``), ``devices`` and
    ``wall_time_s``."""
    devices = [1, *rng.sample([2, 3, 4, 6, 8, 16, 32], rng.randint(1, 4))]
    one, table = rng.uniform(20.0, 500.0), rng.randrange(1000)
    rows = [(n, one if n == 1 else one / (n * rng.uniform(0.3, 1.2))) for n in devices]
    rng.shuffle(rows)
    return (
        pd.DataFrame(
            {
                "run_id": [f"run-{table}-{n}" for n, _ in rows],
                "epoch_mode": "one_pass",
                "devices": [n for n, _ in rows],
                "wall_time_s": [t for _, t in rows],
            },
            index=rng.sample(range(100, 1000), len(rows)),
        ),
    )


def _speedup_problem(got: Any, expected: pd.DataFrame, first_s: float) -> str | None:
    """What is wrong with ``got`` against ``expected``'s speedup and efficiency for each run (matched by run_id);
    ``first_s`` is the time in the table's first row (a baseline taken from there is a mistake of its own)."""
    if not isinstance(got, pd.DataFrame) or not {"speedup", "efficiency"} <= set(got.columns):
        return f"returned a {type(got).__name__}: return the table with the columns speedup and efficiency added"
    if "run_id" in got.columns:
        got, expected = got.set_index("run_id"), expected.set_index("run_id")
    if len(got) != len(expected) or set(got.index) != set(expected.index):
        return f"returned {len(got)} rows for {len(expected)} runs: keep the table's rows (one per run), add 2 columns"
    for run_id, row in expected.iterrows():
        n, time_s, speedup = int(row["devices"]), float(row["wall_time_s"]), float(row["speedup"])
        if not close(got.loc[run_id, "speedup"], speedup, 1e-6):
            first_row = close(got.loc[run_id, "speedup"], first_s / time_s, 1e-6)
            fix = (
                "take the 1-device row's time, not the first row's"
                if first_row
                else "divide the 1-device run's time by this run's"
            )
            return (
                f"has speedup {got.loc[run_id, 'speedup']!r} for devices={n}, expected {speedup:.4g} = time on 1 "
                f"device / time on {n} ({time_s:.4g} s): {fix}"
            )
        if not close(got.loc[run_id, "efficiency"], speedup / n, 1e-6):
            return (
                f"has efficiency {got.loc[run_id, 'efficiency']!r} for devices={n}, expected speedup / devices = "
                f"{speedup / n:.4g}"
            )
    return None


def _speedups_problem(case: tuple[pd.DataFrame], got: Any, _given: tuple) -> str | None:
    """What is wrong with the answer's table for the runs ``case``, or None. With repeated 1-device runs (the run
    cell ran twice), any one of their times, or their mean, is a right baseline: the first problem shows."""
    from helpers.analysis import speedup_table

    table = case[0]
    ones = table.loc[table["devices"] == 1, "wall_time_s"].astype(float)
    bases = [*ones, ones.mean()] if len(ones) > 1 else []
    candidates = [speedup_table(table, group=None)] + [speedup_table(table, baseline_time=b, group=None) for b in bases]
    problems = [_speedup_problem(got, expected, float(table["wall_time_s"].iloc[0])) for expected in candidates]
    return None if None in problems else problems[0]


def _lessons_one_pass_runs(namespace: Mapping[str, Any]) -> list[Case]:
    """The one-pass runs of the lesson's ``table``; none where the namespace has no such table."""
    from helpers.analysis import ONE_PASS

    table = namespace.get("table")
    if not isinstance(table, pd.DataFrame) or "epoch_mode" not in table or table.empty:
        return []
    return [Case((table[table["epoch_mode"] == ONE_PASS],))]


#: ``speedup_efficiency(table)``: speedup = time(1 device) / time(n), efficiency = speedup / n, per row, on 6 drawn
#: tables and the lesson's one-pass runs; calling ``helpers.analysis.speedup_table`` is delegating
speedup_and_efficiency = register("5.3")(
    FunctionCheck(
        "5.3",
        answer="speedup_efficiency",
        fixed=[],
        draw=_draw_runs,
        draws=6,
        judge=_speedups_problem,
        show=lambda case: f"<{len(case[0])} runs on {sorted(case[0]['devices'])} devices>",
        forbid=("helpers.analysis:speedup_table",),
        from_namespace=_lessons_one_pass_runs,
        hint="speedup = the 1-device run's time / the run's time, efficiency = speedup / devices",
        passed="speedup and efficiency right on {n} made-up tables",
        passed_namespace=" and on the lesson's one-pass runs",
    )
)


# --- 5.4 why a run stopped --------------------------------------------------------------------------------------


def _replay(losses, delta, patience, threshold, max_epochs) -> tuple[str, int]:
    from helpers.analysis import stop_reason

    return stop_reason(losses, delta, patience, threshold, max_epochs)


def acceptable_reasons(val_losses, min_delta, patience, stopping_threshold, max_epochs) -> set[str]:
    """Every reason Lightning's rules give when ``min_delta`` and the threshold move by a rounding error: more
    than one when a loss sits on a boundary, where either side is right.

    Args:
        val_losses: the run's ``val_loss`` after each epoch.
        min_delta: EarlyStopping's ``min_delta``.
        patience: EarlyStopping's ``patience``.
        stopping_threshold: EarlyStopping's ``stopping_threshold``, or None.
        max_epochs: the run's epoch limit.

    Returns:
        The reasons :func:`helpers.analysis.stop_reason` gives with ``min_delta`` and the threshold each moved
        by -1e-6, 0 and +1e-6 (the threshold only when there is one).

    Raises:
        CourseInputError: ``patience`` is not a whole number of at least 0.
    """
    thresholds = (
        [None]
        if stopping_threshold is None
        else [stopping_threshold - _EPS, stopping_threshold, stopping_threshold + _EPS]
    )
    return {
        _replay(val_losses, min_delta + d, patience, t, max_epochs)[0] for d in (-_EPS, 0.0, _EPS) for t in thresholds
    }


_REASONS = ("stopping_threshold", "patience", "max_epochs")  # what why_stopped returns
REASON = Returns(
    "one of 'stopping_threshold', 'patience', 'max_epochs'",
    lambda value: isinstance(value, str),
    lambda got, expected: got in expected,
)

# (val_losses, min_delta, patience, stopping_threshold, max_epochs, reason, why): the rules one at a time
_STOP_CASES = [
    (
        [0.9, 0.7, 0.5, 0.45],
        0.01,
        10,
        0.5,
        20,
        "stopping_threshold",
        "val_loss 0.45 < stopping_threshold 0.5 at the last epoch",
    ),
    ([0.9, 0.7, 0.6], 0.01, 2, None, 3, "max_epochs", "it improved every epoch and reached max_epochs"),
    (
        [0.9, 0.895, 0.893],
        0.01,
        2,
        None,
        10,
        "patience",
        "changes of 0.005 are not improvements with min_delta 0.01: 2 epochs without improvement = patience 2",
    ),
    (
        [0.9, 0.8, 0.85, 0.78, 0.6, 0.61, 0.62],
        0.01,
        2,
        None,
        7,
        "patience",
        "the wait count resets at each improvement; it reaches 2 at the last epoch",
    ),
    (
        [0.9, 0.8, 0.81, 0.75],
        0.01,
        2,
        None,
        4,
        "max_epochs",
        "one epoch without improvement, then an improvement: patience 2 never runs out",
    ),
    (
        [0.9, 0.895, 0.4],
        0.01,
        1,
        0.5,
        10,
        "patience",
        "patience 1 ran out at epoch 1 (0.895 is not better than 0.9 by more than 0.01), before the threshold",
    ),
    (
        [0.9, 0.45],
        0.01,
        1,
        0.5,
        2,
        "stopping_threshold",
        "at the last epoch val_loss is below the threshold: the threshold is checked before max_epochs",
    ),
    (
        [0.9, 0.505, 0.498],
        0.01,
        1,
        0.5,
        10,
        "stopping_threshold",
        "0.498 is no improvement on 0.505 by min_delta, but it is below the threshold, which is checked first",
    ),
    (
        [1.0, 0.995, 0.988],
        0.01,
        2,
        None,
        3,
        "max_epochs",
        "0.988 improves on the best, 1.0, by more than 0.01: the best moves only at an improvement, not at 0.995",
    ),
]


def _draw_history(rng: random.Random) -> tuple[list[float], float, int, float | None, int]:
    """A made-up history, cut where Lightning would have stopped it, with no loss near a rule's boundary (the only
    reason :func:`acceptable_reasons` gives is the one :func:`helpers.analysis.stop_reason` gives)."""
    while True:
        max_epochs, patience = rng.randint(2, 14), rng.randint(1, 4)
        delta = rng.choice([0.0, 0.005, 0.01, 0.02, 0.05])
        threshold = None if rng.random() < 0.4 else round(rng.uniform(0.05, 0.5), 3)
        losses = [rng.uniform(0.6, 2.0)]
        for _ in range(max_epochs - 1):
            losses.append(losses[-1] * rng.uniform(0.7, 1.1))
        reason, epoch = _replay(losses, delta, patience, threshold, max_epochs)
        losses = losses[: epoch + 1]
        if acceptable_reasons(losses, delta, patience, threshold, max_epochs) == {reason}:
            return losses, delta, patience, threshold, max_epochs


_WHY = {repr(case[:5]): case[6] for case in _STOP_CASES}  # the fixed cases' own explanations


def _stop_hint(case: tuple, got: Any) -> str:
    """A one-line explanation of a made-up case's answer: the fixed case's own, else the rule that fired."""
    if repr(case) in _WHY:
        return _WHY[repr(case)]
    losses, _, patience, threshold, _ = case
    reason = _replay(*case)[0]
    if reason == "stopping_threshold":
        return f"val_loss {losses[-1]:.4f} < stopping_threshold {threshold}"
    if reason == "patience":
        return f"{patience} epoch(s) in a row without val_loss < best - min_delta"
    return "no rule fired before max_epochs"


def _lessons_runs(namespace: Mapping[str, Any]) -> list[Case]:
    """The lesson's runs in ``table`` (their ``val_loss`` histories read from MLflow), each with the reason
    Lightning logged accepted too; none where the namespace has no table."""
    from helpers.analysis import val_loss_histories

    table = namespace.get("table")
    if not isinstance(table, pd.DataFrame) or table.empty:
        return []
    histories = val_loss_histories(table, _uri(namespace))
    cases = []
    for row in table.itertuples():
        if row.logged_stop_reason not in _REASONS:  # e.g. a NaN loss: not a rule this exercise asks for
            continue
        threshold = None if math.isnan(row.stopping_threshold) else float(row.stopping_threshold)
        args = (histories[row.run_id], float(row.min_delta), int(row.patience), threshold, int(row.max_epochs))
        accepted = {row.logged_stop_reason} | acceptable_reasons(*args) - {"unknown"}
        run = f"run {row.run_id} ({row.devices} devices, {row.epoch_mode})"
        cases.append(Case(args, accepted, f"Lightning reported {row.logged_stop_reason!r} for {run}"))
    return cases


#: ``why_stopped(val_losses, min_delta, patience, stopping_threshold, max_epochs)``: Lightning's rules, on the fixed
#: histories (one rule at a time), 40 drawn ones off every boundary, and the lesson's runs in ``table`` (read from
#: MLflow), where the reason Lightning logged is right too; calling ``stop_reason`` or ``stop_reasons`` is delegating
why_runs_stopped = register("5.4")(
    FunctionCheck(
        "5.4",
        answer="why_stopped",
        fixed=[case[:5] for case in _STOP_CASES],
        draw=_draw_history,
        draws=40,
        reference=acceptable_reasons,
        returns=REASON,
        forbid=("helpers.analysis:stop_reason", "helpers.analysis:stop_reasons"),
        keywords=True,
        from_namespace=_lessons_runs,
        hint=_stop_hint,
        passed="right on {n} made-up histories",
        passed_namespace=" and on the lesson's {m} runs",
    )
)


# --- 5.6 rows per epoch -----------------------------------------------------------------------------------------


_LESSON_EPOCHS = [(1438, 32, 1), (1438, 32, 2), (2936, 64, 8)]  # (rows, batch_size, devices) of the text


_MODES = ("one_pass", "fixed_steps")


def _rows_read(rows: int, batch_size: int, devices: int, epoch_mode: str) -> int:
    """The reference: steps per epoch (one pass: ``ceil(rows / (batch_size x devices))``; fixed steps: the 1-device
    ``ceil(rows / batch_size)``) times the rows all devices read a step (``fixed_steps`` multiplies each device's
    batch by the device count)."""
    if epoch_mode == "one_pass":
        return math.ceil(rows / (batch_size * devices)) * batch_size * devices
    return math.ceil(rows / batch_size) * batch_size * devices * devices


def _rows_hint(case: tuple[int, int, int, str], got: Any) -> str:
    if case[3] == "one_pass":
        return "steps = ceil(rows / (batch_size x devices)), each device reads batch_size rows a step"
    return "steps stay at the 1-device ceil(rows / batch_size) while each device reads batch_size x devices rows a step"


_PASSES = math.ceil(3670 / 64) * 64 * 8 * 8 / 3670

#: ``rows_per_epoch(rows, batch_size, devices, epoch_mode)``: training rows all devices read in one epoch, in both
#: modes, on the lesson's sizes and 24 drawn ones (some not divisible); calling ``steps_per_epoch`` is delegating
rows_read_per_epoch = register("5.6")(
    FunctionCheck(
        "5.6",
        answer="rows_per_epoch",
        fixed=[(rows, batch, devices, mode) for mode in _MODES for rows, batch, devices in _LESSON_EPOCHS],
        draw=lambda rng: (
            rng.randint(50, 6000),
            rng.choice([8, 16, 32, 64, 128]),
            rng.randint(1, 16),
            rng.choice(_MODES),
        ),
        draws=24,
        reference=_rows_read,
        forbid=("helpers.loaders:steps_per_epoch",),
        hint=_rows_hint,
        passed=f"right: one 'epoch' on 8 devices the original way (3,670 images, batch 64) is {_PASSES:.0f} passes",
    )
)


# --- 5.1 the sweep plan -----------------------------------------------------------------------------------------


def _draw_sweep(rng: random.Random) -> tuple[int, dict[str, Any]]:
    """``(max_devices, base_settings)``: a device limit that may or may not be a power of two, a data set small
    enough that the largest counts may get no full batch, other settings and extra keys that must pass through
    unchanged (``seed``, ``max_epochs``, the early-stopping settings, sometimes ``image_size``)."""
    batch = rng.choice([8, 16, 32, 64, 128])
    base = {
        "batch_size": batch,
        "learning_rate": round(10 ** rng.uniform(-5, -1), 7),
        "train_rows": rng.randint(2 * batch, 40 * batch),
        "seed": rng.randint(0, 99),
        "max_epochs": rng.randint(3, 100),
        "min_delta": rng.choice([0.0, 0.005, 0.01]),
        "patience": rng.randint(1, 10),
        "stopping_threshold": rng.choice([None, 0.55, 0.12]),
    }
    if rng.random() < 0.5:
        base["image_size"] = rng.choice([16, 32, 224])
    return rng.choice([1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64]), base


def _device_hint(got: list[int], expected: list[int], max_devices: int, batch: int, rows: int) -> str:
    """Which rule a wrong list of device counts breaks."""
    if 1 not in got:
        return "start at 1 device: the baseline every speedup is measured against"
    if max_devices in expected and max_devices not in got:
        return "include max_devices itself: the full node is the run the sweep is for"
    if any(n * batch > rows for n in got if n > 1):
        return (
            f"leave out device counts at which a device gets no full batch ({rows} rows, {batch} per device: "
            "devices x batch_size <= train_rows)"
        )
    if len(set(got)) != len(got):
        return "launch each device count once"
    return "double from 1 (1, 2, 4, 8, ...) up to max_devices, and add max_devices itself"


def _same(got: Any, expected: Any) -> bool:
    """``got`` is ``expected``: equal, or the same number of another type (numpy scalars too)."""
    if expected is None:
        return got is None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return close(got, expected)
    return bool(got == expected)


_RUN_RULES = {
    "batch_size": "hold the per-device batch_size fixed: each device reads as much per step as on 1",
    "global_batch_size": "global_batch_size = batch_size x devices: the batch all devices take in one step",
    "steps_per_epoch": (
        "steps_per_epoch = ceil(train_rows / global_batch_size): one pass over the data per epoch on any device count"
    ),
}


def _run_problem(run: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """What is wrong with one planned run against ``plan_sweep``'s, naming the rule it breaks; None if nothing."""
    n = expected["devices"]
    for key, hint in _RUN_RULES.items():
        got = run.get(key)
        if not is_whole(got) or int(got) != expected[key]:
            return f"has {key} {got!r} for devices={n}, expected {expected[key]}: {hint}"
    if not close(run.get("learning_rate"), expected["learning_rate"], 1e-6):
        return (
            f"has learning_rate {run.get('learning_rate')!r} for devices={n}, expected "
            f"{expected['learning_rate']:.4g}: scale the 1-device rate linearly with the devices (each step averages "
            "gradients over devices x more images)"
        )
    for key, value in expected.items():
        if key not in ("devices", "learning_rate", *_RUN_RULES) and (key not in run or not _same(run[key], value)):
            return (
                f"has {key} {run.get(key, 'missing')!r} for devices={n}, expected {value!r}: keep every other setting "
                "of base_settings (seed, data, early stopping) as it is"
            )
    return None


def _plan_problem(case: tuple[int, dict[str, Any]], plan: Any, given: tuple) -> str | None:
    """What is wrong with the answer's plan for ``case``, against ``plan_sweep``'s, or None: the settings it was
    given left as they were, a list of dicts, the device counts, then each run's settings."""
    from helpers.analysis import plan_sweep

    max_devices, base = case
    if given[1] != base:
        return "changed base_settings: copy it for each run (dict(base_settings)) instead"
    if not isinstance(plan, (list, tuple)) or not all(isinstance(run, Mapping) for run in plan):
        return f"returned a {type(plan).__name__}: return a list of dicts, one per run"
    if not all(is_whole(run.get("devices")) for run in plan):
        return "has a run without a whole-number 'devices': give every run its device count"
    plan = sorted(plan, key=lambda run: int(run["devices"]))
    expected = plan_sweep(max_devices, base)
    got, want = [int(run["devices"]) for run in plan], [run["devices"] for run in expected]
    if got != want:
        return f"has devices {got}, expected {want}: " + _device_hint(
            got, want, max_devices, base["batch_size"], base["train_rows"]
        )
    return next(filter(None, map(_run_problem, plan, expected)), None)


def _lessons_sweep(namespace: Mapping[str, Any]) -> list[Case]:
    """The lesson's sweep (its largest device count and its ``base_settings``); none where the namespace has none."""
    counts, base = namespace.get("DEVICE_COUNTS"), namespace.get("base_settings")
    return [Case((max(counts), dict(base)))] if isinstance(base, dict) and counts else []


def _lessons_devices(own: list[Case]) -> str:
    """What the lesson's sweep showed: the device counts it runs."""
    from helpers.analysis import plan_sweep

    return f" and on the lesson's, which runs devices {[run['devices'] for run in plan_sweep(*own[0].args)]}"


#: ``sweep_plan(max_devices, base_settings)``: the runs of the sweep, judged against ``plan_sweep`` on 10 drawn
#: sweeps and the lesson's; calling ``plan_sweep`` or ``helpers.loaders.steps_per_epoch`` is delegating
sweep_is_like_for_like = register("5.1")(
    FunctionCheck(
        "5.1",
        answer="sweep_plan",
        fixed=[],
        draw=_draw_sweep,
        draws=10,
        judge=_plan_problem,
        show=lambda case: (
            f"{case[0]}, <base_settings with batch_size {case[1]['batch_size']}, train_rows {case[1]['train_rows']}>"
        ),
        forbid=("helpers.analysis:plan_sweep", "helpers.loaders:steps_per_epoch"),
        from_namespace=_lessons_sweep,
        hint=(
            "device counts 1, 2, 4, ... and max_devices, each with a full batch; per run: batch_size fixed, "
            "global_batch_size = batch_size x devices, learning_rate x devices, "
            "steps_per_epoch = ceil(train_rows / global_batch_size), every other setting as given"
        ),
        passed=(
            "right on {n} made-up sweeps (per-device batch fixed, learning rate x devices, one pass per epoch, "
            "everything else unchanged)"
        ),
        passed_namespace=_lessons_devices,
    )
)


# --- 5.5 (stretch) the serial fraction --------------------------------------------------------------------------


def karp_flatt(speedup: float, devices: int) -> float:
    """The experimentally determined serial fraction ``(1/S - 1/n) / (1 - 1/n)`` (Karp and Flatt, 1990).

    Args:
        speedup: the measured speedup ``S`` on ``devices``.
        devices: the device count ``n``.

    Returns:
        The serial fraction: 0 at linear speedup, negative above it.

    Raises:
        ZeroDivisionError: ``speedup`` is 0 or ``devices`` is 1 (as Python numbers).
    """
    return (1 / speedup - 1 / devices) / (1 - 1 / devices)


def _draw_point(rng: random.Random) -> tuple[float, int]:
    """``(speedup, devices)``, devices >= 2, the speedup from a fifth of linear to a tenth above it."""
    n = rng.choice([2, 3, 4, 6, 8, 16, 64])
    return round(n * rng.uniform(0.2, 1.1), 4), n


def _lessons_speedups(namespace: Mapping[str, Any]) -> list[Case]:
    """Each multi-device count's median speedup in the lesson's ``right`` table; none where it has no such table."""
    right = namespace.get("right")
    if not isinstance(right, pd.DataFrame) or not {"speedup", "devices"} <= set(right.columns):
        return []
    medians = right.groupby("devices")["speedup"].median().items()
    return [Case((float(s), int(n))) for n, s in medians if int(n) > 1]


def _lessons_fractions(own: list[Case]) -> str:
    """What the lesson's runs showed: each device count's serial fraction, and what one above 1 means."""
    measured = ", ".join(f"{n} devices {karp_flatt(s, n):.2f}" for s, n in (case.args for case in own))
    slower = (
        " (above 1: those runs were slower than one device, which Amdahl's model, where the serial share is at most "
        "all of the work, cannot describe: the fraction says only that the overhead outgrew the work)"
        if any(case.args[0] < 1 for case in own)
        else ""
    )
    return f"; serial fraction of this lesson's runs (median speedups): {measured}{slower}"


_FIXED_POINTS = [(1.6, 2), (2.0, 2), (3.1, 4), (0.8, 2)]  # sub-linear, linear, super-linear, slower than 1 device

#: ``serial_fraction(speedup, devices)``: the Karp-Flatt metric on fixed and drawn points (numpy numbers too) and
#: on the median speedup of each of the lesson's device counts
serial_fraction_measured = register("5.5")(
    FunctionCheck(
        "5.5",
        answer="serial_fraction",
        fixed=[*_FIXED_POINTS, *((np.float64(s), np.int64(n)) for s, n in _FIXED_POINTS[:3])],
        draw=_draw_point,
        draws=12,
        reference=karp_flatt,
        returns=Returns("a number", NUMBER.is_kind, lambda got, expected: close(got, expected, 1e-6)),
        from_namespace=_lessons_speedups,
        hint="(1/speedup - 1/devices) / (1 - 1/devices)",
        passed="right on {n} made-up points",
        passed_namespace=_lessons_fractions,
    )
)
