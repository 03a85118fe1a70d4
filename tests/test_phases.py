"""helpers.phases: the four phases of a job from the driver's and rank 0's clock readings."""

from __future__ import annotations

import math
import time

import pytest

from helpers.phases import JOB_CLOCKS, PHASES, RANK_CLOCKS, RankClock, job_clock, phases


def test_phases_are_the_gaps_between_the_five_readings_in_order():
    readings = dict(zip((JOB_CLOCKS[0], *RANK_CLOCKS, JOB_CLOCKS[1]), (100.0, 103.5, 104.0, 110.0, 112.25)))
    got = phases(readings)
    assert list(got.index) == list(PHASES)
    assert got.tolist() == [3.5, 0.5, 6.0, 2.25]
    assert got.sum() == readings["job_ended_at"] - readings["job_started_at"]


def test_a_missing_reading_leaves_its_two_phases_unknown():
    readings = {"job_started_at": 1.0, "train_called_at": 2.0, "fit_done_at": 5.0, "job_ended_at": 6.0}
    got = phases(readings)
    assert got["start_up_s"] == 1.0 and got["clean_up_s"] == 1.0
    assert math.isnan(got["rendezvous_s"]) and math.isnan(got["fit_s"])


def test_rank_clock_reads_in_order_and_reports_only_what_it_read():
    clock = RankClock()
    assert set(clock.metrics()) == {"train_called_at"}
    clock.connected()
    clock.fit_done()
    values = [clock.metrics()[name] for name in RANK_CLOCKS]
    assert values == sorted(values) and values[0] <= time.time()


def test_job_clock_reads_the_end_also_when_the_block_raises():
    with pytest.raises(RuntimeError), job_clock() as clock:
        raise RuntimeError("the job failed")
    assert clock.ended_at is not None and clock.ended_at >= clock.started_at
