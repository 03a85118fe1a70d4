"""Which address and network interface the course's processes use to reach the other hosts of a cluster.

One rule for every launcher: the interface is the one named by ``COURSE_NETWORK_INTERFACE`` (a parameter file's
``runner.env``), else the one this host routes through to reach its peer (the Spark master for the driver,
``MASTER_ADDR`` for a training process). What a hostname resolves to is never trusted: on stock Debian and Ubuntu
hosts it is ``127.0.1.1``, and torch's Gloo, left to itself, binds there and cannot be reached from other hosts.

Finding the route sends nothing: connecting a UDP socket only asks the kernel which source address it would use.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from helpers import CourseInputError

__all__ = [
    "DRIVER_HOST_ENV",
    "INTERFACE_ENV",
    "driver_address",
    "interface_address",
    "interface_for",
    "is_loopback",
    "pin_interface",
    "route_address",
]

INTERFACE_ENV = "COURSE_NETWORK_INTERFACE"  # the interface every launcher uses (e.g. eth0), when set
DRIVER_HOST_ENV = "COURSE_DRIVER_HOST"  # the address the Spark driver advertises to executors, when set
# What each communication library reads to choose its interface.
_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) means this machine only (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    return ipaddress.ip_address(address).is_loopback


def route_address(peer: str, port: int = 9) -> str:
    """The address of this host that packets to ``peer`` leave from (nothing is sent).

    Args:
        peer: a host name or address.
        port: any port (UDP ``connect`` only picks a route).

    Returns:
        The local IPv4 address.

    Raises:
        CourseInputError: ``peer`` does not resolve, or no route leads to it.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, port))
            return probe.getsockname()[0]
    except OSError as exc:
        raise CourseInputError(
            f"no route from {socket.gethostname()} to {peer} ({exc}): check the name and the network, or set "
            f"{INTERFACE_ENV} in the parameter file's runner.env."
        ) from exc


def interface_for(address: str) -> str:
    """The name of this host's network interface that holds ``address``.

    Raises:
        CourseInputError: no interface holds it.
    """
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(entry.family == socket.AF_INET and entry.address == address for entry in addresses):
            return name
    raise CourseInputError(f"no network interface of {socket.gethostname()} has the address {address}.")


def interface_address(name: str) -> str:
    """The IPv4 address of this host's interface ``name``.

    Raises:
        CourseInputError: no such interface, or it has no IPv4 address, with the interfaces there are.
    """
    import psutil

    interfaces = psutil.net_if_addrs()
    found = [entry.address for entry in interfaces.get(name, []) if entry.family == socket.AF_INET]
    if not found:
        raise CourseInputError(
            f"{INTERFACE_ENV}={name}: {socket.gethostname()} has no interface of that name with an IPv4 address; it "
            f"has {', '.join(sorted(interfaces))}."
        )
    return found[0]


def driver_address(master_host: str) -> str:
    """The address a Spark driver advertises so that the executors on other hosts can call it back.

    ``COURSE_DRIVER_HOST`` if set, else the address of ``COURSE_NETWORK_INTERFACE`` if set, else the address this
    host routes through to reach the master.

    Args:
        master_host: the master's host name or address.

    Returns:
        An address.
    """
    if os.environ.get(DRIVER_HOST_ENV):
        return os.environ[DRIVER_HOST_ENV]
    if os.environ.get(INTERFACE_ENV):
        return interface_address(os.environ[INTERFACE_ENV])
    return route_address(master_host)


def pin_interface(peer: str | None = None) -> str | None:
    """Make Gloo and NCCL in this process use the interface of :mod:`this module's rule <helpers.network>`.

    Call it in a training process before its process group starts. Names the user already set are kept.

    Args:
        peer: the host the process talks to (default: ``MASTER_ADDR``).

    Returns:
        The interface set, or None when there is nothing to choose (no peer, or the peer is this host's loopback).
    """
    peer = peer or os.environ.get("MASTER_ADDR")
    chosen = os.environ.get(INTERFACE_ENV)
    if not chosen:
        if not peer or is_loopback(peer):
            return None
        chosen = interface_for(route_address(peer))
    for name in _IFNAME_ENV:
        os.environ.setdefault(name, chosen)
    return chosen
