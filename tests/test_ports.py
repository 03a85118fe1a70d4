"""The ports list behind the instructor guide's *Ports* table (helpers.ports), and the Horovod that ``make setup``
builds taking its services' ports from ``COURSE_HOROVOD_PORTS``; the list itself is proven on a cluster of
separate hosts behind a firewall in tests/test_multihost.py."""

from __future__ import annotations

import socketserver

import pytest

from helpers import CourseInputError
from helpers.devices import horovod_installed
from helpers.ports import HOROVOD_PORTS_ENV, horovod_ports, needed_ports

ENV = {"COURSE_SPARK_PORTS": "7100", HOROVOD_PORTS_ENV: "7200-7219"}
EPHEMERAL = (40000, 44999)


def spans(env: dict, ray_nodes: int = 0) -> list[tuple[int, int]]:
    return [(r.first, r.last) for r in needed_ports(env, "spark://m:7077", "http://mlflow:5000", EPHEMERAL, ray_nodes)]


def test_the_list_holds_each_pinned_range_and_ray_s_ranges_only_where_ray_runs():
    assert spans(ENV) == [(7077, 7077), (8080, 8080), (7100, 7118), (5000, 5000), (7200, 7219), EPHEMERAL]
    assert spans(ENV, ray_nodes=2)[-2:] == [(9000, 21999), (40000, 65535)]
    assert (1024, 65535) in spans({"COURSE_SPARK_PORTS": "7100"})  # stock Horovod: any port


@pytest.mark.parametrize("value", ["7200", "7219-7200", "80-90", "a-b", "7200-70000"])
def test_a_horovod_range_that_is_not_one_gets_a_one_line_error(value):
    with pytest.raises(CourseInputError, match=r"COURSE_HOROVOD_PORTS=.*such as 7200-7219") as error:
        horovod_ports({HOROVOD_PORTS_ENV: value})
    assert "\n" not in str(error.value)


def test_the_list_needs_spark_s_ports_pinned():
    with pytest.raises(CourseInputError, match="Set COURSE_SPARK_PORTS"):
        spans({HOROVOD_PORTS_ENV: "7200-7219"})


@pytest.mark.skipif(not horovod_installed(), reason="Horovod is not installed")
def test_the_built_horovod_binds_its_services_inside_the_pinned_range(monkeypatch):
    from horovod.runner.util.network import find_port

    monkeypatch.setenv(HOROVOD_PORTS_ENV, "7290-7291")
    servers = [find_port(lambda addr: socketserver.TCPServer(addr, socketserver.BaseRequestHandler))[0]
               for _ in range(2)]  # fmt: skip
    try:
        assert sorted(server.server_address[1] for server in servers) == [7290, 7291]
        with pytest.raises(Exception, match="Unable to find a port"):  # the range is full: it does not go outside
            find_port(lambda addr: socketserver.TCPServer(addr, socketserver.BaseRequestHandler))
    finally:
        for server in servers:
            server.server_close()


@pytest.mark.skipif(not horovod_installed(), reason="Horovod is not installed")
def test_a_horovod_that_ignores_the_range_is_refused_before_a_job_starts(monkeypatch):
    from horovod.runner.util import network

    from helpers.horovod_runner import _check_pinned_ports

    monkeypatch.setenv(HOROVOD_PORTS_ENV, "7200-7219")
    _check_pinned_ports()  # the Horovod make setup builds
    monkeypatch.delattr(network, "_course_port_range")  # as in stock Horovod
    with pytest.raises(CourseInputError, match="picks random ports in 1024-65535.*rebuild Horovod"):
        _check_pinned_ports()
