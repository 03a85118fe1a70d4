"""The TCP ports the course's launchers need open between a cluster's hosts, and how each range is pinned.

This is the list behind the *Ports* table of docs/instructor.md (section 2), and the allow-list of the firewall the
multi-host tests run lessons 4, 5 and 6 behind (``MultiHostCluster.firewall``): a range missing here fails a lesson
there. Where the ranges come from:

* Spark: the master's port, and the driver's and executors' ports pinned by ``COURSE_SPARK_PORTS``
  (:func:`helpers.spark.port_conf`).
* Every process that binds "any free port" (Spark workers, torch's rendezvous store and Gloo's connections under
  TorchDistributor, DeepSpeed and Ray Train, Horovod's Gloo connections) gets one from the host's ephemeral range,
  ``net.ipv4.ip_local_port_range``: pin it with ``sysctl`` on every host.
* Horovod on Spark's driver service, rendezvous server and task services: random ports in 1024-65535 in stock
  Horovod (``horovod.runner.util.network.find_port``); the Horovod that ``make setup`` builds takes them from
  ``COURSE_HOROVOD_PORTS=P-Q`` (scripts/horovod_port_range.py).
* Ray on Spark (``ray.util.spark.cluster_init``): the head's services at random in 9000-10000 and its workers in
  10002-19999; a worker node's dashboard agent at random in 10002-20000 and its workers in 1000 ports from 20000 up
  (one block per Ray node on the host); the raylets' own ports at random from the first ephemeral port to 65535.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from helpers import CourseInputError
from helpers.spark import PORTS_ENV, SPARK_PORT_RETRIES

__all__ = ["HOROVOD_PORTS_ENV", "PortRange", "horovod_ports", "needed_ports"]

HOROVOD_PORTS_ENV = "COURSE_HOROVOD_PORTS"  # P-Q: Horovod on Spark's services, in the Horovod `make setup` builds


@dataclass(frozen=True)
class PortRange:
    """Ports ``first``..``last`` (inclusive) that ``who`` listens on and the other hosts connect to."""

    who: str
    first: int
    last: int


def horovod_ports(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """The range ``COURSE_HOROVOD_PORTS=P-Q`` pins Horovod on Spark's services to, or None where it is unset.

    Raises:
        CourseInputError: the value is not a range of ports, with an example.
    """
    value = env.get(HOROVOD_PORTS_ENV, "").strip()
    if not value:
        return None
    first, dash, last = value.partition("-")
    if not (dash and first.isdigit() and last.isdigit() and 1024 <= int(first) <= int(last) <= 65535):
        raise CourseInputError(f"{HOROVOD_PORTS_ENV}={value!r}: give a range of free ports such as 7200-7219.")
    return int(first), int(last)


def needed_ports(
    env: Mapping[str, str],
    master_url: str,
    mlflow_uri: str,
    ephemeral: tuple[int, int],
    ray_nodes_per_host: int = 0,
) -> list[PortRange]:
    """Every port range the launchers need between the hosts of a cluster.

    Args:
        env: the parameter file's ``runner.env`` (``COURSE_SPARK_PORTS``, ``COURSE_HOROVOD_PORTS``).
        master_url: the Spark master, ``spark://host:port``.
        mlflow_uri: the tracking server, ``http://host:port``.
        ephemeral: every host's ``net.ipv4.ip_local_port_range``.
        ray_nodes_per_host: the most Ray on Spark nodes one host runs; 0 where Ray on Spark does not run.

    Raises:
        CourseInputError: ``COURSE_SPARK_PORTS`` is not set (Spark's ports are then free ports of any range).
    """
    if PORTS_ENV not in env:
        raise CourseInputError(f"Set {PORTS_ENV} in the parameter file's runner.env to pin Spark's ports first.")
    spark = int(env[PORTS_ENV])
    horovod = horovod_ports(env) or (1024, 65535)
    master, mlflow = urlparse(master_url).port or 7077, urlparse(mlflow_uri).port or 5000
    ranges = [
        PortRange("Spark master", master, master),
        PortRange("Spark master web UI", 8080, 8080),
        PortRange("Spark driver and executors", spark, spark + 2 + SPARK_PORT_RETRIES),
        PortRange("MLflow tracking server", mlflow, mlflow),
        PortRange("Horovod on Spark's services", *horovod),
        PortRange("any free port: Spark workers, rendezvous stores, Gloo", *ephemeral),
    ]
    if ray_nodes_per_host:
        ranges += [
            PortRange("Ray on Spark: head services, agents, workers", 9000, 20000 + 1000 * ray_nodes_per_host - 1),
            PortRange("Ray on Spark: raylets", ephemeral[0], 65535),
        ]
    return ranges
