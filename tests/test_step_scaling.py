"""Lesson 5's "where 2 processes do beat 1": the step timing job and the sentences built from its table.

The fast tests give ``step_scaling_report`` made-up tables; the slow one runs the real timing job (1 and 2 local
Horovod processes over Gloo) at tiny sizes and checks the table it returns.
"""

from __future__ import annotations

import pandas as pd
import pytest

from helpers import CourseInputError
from helpers.analysis.claims import step_scaling_report
from helpers.analysis.step_scaling import STEP_COLUMNS, measure_step_scaling


def _steps(rows):
    return pd.DataFrame(
        [
            dict(global_batch=b, processes=n, compute_ms=c, comm_ms=m, step_ms=c + m, job_s=9.0, steps_s=3.0)
            for b, n, c, m in rows
        ]
    )


def test_sentences_say_where_two_processes_win_and_why():
    steps = _steps([(64, 1, 20.0, 0.0), (64, 2, 10.0, 5.0), (256, 1, 80.0, 0.0), (256, 2, 40.0, 6.0)])
    lines = step_scaling_report(steps)
    assert lines[0].startswith("Global batch 64: 15.0 ms per step on 2 processes against 20.0 ms on 1 (speedup 1.33")
    assert "5.0 ms in the allreduce and waiting, 33% of its step" in lines[0]
    assert "(speedup 1.74; linear would be 40.0 ms)" in lines[1]
    assert "grew 4.0 x" in lines[2] and "from 33% to 13%" in lines[2] and "from 1.33 to 1.74" in lines[2]
    assert "the 2 processes beat 1" in lines[2]
    assert "took 9.0 s, of which its steps took 3.0 s" in lines[3]


def test_a_slower_pair_is_reported_as_such():
    lines = step_scaling_report(_steps([(64, 1, 10.0, 0.0), (64, 2, 9.0, 5.0), (256, 1, 40.0, 0.0), (256, 2, 30, 15)]))
    assert "did not beat 1 here" in lines[2]


def test_the_lessons_runs_get_a_sentence():
    sweep = pd.DataFrame(
        dict(devices=[2, 1], batch_size=32, wall_time_s=[6.0, 4.5], job_time_s=[10.0, 7.0], epochs_run=[3, 3],
             steps_per_epoch=[20, 45])
    )  # fmt: skip
    line = step_scaling_report(_steps([(64, 1, 20.0, 0.0), (64, 2, 10.0, 5.0)]), sweep=sweep)[-1]
    assert "100.0 ms per step on 2 devices against 33.3 ms on 1" in line
    assert "4.0 s of the 2-device job's 10.0 s" in line


@pytest.mark.parametrize(
    "table",
    [_steps([(64, 1, 20.0, 0.0)]), _steps([(64, 2, 10.0, 5.0)]), _steps([(64, 1, 20.0, 0.0)]).drop(columns="comm_ms")],
)
def test_an_incomplete_table_is_refused(table):
    with pytest.raises(CourseInputError, match="global batch 64 needs|lacks"):
        step_scaling_report(table)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovod", "torch_distributor"])
def test_the_timing_job_measures_both_process_counts(launcher, request):
    spark = request.getfixturevalue("spark") if launcher == "torch_distributor" else None  # Horovod needs none
    steps = measure_step_scaling(global_batches=(8, 16), steps=2, warmup=1, launcher=launcher, spark=spark)
    assert list(steps.columns) == STEP_COLUMNS
    assert steps[["global_batch", "processes"]].values.tolist() == [[8, 1], [8, 2], [16, 1], [16, 2]]
    assert (steps["compute_ms"] > 0).all()
    assert (steps["step_ms"] - steps["compute_ms"] - steps["comm_ms"]).abs().max() < 1e-9
    assert (steps["job_s"] > steps["steps_s"]).all()


def test_an_unknown_launcher_is_refused_in_one_line():
    with pytest.raises(CourseInputError, match=r"^launcher='ray'.*horovod.*torch_distributor"):
        measure_step_scaling(launcher="ray")
