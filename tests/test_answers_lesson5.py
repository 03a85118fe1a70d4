"""Lesson 5's answer corpus: for every exercise, right answers written differently must pass and wrong ones
(delegating, hard-coded, subtly wrong) must fail, each run through its check with ``helpers.course.checks._run``.

The namespace the checks read is built here without training: runs written straight into an MLflow store of
this module's own (tags through ``record_run``, a per-epoch ``val_loss`` history each), one of them with a loss on
the ``min_delta`` boundary, as a real run can have.
"""

from __future__ import annotations

import math
import re
import types
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers.analysis import FIXED_STEPS, ONE_PASS, TAG, plan_sweep, record_run, runs_table, speedup_table, stop_reason
from helpers.course.checks import _run
from helpers.course.checks.lesson5 import acceptable_reasons, sweep_is_like_for_like, why_runs_stopped
from helpers.loaders import steps_per_epoch
from helpers.workdir import REPO_ROOT

EXPERIMENT = "test-answers-lesson-5"
SWEEP = "sweep-answers"

# (devices, epoch_mode, wall_time_s, val_loss history, logged reason, settings)
_RUNS = [
    (1, ONE_PASS, 120.0, [1.2, 0.8, 0.6, 0.45], "stopping_threshold", dict(patience=2, stopping_threshold=0.5)),
    # 0.49 sits exactly on 0.5 - min_delta: Lightning (float32) counted it as an improvement and went on
    (2, ONE_PASS, 75.0, [0.9, 0.5, 0.49, 0.47, 0.45], "max_epochs", dict(patience=1, stopping_threshold=None)),
    (2, FIXED_STEPS, 60.0, [0.7, 0.65, 0.648, 0.649], "patience", dict(patience=2, stopping_threshold=0.1)),
]


def _make_run(client, experiment_id, uri, sweep, devices, mode, time_s, losses, reason, settings, status="FINISHED"):
    run = client.create_run(experiment_id, run_name=f"{mode}-devices{devices}")
    for epoch, value in enumerate(losses):
        client.log_metric(run.info.run_id, "val_loss", value, step=epoch)
    client.log_metric(run.info.run_id, "wall_time_s", time_s)
    result = SimpleNamespace(
        mlflow_run_id=run.info.run_id,
        stopped_reason=reason,
        epochs_run=len(losses),
        best_val_loss=min(losses),
        last_val_loss=losses[-1],
        val_acc=0.9,
    )
    max_epochs = len(losses) if reason == "max_epochs" else 20
    record_run(
        result,
        sweep=sweep,
        devices=devices,
        launcher="local",
        epoch_mode=mode,
        batch_size=32,
        steps=steps_per_epoch(400, 32, 1 if mode == FIXED_STEPS else devices),
        train_rows=400,
        min_delta=0.01,
        max_epochs=max_epochs,
        tracking_uri=uri,
        **settings,
    )
    client.set_terminated(run.info.run_id, status)


@pytest.fixture(scope="module")
def namespace(session_work_dir):
    """What the lesson's namespace holds after its runs: settings, the sweep's table, and the 1-device baseline."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{session_work_dir / 'answers-lesson5.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(EXPERIMENT, artifact_location=str(session_work_dir / "l5-artifacts"))
    for devices, mode, time_s, losses, reason, settings in _RUNS:
        _make_run(client, experiment_id, uri, SWEEP, devices, mode, time_s, losses, reason, settings)
    _make_run(
        client,
        experiment_id,
        uri,
        SWEEP,
        4,
        ONE_PASS,
        50.0,
        [1.0],
        "max_epochs",
        {"patience": 2, "stopping_threshold": None},
        status="FAILED",
    )
    _make_run(
        client,
        experiment_id,
        uri,
        "sweep-older",
        1,
        ONE_PASS,
        99.0,
        [1.0],
        "max_epochs",
        {"patience": 2, "stopping_threshold": None},
    )
    table = runs_table(EXPERIMENT, uri, sweep=SWEEP)
    return {
        "EXPERIMENT": EXPERIMENT,
        "SWEEP": SWEEP,
        "MLFLOW_TRACKING_URI": uri,
        "table": table,
        "right": speedup_table(table[table["epoch_mode"] == ONE_PASS]),
        "DEVICE_COUNTS": [1, 2],
        "base_settings": dict(
            batch_size=32,
            learning_rate=0.01,
            train_rows=1438,
            seed=0,
            max_epochs=5,
            min_delta=0.01,
            patience=2,
            stopping_threshold=0.12,
        ),
    }


def verdict(namespace, exercise_id, name, answer, **extra):
    status, message = _run(exercise_id, {**namespace, name: answer, **extra})
    return status, message


def test_the_fixture_holds_the_sweep_with_a_boundary_run(namespace):
    table = namespace["table"]
    assert sorted(zip(table["devices"], table["epoch_mode"])) == [(1, ONE_PASS), (2, FIXED_STEPS), (2, ONE_PASS)]
    boundary = [0.9, 0.5, 0.49, 0.47, 0.45]
    assert acceptable_reasons(boundary, 0.01, 1, None, 5) == {"patience", "max_epochs"}


# --- 5.2 query the runs -----------------------------------------------------------------------------------------


def q_solution(experiment, sweep):
    import mlflow

    return mlflow.search_runs(
        experiment_names=[experiment],
        filter_string=f"tags.`course.sweep` = '{sweep}' and attributes.status = 'FINISHED'",
    )


def q_status_in_pandas(experiment, sweep):
    import mlflow

    experiment_id = mlflow.get_experiment_by_name(experiment).experiment_id
    runs = mlflow.search_runs([experiment_id], filter_string=f'tags.`{TAG}sweep` = "{sweep}"')
    return runs[runs["status"] == "FINISHED"].reset_index(drop=True)


def q_runs_table(experiment, sweep):
    return runs_table(experiment, sweep=sweep)


def q_no_status(experiment, sweep):
    import mlflow

    return mlflow.search_runs(experiment_names=[experiment], filter_string=f"tags.`course.sweep` = '{sweep}'")


def q_no_sweep(experiment, sweep):
    import mlflow

    return mlflow.search_runs(experiment_names=[experiment], filter_string="attributes.status = 'FINISHED'")


def q_global_sweep(experiment, sweep):
    return q_solution(experiment, SWEEP)


def q_ids_only(experiment, sweep):
    return list(q_solution(experiment, sweep)["run_id"])


@pytest.mark.parametrize("answer", [q_solution, q_status_in_pandas])
def test_5_2_right(namespace, answer):
    assert verdict(namespace, "5.2", "query_runs", answer)[0] == "passed"
    assert verdict(namespace, "5.2", "query_runs", answer)[0] == "passed"  # re-run: the decoys are gone again


@pytest.mark.parametrize("answer", [q_runs_table, q_no_status, q_no_sweep, q_global_sweep, q_ids_only])
def test_5_2_wrong(namespace, answer):
    status, message = verdict(namespace, "5.2", "query_runs", answer)
    assert status == "failed", message


def test_5_2_delegating_is_told_to_write_it(namespace):
    assert "write it yourself" in verdict(namespace, "5.2", "query_runs", q_runs_table)[1]


# --- 5.3 speedup and efficiency ---------------------------------------------------------------------------------


def s_solution(table):
    out = table.copy()
    one_device = out.loc[out["devices"] == 1, "wall_time_s"].iloc[0]
    out["speedup"] = one_device / out["wall_time_s"]
    out["efficiency"] = out["speedup"] / out["devices"]
    return out


def s_numpy(table):
    t1 = table["wall_time_s"].to_numpy()[table["devices"].to_numpy() == 1][0]
    return table.assign(speedup=t1 / table["wall_time_s"], efficiency=lambda d: d["speedup"] / d["devices"])


def s_rows(table):
    base = np.float64(table.set_index("devices")["wall_time_s"][1])
    speedups = [base / np.float64(t) for t in table["wall_time_s"]]
    out = table.copy()
    out["speedup"] = speedups
    out["efficiency"] = [s / np.int64(n) for s, n in zip(speedups, table["devices"])]
    return out


def s_delegates(table):
    return speedup_table(table)


def s_first_row(table):
    out = table.copy()
    out["speedup"] = out["wall_time_s"].iloc[0] / out["wall_time_s"]
    out["efficiency"] = out["speedup"] / out["devices"]
    return out


def s_efficiency_times(table):
    out = s_solution(table)
    out["efficiency"] = out["speedup"] * out["devices"]
    return out


def s_inverted(table):
    out = s_solution(table)
    out["speedup"] = 1 / out["speedup"]
    out["efficiency"] = out["speedup"] / out["devices"]
    return out


def s_linear(table):
    return table.assign(speedup=table["devices"].astype(float), efficiency=1.0)


def s_changes_the_times(table):
    table["wall_time_s"] = table["wall_time_s"].iloc[0]  # every run as fast as the first: speedup 1 everywhere
    return table.assign(speedup=1.0, efficiency=1.0 / table["devices"])


@pytest.mark.parametrize("answer", [s_solution, s_numpy, s_rows])
def test_5_3_right(namespace, answer):
    status, message = verdict(namespace, "5.3", "speedup_efficiency", answer)
    assert status == "passed", message
    assert "on the lesson's one-pass runs" in message


@pytest.mark.parametrize("answer", [s_solution, s_numpy])
def test_5_3_same_verdict_after_the_run_cell_ran_twice(namespace, answer):
    table = namespace["table"]
    again = table[table["devices"] == 1].assign(run_id="run-again", wall_time_s=131.0)
    status, message = verdict({**namespace, "table": pd.concat([table, again])}, "5.3", "speedup_efficiency", answer)
    assert status == "passed", message


@pytest.mark.parametrize(
    "answer", [s_delegates, s_first_row, s_efficiency_times, s_inverted, s_linear, s_changes_the_times]
)
def test_5_3_wrong(namespace, answer):
    status, message = verdict(namespace, "5.3", "speedup_efficiency", answer)
    assert status == "failed", message


def test_5_3_the_hint_names_the_runs_and_the_right_speedup():
    status, message = verdict({}, "5.3", "speedup_efficiency", s_first_row)
    assert status == "failed" and re.fullmatch(
        r"speedup_efficiency\(<\d runs on \[1(, \d+)+\] devices>\) has speedup [\d.]+ for devices=\d+, expected "
        r"[\d.]+ = time on 1 device / time on \d+ \([\d.]+ s\): take the 1-device row's time, not the first row's",
        message,
    ), message


# --- 5.4 why a run stopped --------------------------------------------------------------------------------------


def w_solution(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    best, wait = float("inf"), 0
    for value in val_losses:
        if stopping_threshold is not None and value < stopping_threshold:
            return "stopping_threshold"
        if value < best - min_delta:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return "patience"
    return "max_epochs"


def w_other_way_round(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    best, since_best = math.inf, 0
    for v in val_losses:
        if stopping_threshold is not None and not v >= stopping_threshold:
            return "stopping_threshold"
        improved = best - v > min_delta
        best = v if improved else best
        since_best = 0 if improved else since_best + 1
        if since_best == patience:
            return "patience"
    return "max_epochs"


def w_numpy(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    losses = np.asarray(val_losses, dtype=np.float64)
    best, best_epoch = np.inf, -1
    for epoch, value in enumerate(losses):
        if stopping_threshold is not None and value < np.float64(stopping_threshold):
            return "stopping_threshold"
        if value + min_delta < best:
            best, best_epoch = value, epoch
        elif epoch - best_epoch >= patience:
            return "patience"
    return "max_epochs"


def w_delegates(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    return stop_reason(val_losses, min_delta, patience, stopping_threshold, max_epochs)[0]


def w_threshold_last(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    best, wait = math.inf, 0
    for value in val_losses:
        if value < best - min_delta:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return "patience"
        if stopping_threshold is not None and value < stopping_threshold:
            return "stopping_threshold"
    return "max_epochs"


def w_no_reset(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    best, wait = math.inf, 0
    for value in val_losses:
        if stopping_threshold is not None and value < stopping_threshold:
            return "stopping_threshold"
        if value < best - min_delta:
            best = value
        else:
            wait += 1
            if wait >= patience:
                return "patience"
    return "max_epochs"


def w_best_always(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    best, wait = math.inf, 0
    for value in val_losses:
        if stopping_threshold is not None and value < stopping_threshold:
            return "stopping_threshold"
        wait = 0 if value < best - min_delta else wait + 1
        best = min(best, value)  # Lightning keeps the last *improvement* as the best
        if wait >= patience:
            return "patience"
    return "max_epochs"


def w_off_by_one(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    return w_solution(val_losses, min_delta, patience + 1, stopping_threshold, max_epochs)


def w_by_length(val_losses, min_delta, patience, stopping_threshold, max_epochs):
    return "max_epochs" if len(val_losses) >= max_epochs else "patience"


@pytest.mark.parametrize("answer", [w_solution, w_other_way_round, w_numpy])
def test_5_4_right(namespace, answer):
    status, message = verdict(namespace, "5.4", "why_stopped", answer)
    assert status == "passed", message
    assert "lesson's 3 runs" in message


@pytest.mark.parametrize(
    "answer", [w_delegates, w_threshold_last, w_no_reset, w_best_always, w_off_by_one, w_by_length]
)
def test_5_4_wrong(namespace, answer):
    status, message = verdict(namespace, "5.4", "why_stopped", answer)
    assert status == "failed", message


def test_5_4_cases_are_off_the_boundaries_and_cover_every_reason():
    cases = why_runs_stopped.cases()
    reasons = [acceptable_reasons(*case) for case in cases]
    assert all(len(accepted) == 1 for accepted in reasons)
    assert set().union(*reasons[len(why_runs_stopped.fixed) :]) == {"stopping_threshold", "patience", "max_epochs"}
    assert why_runs_stopped.cases() == cases  # the same cases, so the same verdict, on every run


def test_5_4_the_hint_shows_the_whole_history_and_why():
    status, message = verdict({}, "5.4", "why_stopped", w_threshold_last)
    assert (status, message) == (
        "failed",
        "why_stopped(val_losses=[0.9, 0.505, 0.498], min_delta=0.01, patience=1, stopping_threshold=0.5, "
        "max_epochs=10) = 'patience', expected 'stopping_threshold': 0.498 is no improvement on 0.505 by min_delta, "
        "but it is below the threshold, which is checked first",
    )


def test_5_4_the_reason_lightning_logged_for_a_boundary_run_is_right_too(namespace):
    def says_patience_on_the_boundary(val_losses, min_delta, patience, stopping_threshold, max_epochs):
        return "patience" if val_losses[2:3] == [0.49] else w_solution(val_losses, min_delta, patience,
                                                                        stopping_threshold, max_epochs)  # fmt: skip

    status, message = verdict(namespace, "5.4", "why_stopped", says_patience_on_the_boundary)
    assert status == "passed", message


# --- 5.6 rows per epoch -----------------------------------------------------------------------------------------


def r_solution(rows, batch_size, devices, epoch_mode):
    if epoch_mode == "one_pass":
        return math.ceil(rows / (batch_size * devices)) * batch_size * devices
    return math.ceil(rows / batch_size) * (batch_size * devices) * devices


def r_integer_ceil(rows, batch_size, devices, epoch_mode):
    per_step = batch_size * devices  # rows all devices read in one step, both modes
    steps = -(-rows // per_step) if epoch_mode == "one_pass" else -(-rows // batch_size)
    return np.int64(steps * per_step * (1 if epoch_mode == "one_pass" else devices))


def r_float(rows, batch_size, devices, epoch_mode):
    device_batch = float(batch_size) * (devices if epoch_mode == "fixed_steps" else 1)
    steps = np.ceil(rows / batch_size) if epoch_mode == "fixed_steps" else np.ceil(rows / (batch_size * devices))
    return steps * device_batch * devices


def r_delegates(rows, batch_size, devices, epoch_mode):
    if epoch_mode == "one_pass":
        return steps_per_epoch(rows, batch_size, devices) * batch_size * devices
    return steps_per_epoch(rows, batch_size) * batch_size * devices * devices


def r_fixed_once(rows, batch_size, devices, epoch_mode):
    return (
        math.ceil(rows / batch_size) * batch_size * devices
        if epoch_mode == "fixed_steps"
        else r_solution(rows, batch_size, devices, epoch_mode)
    )


def r_rows(rows, batch_size, devices, epoch_mode):
    return rows if epoch_mode == "one_pass" else r_solution(rows, batch_size, devices, epoch_mode)


def r_floor(rows, batch_size, devices, epoch_mode):
    per_step = batch_size * devices
    return rows // per_step * per_step if epoch_mode == "one_pass" else rows // batch_size * per_step * devices


_LESSON_SIZES = {
    (1438, 32, 1, "one_pass"): 1440,
    (1438, 32, 2, "one_pass"): 1472,
    (1438, 32, 1, "fixed_steps"): 1440,
    (1438, 32, 2, "fixed_steps"): 5760,
}


def r_hard_coded(rows, batch_size, devices, epoch_mode):
    return _LESSON_SIZES.get((rows, batch_size, devices, epoch_mode), rows)


@pytest.mark.parametrize("answer", [r_solution, r_integer_ceil, r_float])
def test_5_6_right(namespace, answer):
    status, message = verdict(namespace, "5.6", "rows_per_epoch", answer)
    assert status == "passed", message


@pytest.mark.parametrize("answer", [r_delegates, r_fixed_once, r_rows, r_floor, r_hard_coded])
def test_5_6_wrong(namespace, answer):
    status, message = verdict(namespace, "5.6", "rows_per_epoch", answer)
    assert status == "failed", message


# --- 5.1 the sweep plan -----------------------------------------------------------------------------------------


def p_solution(max_devices, base_settings):
    counts = [1]
    while counts[-1] * 2 <= max_devices:
        counts.append(counts[-1] * 2)
    if counts[-1] != max_devices:
        counts.append(max_devices)
    batch, rows = base_settings["batch_size"], base_settings["train_rows"]
    plan = []
    for n in counts:
        if n > 1 and n * batch > rows:
            continue
        run = dict(base_settings)
        run.update(
            devices=n,
            global_batch_size=n * batch,
            learning_rate=base_settings["learning_rate"] * n,
            steps_per_epoch=math.ceil(rows / (n * batch)),
        )
        plan.append(run)
    return plan


def p_numpy_tuple(max_devices, base_settings):
    batch, rows = base_settings["batch_size"], base_settings["train_rows"]
    counts = sorted({2**k for k in range(int(math.log2(max_devices)) + 1)} | {max_devices})
    usable = [n for n in counts if n == 1 or rows // n >= batch]
    return tuple(
        {
            **base_settings,
            "devices": np.int64(n),
            "global_batch_size": np.int64(batch * n),
            "learning_rate": np.float64(base_settings["learning_rate"]) * n,
            "steps_per_epoch": (rows + batch * n - 1) // (batch * n),
        }
        for n in usable
    )


def p_largest_first(max_devices, base_settings):
    return list(reversed(p_solution(max_devices, base_settings)))


def p_delegates(max_devices, base_settings):
    return plan_sweep(max_devices, base_settings)


def p_hard_coded(max_devices, base_settings):
    return p_solution(2, base_settings)


def p_global_batch_fixed(max_devices, base_settings):
    plan = p_solution(max_devices, base_settings)
    for run in plan:
        run["batch_size"] = base_settings["batch_size"] // run["devices"]
        run["global_batch_size"] = base_settings["batch_size"]
        run["steps_per_epoch"] = math.ceil(base_settings["train_rows"] / base_settings["batch_size"])
    return plan


def p_lr_not_scaled(max_devices, base_settings):
    return [{**run, "learning_rate": base_settings["learning_rate"]} for run in p_solution(max_devices, base_settings)]


def p_fixed_steps(max_devices, base_settings):
    steps = math.ceil(base_settings["train_rows"] / base_settings["batch_size"])
    return [{**run, "steps_per_epoch": steps} for run in p_solution(max_devices, base_settings)]


def p_shared_dict(max_devices, base_settings):
    plan = []
    for run in p_solution(max_devices, base_settings):
        base_settings.update(run)  # one dict for every run, and the caller's settings changed
        plan.append(base_settings)
    return plan


def p_powers_only(max_devices, base_settings):
    return [run for run in p_solution(max_devices, base_settings) if run["devices"] & (run["devices"] - 1) == 0]


def p_every_count(max_devices, base_settings):
    batch, rows = base_settings["batch_size"], base_settings["train_rows"]
    return [
        {
            **base_settings,
            "devices": n,
            "global_batch_size": n * batch,
            "learning_rate": base_settings["learning_rate"] * n,
            "steps_per_epoch": math.ceil(rows / (n * batch)),
        }
        for n in range(1, max_devices + 1)
        if n * batch <= rows
    ]


def p_no_batch_rule(max_devices, base_settings):
    batch, rows = base_settings["batch_size"], base_settings["train_rows"]
    counts = sorted({2**k for k in range(max_devices.bit_length()) if 2**k <= max_devices} | {max_devices})
    return [
        {
            **base_settings,
            "devices": n,
            "global_batch_size": n * batch,
            "learning_rate": base_settings["learning_rate"] * n,
            "steps_per_epoch": math.ceil(rows / (n * batch)),
        }
        for n in counts
    ]


def p_seed_per_run(max_devices, base_settings):
    return [{**run, "seed": base_settings["seed"] + run["devices"]} for run in p_solution(max_devices, base_settings)]


def p_known_keys_only(max_devices, base_settings):
    known = ("batch_size", "learning_rate", "train_rows", "seed", "max_epochs", "min_delta", "patience")
    return [
        {key: run[key] for key in (*known, "stopping_threshold", "devices", "global_batch_size", "steps_per_epoch")}
        for run in p_solution(max_devices, base_settings)
    ]  # drops the settings it does not know (image_size)


# plan_sweep's own code under another name: a different function object that does the same
p_copied_helper = types.FunctionType(plan_sweep.__code__, plan_sweep.__globals__, "p_copied_helper")


@pytest.mark.parametrize("answer", [p_solution, p_numpy_tuple, p_largest_first])
def test_5_1_right(namespace, answer):
    status, message = verdict(namespace, "5.1", "sweep_plan", answer)
    assert status == "passed", message
    assert "devices [1, 2]" in message


@pytest.mark.parametrize(
    "answer",
    [
        p_delegates,
        p_hard_coded,
        p_global_batch_fixed,
        p_lr_not_scaled,
        p_fixed_steps,
        p_shared_dict,
        p_powers_only,
        p_every_count,
        p_no_batch_rule,
        p_seed_per_run,
        p_known_keys_only,
        p_copied_helper,
    ],
)
def test_5_1_wrong(namespace, answer):
    status, message = verdict(namespace, "5.1", "sweep_plan", answer)
    assert status == "failed", message


def _lesson_parameters(path):
    """The lesson's parameters from a params file: common, then its own section."""
    loaded = yaml.safe_load(path.read_text())
    return {**loaded.get("common", {}), **loaded.get("05_early_stopping_analysis", {})}


@pytest.mark.parametrize("params", sorted((REPO_ROOT / "params").glob("*.yaml")), ids=lambda path: path.stem)
def test_5_1_same_verdict_with_every_params_file(namespace, params):
    values = {
        "BATCH_SIZE": 32,
        "LEARNING_RATE": 0.01,
        "MAX_EPOCHS": 5,
        "PATIENCE": 2,
        "STOPPING_THRESHOLD": 0.12,
        "MIN_DELTA": 0.01,
        "SEED": 0,
        **_lesson_parameters(params),
    }
    settings = dict(
        batch_size=values["BATCH_SIZE"],
        learning_rate=values["LEARNING_RATE"],
        train_rows=2936,
        seed=values["SEED"],
        max_epochs=values["MAX_EPOCHS"],
        min_delta=values["MIN_DELTA"],
        patience=values["PATIENCE"],
        stopping_threshold=values["STOPPING_THRESHOLD"],
    )
    lesson = {**namespace, "DEVICE_COUNTS": values["DEVICE_COUNTS"], "base_settings": settings}
    assert verdict(lesson, "5.1", "sweep_plan", p_solution)[0] == "passed"
    assert verdict(lesson, "5.1", "sweep_plan", p_hard_coded)[0] == "failed"


def test_5_1_cases_exercise_every_rule():
    cases = sweep_is_like_for_like.cases()
    counts = [[run["devices"] for run in plan_sweep(m, base)] for m, base in cases]
    assert any(m & (m - 1) and m in c for (m, _), c in zip(cases, counts))  # a non-power max kept
    assert any(m not in c for (m, _), c in zip(cases, counts))  # a count dropped: no full batch
    assert any(len(c) >= 4 for c in counts)


# --- 5.5 (stretch) the serial fraction --------------------------------------------------------------------------


def f_solution(speedup, devices):
    return (1 / speedup - 1 / devices) / (1 - 1 / devices)


def f_times_n(speedup, devices):
    return (devices / speedup - 1) / (devices - 1)


def f_numpy(speedup, devices):
    s, n = np.float64(speedup), np.float64(devices)
    return np.divide(np.reciprocal(s) - np.reciprocal(n), 1.0 - np.reciprocal(n))


def f_no_division(speedup, devices):
    return 1 / speedup - 1 / devices


def f_efficiency(speedup, devices):
    return speedup / devices


def f_sign(speedup, devices):
    return (1 / speedup - 1 / devices) / (1 - devices)


def f_constant(speedup, devices):
    return 0.1


def f_fractions(speedup, devices):
    from fractions import Fraction

    s, n = Fraction(float(speedup)), Fraction(int(devices))
    return (1 / s - 1 / n) / (1 - 1 / n)


def f_two_devices_always(speedup, devices):
    return (1 / speedup - 1 / 2) / (1 - 1 / 2)  # ignores the device count it was given


def f_amdahl_rounded(speedup, devices):
    return round((1 / speedup - 1 / devices) / (1 - 1 / devices), 2)


@pytest.mark.parametrize("answer", [f_solution, f_times_n, f_numpy, f_fractions])
def test_5_5_right(namespace, answer):
    status, message = verdict(namespace, "5.5", "serial_fraction", answer)
    assert status == "passed", message
    assert "2 devices" in message


@pytest.mark.parametrize(
    "answer", [f_no_division, f_efficiency, f_sign, f_constant, f_two_devices_always, f_amdahl_rounded]
)
def test_5_5_wrong(namespace, answer):
    status, message = verdict(namespace, "5.5", "serial_fraction", answer)
    assert status == "failed", message


# --- every exercise: unanswered is "not attempted"; the lesson's namespace missing is not an error ----------------


def _stub(*args):
    """The lesson's stub: a docstring and ``...``."""
    ...


@pytest.mark.parametrize(
    ("exercise_id", "name"),
    [
        ("5.2", "query_runs"),
        ("5.3", "speedup_efficiency"),
        ("5.4", "why_stopped"),
        ("5.6", "rows_per_epoch"),
        ("5.1", "sweep_plan"),
        ("5.5", "serial_fraction"),
    ],
)
def test_unanswered_is_not_attempted(namespace, exercise_id, name):
    assert verdict(namespace, exercise_id, name, _stub)[0] == "not attempted"
    assert _run(exercise_id, {name: ...})[0] == "not attempted"


@pytest.mark.parametrize(
    ("exercise_id", "name", "answer"),
    [
        ("5.3", "speedup_efficiency", s_solution),
        ("5.4", "why_stopped", w_solution),
        ("5.6", "rows_per_epoch", r_solution),
        ("5.1", "sweep_plan", p_solution),
        ("5.5", "serial_fraction", f_solution),
    ],
)
def test_checks_work_without_the_lessons_runs(exercise_id, name, answer):
    assert _run(exercise_id, {name: answer})[0] == "passed"


def test_returning_nothing_is_not_attempted(namespace):
    def empty(*args):
        """A body without a return."""
        print("working on it")

    for exercise_id, name in [
        ("5.3", "speedup_efficiency"),
        ("5.4", "why_stopped"),
        ("5.6", "rows_per_epoch"),
        ("5.1", "sweep_plan"),
    ]:
        assert verdict(namespace, exercise_id, name, empty)[0] == "not attempted"


def test_5_5_reports_each_device_count_s_median_and_says_a_slowdown_is_outside_amdahl(namespace):
    right = pd.DataFrame({"devices": [1, 1, 2, 2, 4], "speedup": [1.0, 1.0, 0.5, 0.7, 2.0]})
    status, message = verdict({**namespace, "right": right}, "5.5", "serial_fraction", f_solution)
    assert status == "passed", message
    assert "2 devices 2.33, 4 devices 0.33" in message  # 2 devices: median speedup 0.6
    assert "above 1: those runs were slower than one device" in message
    status, message = verdict(
        {**namespace, "right": right[right["devices"] != 2]}, "5.5", "serial_fraction", f_solution
    )
    assert "4 devices 0.33" in message and "above 1" not in message
