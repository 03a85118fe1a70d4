"""The preflight's rows and table (helpers.course.preflight) from made-up host reports; the real thing runs on a
cluster of separate hosts in tests/test_multihost.py."""

from __future__ import annotations

import argparse

import pytest

from helpers.course.preflight import Row, _host_rows, add_arguments, host_facts, table

JAVA = 'openjdk version "17.0.15" 2025-04-15'
EXPECT = {"use_gpu": True, "tracking_uri": "http://mlflow:5000", "data_dir": "/data/flowers", "pretrained": True}


def facts(host: str, **changes) -> dict:
    healthy = {
        "host": host, "resolves_to": "10.0.0.3", "versions": {"python": "3.11.7", "torch": "2.13.0"}, "java": JAVA,
        "gpus": ["0"], "mlflow": "", "data": 5, "weights": ["mobilenet_v2-b0353104.pth"],
    }  # fmt: skip
    return {**healthy, **changes}


def test_a_healthy_host_passes_every_row_and_each_fault_fails_only_its_own(monkeypatch):
    monkeypatch.delenv("COURSE_NETWORK_INTERFACE", raising=False)
    driver = facts("driver")
    rows = _host_rows(driver, [facts("w1"), facts("w1")], EXPECT)  # two tasks of one host: one row per item
    items = ("versions", "java", "host name", "gpus", "mlflow", "data", "weights")
    assert [(r.item, r.ok) for r in rows] == [(item, True) for item in items]
    faults = {
        "versions": {"versions": {"python": "3.11.7", "torch": "2.12.0"}},
        "java": {"java": 'openjdk version "11.0.2"'},
        "host name": {"resolves_to": "127.0.1.1"},
        "gpus": {"gpus": []},
        "mlflow": {"mlflow": "ConnectionError: refused"},
        "data": {"data": 0},
        "weights": {"weights": []},
    }
    for item, change in faults.items():
        failed = [r for r in _host_rows(driver, [facts("w2", **change)], EXPECT) if not r.ok]
        assert [(r.item, r.host) for r in failed] == [(item, "w2")], item
        assert failed[0].fix and "\n" not in failed[0].fix
    assert "torch 2.12.0 (driver 2.13.0)" in _host_rows(driver, [facts("w2", **faults["versions"])], EXPECT)[0].found


def test_a_named_interface_makes_a_loopback_host_name_harmless(monkeypatch):
    monkeypatch.setenv("COURSE_NETWORK_INTERFACE", "eth0")
    rows = _host_rows(facts("driver"), [facts("w2", resolves_to="127.0.1.1")], EXPECT)
    assert all(r.ok for r in rows)


def test_the_table_shows_each_rows_result_and_the_fix_only_where_it_failed():
    text = table([Row("java", "w1", True, JAVA, "never shown"), Row("mlflow", "w2", False, "refused", "start it"),
                  Row("launchers", "all", None, "not run")])  # fmt: skip
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["item", "host", "result", "found"]
    assert "never shown" not in text and lines[2].rstrip().endswith("start it")
    assert [line.split()[2] for line in lines[1:]] == ["ok", "FAIL", "skip"]


def test_this_host_reports_its_versions_and_java():
    found = host_facts({"data_dir": None})
    assert found["versions"]["torch"] and found["versions"]["python"].startswith("3.")
    assert found["java"].startswith(("openjdk", "java")) and found["mlflow"] == ""


@pytest.mark.parametrize("bound", ["0", "-5", "soon"])
def test_a_bound_that_is_not_a_positive_number_is_one_line_that_says_what_to_give(bound, capsys):
    parser = argparse.ArgumentParser(prog="preflight")
    add_arguments(parser)
    assert parser.parse_args(["--params", "p.yaml", "--bound", "45"]).bound == 45
    with pytest.raises(SystemExit):
        parser.parse_args(["--params", "p.yaml", "--bound", bound])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        error == f"preflight: error: argument --bound: {bound!r} is not a positive number of seconds (e.g. --bound 90)"
    )
