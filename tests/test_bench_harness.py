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


def test_comparison_verdict():
    result = Comparison("x", "s", "new", "old", 1.10, "<=", {"new": [1.2, 1.1, 1.3], "old": [1.0, 1.0, 1.0]})
    assert result.ratio == pytest.approx(1.2)
    assert result.verdict == "MISS"
    data = result.to_json()
    assert data["passed"] is False and data["shortfall"] == pytest.approx(0.1 / 1.1)
