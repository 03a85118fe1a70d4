"""One interface rule for every launcher (helpers.network); across real hosts in tests/test_multihost.py."""

from __future__ import annotations

import pytest

from helpers import CourseInputError
from helpers.network import DRIVER_HOST_ENV, INTERFACE_ENV, driver_address, interface_address, pin_interface


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (INTERFACE_ENV, DRIVER_HOST_ENV, "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_named_interface_wins_for_gloo_and_nccl(clean_env):
    clean_env.setenv(INTERFACE_ENV, "lo")
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    assert pin_interface() == "lo"
    import os

    assert os.environ["GLOO_SOCKET_IFNAME"] == os.environ["NCCL_SOCKET_IFNAME"] == "lo"


def test_a_peer_on_loopback_needs_no_choice_and_a_users_setting_is_kept(clean_env):
    import os

    clean_env.setenv("MASTER_ADDR", "localhost")
    assert pin_interface() is None and "GLOO_SOCKET_IFNAME" not in os.environ
    clean_env.setenv("GLOO_SOCKET_IFNAME", "mine")
    clean_env.setenv(INTERFACE_ENV, "lo")
    pin_interface()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine"


def test_the_driver_address_can_be_set_or_taken_from_the_named_interface(clean_env):
    clean_env.setenv(INTERFACE_ENV, "lo")
    assert driver_address("spark-master") == "127.0.0.1"
    clean_env.setenv(DRIVER_HOST_ENV, "10.0.0.9")
    assert driver_address("spark-master") == "10.0.0.9"


def test_an_unknown_interface_is_one_line_naming_the_ones_there_are():
    with pytest.raises(CourseInputError, match=r"COURSE_NETWORK_INTERFACE=nope0: .* it has .*\blo\b") as error:
        interface_address("nope0")
    assert "\n" not in str(error.value)
