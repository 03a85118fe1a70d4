"""The settings behind noticing a lost host and running behind a firewall: the heartbeat bound
(``COURSE_HEARTBEAT_TIMEOUT_S``) and Spark's pinned ports (``COURSE_SPARK_PORTS``), read from the environment the
parameter file's ``runner.env`` sets. Hosts really lost are in tests/test_multihost.py."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import CourseInputError
from helpers.lost_hosts import HEARTBEAT_TIMEOUT_ENV, executor_hosts, heartbeat_conf
from helpers.spark import PORTS_ENV, port_conf


def test_without_the_variables_spark_keeps_its_own_defaults(monkeypatch):
    monkeypatch.delenv(HEARTBEAT_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(PORTS_ENV, raising=False)
    assert heartbeat_conf() == {} and port_conf() == {}


def test_the_heartbeat_bound_sets_the_timeout_and_beats_ten_times_within_it(monkeypatch):
    monkeypatch.setenv(HEARTBEAT_TIMEOUT_ENV, "30")
    assert heartbeat_conf() == {
        "spark.network.timeout": "30s",
        "spark.executor.heartbeatInterval": "3s",
        "spark.network.timeoutInterval": "3s",
    }


def test_pinned_ports_give_the_driver_two_and_the_executors_the_next_ones(monkeypatch):
    monkeypatch.setenv(PORTS_ENV, "7100")
    assert port_conf() == {
        "spark.driver.port": "7100",
        "spark.driver.blockManager.port": "7101",
        "spark.blockManager.port": "7102",
        "spark.port.maxRetries": "16",
    }


@pytest.mark.parametrize(
    "name, value", [(HEARTBEAT_TIMEOUT_ENV, "2"), (HEARTBEAT_TIMEOUT_ENV, "30s"), (PORTS_ENV, "80"), (PORTS_ENV, "x")]
)
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(CourseInputError) as caught:
        heartbeat_conf() if name == HEARTBEAT_TIMEOUT_ENV else port_conf()
    message = str(caught.value)
    assert name in message and "\n" not in message, message


def test_the_driver_is_not_counted_as_an_executor_host(spark):
    # a local session's only entry in Spark's executor list is the driver's
    assert executor_hosts(spark) == Counter()
