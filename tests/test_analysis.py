"""Lesson 5's analysis helpers: the runs table, speedup and efficiency, why runs stopped.

The fast tests use made-up tables and histories. The slow ones read MLflow runs written by real trainings into a
store of their own: two launched through ``HorovodRunner`` (1 process stopped by the threshold, 2 processes
stopped by patience) and one plain in-process ``train()`` call run to max_epochs, recorded as a second 1-device
run (``launcher="plain"``) with ``record_run``. The runs differ in their early-stopping settings on purpose (each
is built to stop for one reason), so their speedups mean nothing physically: the tests check the arithmetic
against values computed independently from ``MlflowClient``, not the scaling of the machine.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest

from helpers import CourseInputError
from helpers.analysis import (
    FIXED_STEPS,
    ONE_PASS,
    runs_table,
    speedup_table,
    stop_reason,
    stop_reasons,
)
from helpers.datamodule import FixedStepsDataModule, PetastormDataModule

EXPERIMENT = "test-lesson-5"
SWEEP = "sweep-test"


# --- fast: pure functions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("losses", "settings", "expected"),
    [
        ([0.9, 0.7, 0.45], dict(stopping_threshold=0.5, max_epochs=10), ("stopping_threshold", 2)),
        ([0.9, 0.9, 0.45], dict(stopping_threshold=0.45, max_epochs=3), ("max_epochs", 2)),  # not *below*
        ([0.9, 0.895, 0.89, 0.5], dict(patience=2, max_epochs=10), ("patience", 2)),  # 0.005 < min_delta
        ([0.9, 0.8, 0.85, 0.7, 0.71, 0.72], dict(patience=2, max_epochs=10), ("patience", 5)),  # wait resets
        ([0.9, 0.89, 0.3], dict(patience=1, stopping_threshold=0.5, max_epochs=10), ("patience", 1)),
        ([0.9, 0.3], dict(patience=1, stopping_threshold=0.5, max_epochs=10), ("stopping_threshold", 1)),
        ([0.9, 0.7, 0.5], dict(patience=2, max_epochs=3), ("max_epochs", 2)),
        ([0.9, 0.7], dict(patience=2, max_epochs=5), ("unknown", 1)),  # interrupted: history ends early
        ([0.9, float("nan")], dict(patience=5, max_epochs=5), ("non_finite_metric", 1)),
        ([0.9, 0.7], dict(patience=2, stopping_threshold=float("nan")), ("max_epochs", 1)),  # NaN = no threshold
    ],
)
def test_stop_reason_replays_lightnings_rules(losses, settings, expected):
    assert stop_reason(losses, **{"min_delta": 0.01, "patience": 10, **settings}) == expected


def test_speedup_and_efficiency_from_a_made_up_table():
    table = pd.DataFrame(
        {"devices": [4, 1, 2, 1, 8], "wall_time_s": [30.0, 100.0, 60.0, 120.0, 20.0], "epoch_mode": ONE_PASS},
        index=[7, 3, 5, 1, 9],
    )
    out = speedup_table(table)
    baseline = statistics.median([100.0, 120.0])  # two 1-device runs: their median
    for _, row in out.iterrows():
        assert row["speedup"] == pytest.approx(baseline / row["wall_time_s"])
        assert row["efficiency"] == pytest.approx(baseline / row["wall_time_s"] / row["devices"])
    assert list(out.index) == list(table.index) and "speedup" not in table  # a copy, same rows


def test_speedup_groups_and_shared_baseline():
    table = pd.DataFrame(
        {"devices": [1, 2, 2], "wall_time_s": [40.0, 25.0, 50.0], "epoch_mode": [ONE_PASS, ONE_PASS, FIXED_STEPS]}
    )
    by_mode = speedup_table(table)
    assert by_mode.loc[2, "speedup"] == 1.0  # fixed_steps alone: its own smallest device count is the baseline
    assert by_mode.loc[2, "efficiency"] == 1.0
    shared = speedup_table(table, group=None)
    assert shared["speedup"].tolist() == pytest.approx([1.0, 1.6, 0.8])
    assert shared["efficiency"].tolist() == pytest.approx([1.0, 0.8, 0.4])
    assert speedup_table(table, baseline_time=80.0)["speedup"].tolist() == pytest.approx([2.0, 3.2, 1.6])
    with pytest.raises(CourseInputError, match="wall_time_s"):
        speedup_table(table.drop(columns="wall_time_s"))


def _repeated_sweep(walls_on_2: list[float], placement: str = "local") -> pd.DataFrame:
    """A made-up sweep of 3 seeds on 1 and 2 devices, 10 epochs each: the 1-device runs take 40, 30 and 10 ms a
    step (median 30), the 2-device runs ``walls_on_2`` seconds for 50 steps; listed so that the first and the last
    row are no median."""
    return speedup_table(
        pd.DataFrame(
            {
                "devices": [1, 1, 1, 2, 2, 2],
                "seed": [0, 1, 2, 0, 1, 2],
                "batch_size": 32,
                "steps_per_epoch": [10, 10, 10, 5, 5, 5],
                "epochs_run": 10,
                "wall_time_s": [4.0, 3.0, 1.0, *walls_on_2],
                "job_time_s": [10.0, 9.0, 8.0, 12.0, 11.0, 10.0],
                "placement": placement,
                "epoch_mode": ONE_PASS,
            }
        )
    )


@pytest.mark.parametrize(
    ("walls_on_2", "expected", "startup"),
    [
        ([4.0, 4.0, 1.0], "80.0 ms per step on 2 devices against 30.0 ms on 1 (fit time over steps, validation "
         "included), so 2 devices trained 0.75 x the images per second of 1: slower, as their 1-device run already "
         "computed on all 2 cores of this machine (2 torch threads), so the 2 processes split those cores", 8.0),
        ([2.0, 1.5, 1.0], "30.0 ms per step on 2 devices against 30.0 ms on 1 (fit time over steps, validation "
         "included), so 2 devices trained 2.00 x the images per second of 1: faster, although their 1-device run "
         "already computed on all 2 cores", 9.5),
    ],
)  # fmt: skip
def test_the_sentence_on_the_lessons_runs_compares_the_medians_of_each_device_count(
    monkeypatch, walls_on_2, expected, startup
):
    from helpers.analysis.claims import step_scaling_report

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    steps = pd.DataFrame(
        {"global_batch": 64, "processes": [1, 2], "step_ms": [20.0, 15.0], "compute_ms": [20.0, 10.0],
         "comm_ms": [0.0, 5.0], "job_s": 9.0, "steps_s": 3.0}
    )  # fmt: skip
    line = step_scaling_report(steps, sweep=_repeated_sweep(walls_on_2))[-1]
    assert line.startswith("The lesson's runs above (batch 32 per device, medians over 3 runs per device count): ")
    assert expected in line
    assert line.endswith(f". {startup:.1f} s of the 2-device job's 11.0 s went to starting processes and readers.")
    elsewhere = step_scaling_report(steps, sweep=_repeated_sweep(walls_on_2, placement="spark"))[-1]
    assert f"images per second of 1. {startup:.1f} s" in elsewhere and "cores" not in elsewhere  # not local: no cores


def test_the_scaling_plot_draws_the_medians_as_its_line_and_each_run_as_a_marker():
    import matplotlib.pyplot as plt

    from helpers.analysis import plot_scaling

    fig = plot_scaling(_repeated_sweep([4.0, 4.0, 1.0]))
    left, right = fig.axes
    lines = {line.get_label(): line for line in left.get_lines()}
    median, runs = lines["one_pass median per device count"], lines["one_pass each run (seed)"]
    assert list(median.get_xdata()) == [1, 2] and list(median.get_ydata()) == [3.0, 4.0]
    assert median.get_linestyle() == "-" and runs.get_linestyle() == "None" and len(runs.get_xdata()) == 6
    assert [line.get_label() for line in right.get_lines()] == [
        "one_pass median per device count",
        "one_pass each run (seed)",
        "linear ideal: speedup = n",
    ]
    once = plot_scaling(_repeated_sweep([4.0, 4.0, 1.0]).drop_duplicates("devices"))
    assert [line.get_label() for line in once.axes[0].get_lines()] == ["measured one_pass", "linear ideal: t1 / n"]
    plt.close(fig)
    plt.close(once)


class _Rows:
    """Stands in for a Petastorm converter: the data modules only take its length when they are built."""

    def __len__(self) -> int:
        return 1438


def test_each_seed_of_a_device_count_gets_a_run_name_and_checkpoint_folder_of_its_own(monkeypatch):
    from helpers.analysis import run_training
    from helpers.worker import TrainSettings

    launched = []
    monkeypatch.setattr(
        "helpers.analysis.runs.launch_training",
        lambda launcher, devices, *data, on_spark: launched.append(data[-1].resolved(launcher, devices)),
    )
    monkeypatch.setattr("helpers.analysis.runs.record_run", lambda result, **tags: None)
    stopping = {"min_delta": 0.01, "patience": 2, "stopping_threshold": None}
    settings = TrainSettings(early_stopping=stopping, mlflow_experiment=EXPERIMENT)
    for seed in (0, 1):
        run_training(2, _Rows(), _Rows(), 10, settings.replace(seed=seed), sweep=SWEEP)
    assert [run.run_name for run in launched] == [f"one_pass-devices2-seed{seed}-{SWEEP}" for seed in (0, 1)]
    assert launched[0].default_dir != launched[1].default_dir


@pytest.mark.parametrize(
    ("on_spark", "use_gpu", "placement"), [(False, False, "local"), (False, True, "local-gpu"), (True, False, "spark")]
)
def test_a_run_s_placement_says_where_and_on_what_it_trained(monkeypatch, on_spark, use_gpu, placement):
    from helpers.analysis import run_training
    from helpers.worker import TrainSettings

    recorded = []
    monkeypatch.setattr("helpers.analysis.runs.launch_training", lambda *args, on_spark: None)
    monkeypatch.setattr("helpers.analysis.runs.record_run", lambda result, **tags: recorded.append(tags["placement"]))
    stopping = {"min_delta": 0.01, "patience": 2, "stopping_threshold": None}
    settings = TrainSettings(early_stopping=stopping, mlflow_experiment=EXPERIMENT, use_gpu=use_gpu)
    run_training(2, _Rows(), _Rows(), 10, settings, sweep=SWEEP, on_spark=on_spark)
    assert recorded == [placement]  # the sentence on the sweep explains shared cores only for "local"


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_fixed_steps_epochs_read_n_squared_passes(devices):
    right = PetastormDataModule(_Rows(), _Rows(), batch_size=32, device_count=devices)
    wrong = FixedStepsDataModule(_Rows(), _Rows(), batch_size=32, device_count=devices)
    assert (right.batch_size, right.steps_per_epoch) == (32, math.ceil(1438 / (32 * devices)))
    assert (wrong.batch_size, wrong.steps_per_epoch) == (32 * devices, math.ceil(1438 / 32))
    passes = wrong.steps_per_epoch * wrong.batch_size * devices / 1438
    assert passes == pytest.approx(devices**2, rel=0.03)


def test_gpu_and_precision_settings_are_checked_before_a_job_starts():
    from helpers.analysis import run_training
    from helpers.devices import gpu_count
    from helpers.worker import TrainSettings

    stopping = {"min_delta": 0.01, "patience": 2, "stopping_threshold": None}
    with pytest.raises(CourseInputError, match=r"^mixed_precision='yes': pass True or False\.$"):
        TrainSettings(mixed_precision="yes")
    devices = gpu_count() + 1  # one process more than this machine has GPUs
    settings = TrainSettings(use_gpu=True, early_stopping=stopping, mlflow_experiment=EXPERIMENT)
    with pytest.raises(CourseInputError, match=rf"np=-{devices}, use_gpu=True\) asks for {devices} local process"):
        run_training(devices, _Rows(), _Rows(), 10, settings, sweep=SWEEP)
    with pytest.raises(CourseInputError, match=r"pass a dict with exactly \('min_delta', 'patience'"):
        run_training(1, _Rows(), _Rows(), 10, settings.replace(early_stopping=None), sweep=SWEEP)
    with pytest.raises(CourseInputError, match=r"^launcher='ray': use one of 'horovod', 'torch_distributor'\.$"):
        run_training(1, _Rows(), _Rows(), 10, settings.replace(use_gpu=False), sweep=SWEEP, launcher="ray")


def test_runs_table_of_a_missing_experiment_is_empty(tmp_path):
    table = runs_table("no-such-experiment", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert table.empty and {"devices", "wall_time_s", "logged_stop_reason"} <= set(table.columns)


# --- slow: real trainings ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(spark, tmp_path_factory):
    """Three real trainings in a store of their own: (uri, {expected stop reason: TrainResult})."""
    from helpers.analysis import record_run, run_training
    from helpers.loaders import prepare_data, steps_per_epoch
    from helpers.model import LitClassificationModel
    from helpers.training import train
    from helpers.worker import TrainSettings

    uri = f"sqlite:///{tmp_path_factory.mktemp('lesson5-mlflow') / 'mlflow.db'}"
    _, train_converter, val_converter, class_names = prepare_data(None, num_devices=2, spark=spark)
    base = TrainSettings(
        batch_size=64, image_size=8, learning_rate=0.05, mlflow_experiment=EXPERIMENT, tracking_uri=uri
    )
    data = (train_converter, val_converter, len(class_names))
    results = {
        # val_loss starts near ln(10) = 2.3 < 5: the threshold fires after the first epoch
        "stopping_threshold": run_training(
            1,
            *data,
            base.replace(max_epochs=3, early_stopping={"min_delta": 0.01, "patience": 5, "stopping_threshold": 5.0}),
            sweep=SWEEP,
        ),
        # no epoch can beat the best by 10: after the first epoch, patience 1 runs out at the second; in mixed
        # precision (bfloat16 on the CPU), which must not change that; with the other launcher (Lightning DDP
        # under TorchDistributor, local mode), tagged as such
        "patience": run_training(
            2,
            *data,
            base.replace(
                max_epochs=3,
                early_stopping={"min_delta": 10.0, "patience": 1, "stopping_threshold": None},
                mixed_precision=True,
            ),
            sweep=SWEEP,
            launcher="torch_distributor",
        ),
    }
    model = LitClassificationModel(len(class_names), learning_rate=0.05, image_size=8)
    datamodule = PetastormDataModule(train_converter, val_converter, batch_size=64, image_size=8)
    early_stopping = {"min_delta": 0.0, "patience": 100, "stopping_threshold": None}
    result = train(
        model,
        datamodule,
        max_epochs=2,
        early_stopping=early_stopping,
        mlflow_experiment=EXPERIMENT,
        tracking_uri=uri,
        progress_bar=False,
    )
    record_run(
        result,
        sweep=SWEEP,
        devices=1,
        launcher="plain",
        epoch_mode=ONE_PASS,
        batch_size=64,
        steps=steps_per_epoch(len(train_converter), 64, 1),
        train_rows=len(train_converter),
        max_epochs=2,
        tracking_uri=uri,
        **early_stopping,
    )
    results["max_epochs"] = result
    return uri, results


@pytest.mark.slow
def test_the_trainings_stopped_as_built(recorded):
    _, results = recorded
    assert {reason: r.stopped_reason for reason, r in results.items()} == {r: r for r in results}
    assert [results[r].epochs_run for r in ("stopping_threshold", "patience", "max_epochs")] == [1, 2, 2]


@pytest.mark.slow
def test_runs_table_reads_tags_and_metrics_back(recorded):
    from mlflow.tracking import MlflowClient

    uri, results = recorded
    table = runs_table(EXPERIMENT, uri, sweep=SWEEP).set_index("run_id")
    assert runs_table(EXPERIMENT, uri, sweep="another-sweep").empty
    assert set(table.index) == {r.mlflow_run_id for r in results.values()}
    client = MlflowClient(uri)
    for reason, result in results.items():
        row = table.loc[result.mlflow_run_id]
        run = client.get_run(result.mlflow_run_id)
        assert row["logged_stop_reason"] == reason
        assert row["devices"] == int(run.data.params["world_size"])
        assert row["epochs_run"] == result.epochs_run
        assert row["wall_time_s"] == pytest.approx(result.wall_time_s)
        assert row["best_val_loss"] == pytest.approx(result.best_val_loss)
        assert row["last_val_loss"] == pytest.approx(result.last_val_loss)
        assert row["batch_size"] == int(run.data.params["batch_size"])
        assert run.data.params["precision"] == ("bf16-mixed" if reason == "patience" else "32-true")
    assert table.loc[results["patience"].mlflow_run_id, "launcher"] == "torch_distributor"
    assert table.loc[results["stopping_threshold"].mlflow_run_id, "launcher"] == "horovod"
    assert set(table["placement"]) == {"local"}
    assert client.get_run(results["patience"].mlflow_run_id).data.params["launcher"] == "torch_distributor"
    assert table.loc[results["max_epochs"].mlflow_run_id, "launcher"] == "plain"
    assert math.isnan(table.loc[results["patience"].mlflow_run_id, "stopping_threshold"])
    assert table.loc[results["stopping_threshold"].mlflow_run_id, "stopping_threshold"] == 5.0


@pytest.mark.slow
def test_speedup_and_efficiency_match_the_mlflow_data(recorded):
    from mlflow.tracking import MlflowClient

    uri, results = recorded
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    runs = client.search_runs([experiment_id])
    devices = {run.info.run_id: int(run.data.tags["course.devices"]) for run in runs}
    times = {run.info.run_id: run.data.metrics["wall_time_s"] for run in runs}
    baseline = statistics.median(times[r] for r, n in devices.items() if n == 1)  # two 1-device runs

    out = speedup_table(runs_table(EXPERIMENT, uri, sweep=SWEEP)).set_index("run_id")
    assert len(out) == len(runs) == 3
    for run_id, row in out.iterrows():
        assert row["speedup"] == pytest.approx(baseline / times[run_id])
        assert row["efficiency"] == pytest.approx(baseline / times[run_id] / devices[run_id])


@pytest.mark.slow
def test_stop_reasons_replayed_from_the_metric_histories(recorded):
    from helpers.tracking import metric_history

    uri, results = recorded
    table = runs_table(EXPERIMENT, uri, sweep=SWEEP)
    replayed = stop_reasons(table, uri).set_index("run_id")
    for reason, result in results.items():
        row = replayed.loc[result.mlflow_run_id]
        assert (row["stop_reason"], row["logged_stop_reason"], bool(row["agrees"])) == (reason, reason, True)
        assert row["stop_epoch"] == result.epochs_run - 1
        history = [value for _, value in metric_history(result.mlflow_run_id, "val_loss", uri)]
        assert len(history) == result.epochs_run
        assert history == pytest.approx([epoch["val_loss"] for epoch in result.history])


def test_claim_report_is_computed_from_the_table():
    from helpers.analysis import claim_report

    table = pd.DataFrame(
        {
            "devices": [1, 2, 4],
            "wall_time_s": [100.0, 55.0, 48.0],
            "epochs_run": [10, 10, 12],
            "best_val_loss": [0.50, 0.52, 0.58],
            "min_delta": 0.01,
            "epoch_mode": ONE_PASS,
        }
    )
    lines = claim_report(speedup_table(table))
    text = "\n".join(lines)
    assert "4 devices took 0.48 x the 1-device time" in text and "about half, as claimed" in text
    assert "speedup per epoch 2.50" in text  # 10.0 s per epoch against 4.0 s
    assert "2 devices 91%, 4 devices 52%" in text and "below linear at every device count" in text
    assert "lower by more than min_delta, as claimed" in text
    slower = table.assign(wall_time_s=[100.0, 120.0, 150.0], best_val_loss=[0.50, 0.505, 0.495])
    text = "\n".join(claim_report(speedup_table(slower)))
    assert "not faster at all" in text and "the same within min_delta" in text
    assert claim_report(speedup_table(table[table["devices"] > 1])) == [
        "No 1-device run in the table: nothing to compare against."
    ]


def test_the_claims_use_the_median_of_each_device_count_and_say_what_early_stopping_did():
    from helpers.analysis import claim_report, medians_by_devices

    table = pd.DataFrame(
        {
            "devices": [1, 1, 1, 2, 2, 2],
            "seed": [0, 1, 2, 0, 1, 2],
            "wall_time_s": [10.0, 30.0, 12.0, 9.0, 8.0, 40.0],  # one slow outlier at each count
            "epochs_run": [9, 12, 8, 7, 7, 20],
            "best_val_loss": [0.05, 0.04, 0.06, 0.07, 0.08, 0.06],
            "logged_stop_reason": ["patience"] * 5 + ["max_epochs"],
            "min_delta": 0.01,
            "patience": 2,
            "epoch_mode": ONE_PASS,
        }
    )
    rows = medians_by_devices(speedup_table(table))
    assert rows[["devices", "runs", "by_patience", "wall_time_s", "epochs_run", "best_val_loss"]].values.tolist() == [
        [1, 3, 3, 12.0, 9.0, 0.05],
        [2, 3, 2, 9.0, 7.0, 0.07],
    ]
    text = "\n".join(claim_report(speedup_table(table)))
    assert "Medians over 3 runs (seeds) per device count." in text
    assert "Early stopping (patience 2, min_delta 0.01): patience ended 5 of 6 runs; the other 1 ended" in text
    assert "(median): 9 on 1 device(s), 7 on 2 device(s)" in text
    assert "2 devices took 0.75 x the 1-device time (9.0 s against 12.0 s" in text
    assert "best val_loss 0.050 on 1 device against 0.070 on 2 devices: lower by more than min_delta" in text
    with pytest.raises(CourseInputError, match=r"no column\(s\) \['speedup'\]"):
        medians_by_devices(table)
