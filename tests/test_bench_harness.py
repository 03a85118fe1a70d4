"""The benchmark harness's arithmetic (medians, ratios, targets) and its alternating order. Nothing is timed."""

from __future__ import annotations

import pytest

from benchmarks.common import Comparison, alternate, median, meets, ratio, shortfall


def test_median_odd_and_even():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_ratio_is_of_medians():
    assert ratio([10.0, 100.0, 12.0, 11.0, 9.0], [5.0, 5.0, 4.0, 6.0, 1000.0]) == pytest.approx(11.0 / 5.0)
    with pytest.raises(ZeroDivisionError):
        ratio([1.0], [0.0])


def test_targets_and_shortfall():
    assert meets(0.7, 0.7, ">=") and not meets(0.69, 0.7, ">=")
    assert meets(1.10, 1.10, "<=") and not meets(1.2, 1.10, "<=")
    assert shortfall(0.35, 0.7, ">=") == pytest.approx(0.5)
    assert shortfall(1.21, 1.10, "<=") == pytest.approx(0.1)
    assert shortfall(2.0, 1.6, ">=") == 0.0
    with pytest.raises(ValueError):
        meets(1.0, 1.0, "==")


def test_alternate_interleaves_and_repeats_at_least_five_times():
    calls = []
    variants = {name: (lambda n=name: calls.append(n) or float(len(calls))) for name in "AB"}
    values = alternate(variants, repeats=2, warmup=True, log=lambda _: None)
    assert calls == ["A", "B"] + ["A", "B"] * 5  # one warm-up each, then 5 (the minimum) alternating
    assert values == {"A": [3.0, 5.0, 7.0, 9.0, 11.0], "B": [4.0, 6.0, 8.0, 10.0, 12.0]}


def test_alternate_minimum_is_lowered_only_on_request():
    calls = []
    values = alternate({"A": lambda: calls.append("A") or 1.0}, repeats=1, warmup=False, log=lambda _: None, minimum=1)
    assert calls == ["A"] and values == {"A": [1.0]}  # --quick: one call, no warm-up


def test_bench_parts_are_listed_in_the_docstring():
    import benchmarks.__main__ as bench_main

    assert bench_main.PARTS == ("loading", "lightning", "horovod", "course", "grading", "launchers", "multihost")
    assert all(f"``{part}``" in bench_main.__doc__ for part in bench_main.PARTS)  # the parts and the --only list


def test_alternate_records_each_entry_of_a_dict_measurement():
    counter = iter(range(100))
    values = alternate(
        {"run": lambda: {"64": float(next(counter)), "256": float(next(counter))}}, warmup=False, log=lambda _: None
    )
    assert values == {"run@64": [0.0, 2.0, 4.0, 6.0, 8.0], "run@256": [1.0, 3.0, 5.0, 7.0, 9.0]}


def test_comparison_verdict():
    result = Comparison("x", "s", "new", "old", 1.10, "<=", {"new": [1.2, 1.1, 1.3], "old": [1.0, 1.0, 1.0]})
    assert result.ratio == pytest.approx(1.2)
    assert result.verdict == "MISS"
    data = result.to_json()
    assert data["passed"] is False and data["shortfall"] == pytest.approx(0.1 / 1.1)


def test_run_sampled_sees_a_child_s_memory_and_reports_failures():
    import sys

    from benchmarks.course_timing import run_sampled

    # the child holds ~300 MiB for a second: the sampler must see it in the tree and in the largest process
    hold = "import time; block = bytearray(300 * 1024 * 1024); block[::4096] = b'x' * len(block[::4096]); time.sleep(1)"
    run = run_sampled([sys.executable, "-c", hold])
    assert run["peak_tree_mib"] >= 250
    assert run["peak_process_mib"] >= 250
    with pytest.raises(RuntimeError, match="exit 3"):
        run_sampled([sys.executable, "-c", "print('about to fail'); raise SystemExit(3)"])


def test_the_224_px_verdict_follows_the_two_ratios():
    from benchmarks.loading import _size_verdict

    assert "weigh less" in _size_verdict(0.023, 0.060)  # 1b vs 1d of the run in results.md
    assert "about the same ratio" in _size_verdict(0.275, 0.236)  # 1a vs 1c
    assert "fell further behind" in _size_verdict(0.3, 0.2)
