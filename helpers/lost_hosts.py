"""Noticing on the driver that a host of a running job is lost, and naming it.

A host that dies, freezes or drops off the network sends nothing: its training processes neither fail nor exit, and
the other ranks wait in their collective until the stall bound (:data:`helpers.jobs.STALL_TIMEOUT_ENV`). Spark
notices sooner or later by itself: the driver removes an executor whose heartbeats stop for ``spark.network.timeout``
(the **heartbeat bound**, :data:`HEARTBEAT_TIMEOUT_ENV` in the parameter file's ``runner.env``), and a standalone
master declares a worker dead after its ``spark.worker.timeout``. :class:`ExecutorLoss` turns that removal into one
line naming the host, so that a launcher can end its job then, whichever bound comes first.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter

from helpers.validation import whole_number

__all__ = ["HEARTBEAT_TIMEOUT_ENV", "LOST_GRACE_S", "ExecutorLoss", "LostHostError", "executor_hosts", "heartbeat_conf"]

#: After a job failed with no error of a rank's own: how long Spark may take to report the executor it lost.
LOST_GRACE_S = 5.0
#: Seconds without an executor's heartbeat before the driver removes it (Spark's ``spark.network.timeout``; unset:
#: Spark's 120 s). Set on the driver; only sessions with a cluster master use it.
HEARTBEAT_TIMEOUT_ENV = "COURSE_HEARTBEAT_TIMEOUT_S"


class LostHostError(RuntimeError):
    """Spark lost the executors of a job's host(s) while the job ran: ``hosts`` names them."""

    def __init__(self, message: str, hosts: list[str]):
        super().__init__(message)
        self.hosts = hosts


def heartbeat_conf() -> dict[str, str]:
    """The Spark settings of the heartbeat bound (:data:`HEARTBEAT_TIMEOUT_ENV`), or {} where it is not set: the
    timeout, a heartbeat every tenth of it, and the driver's check for expired executors as often.

    Raises:
        CourseInputError: the variable is not a whole number of seconds of at least 3.
    """
    value = os.environ.get(HEARTBEAT_TIMEOUT_ENV)
    if value is None:
        return {}
    seconds = whole_number(
        HEARTBEAT_TIMEOUT_ENV, int(value) if value.strip().isdigit() else value, minimum=3,
        hint="It is how long the driver waits for a silent executor, in seconds (Spark's default is 120).",
    )  # fmt: skip
    every = f"{max(1, seconds // 10)}s"
    return {"spark.network.timeout": f"{seconds}s", "spark.executor.heartbeatInterval": every,
            "spark.network.timeoutInterval": every}  # fmt: skip


def _name(address: str) -> str:
    """``worker-2`` for an executor's address where the driver can name it, else the address."""
    try:
        return socket.gethostbyaddr(address)[0]
    except OSError:
        return address


def executor_hosts(spark) -> Counter:
    """How many executors the session has on each host (by name where it resolves), the driver left out."""
    context = spark.sparkContext._jsc.sc()
    driver = context.env().blockManager().blockManagerId()  # the driver's entry is its block manager's
    infos = context.statusTracker().getExecutorInfos()
    return Counter(_name(info.host()) for info in infos if (info.host(), info.port()) != (driver.host(), driver.port()))


class ExecutorLoss:
    """The executors of a session when a job starts; :meth:`check` says which hosts lost theirs since, once fewer
    are left than the job needs.

    Args:
        spark: the SparkSession running the job.
        needed: the executors the job runs on (one per training process on a running cluster).
    """

    def __init__(self, spark, needed: int):
        self.spark = spark
        self.at_start = executor_hosts(spark)
        self.needed = min(needed, sum(self.at_start.values()))

    def wait_for_loss(self, seconds: float) -> LostHostError | None:
        """:meth:`check`, again and again for up to ``seconds``: after a job failed without an error of its own,
        whether a lost host was the reason (Spark fails a lost executor's tasks just before it removes it)."""
        deadline = time.monotonic() + seconds
        while True:
            lost = self.check()
            if lost is not None or time.monotonic() >= deadline:
                return lost
            time.sleep(0.2)

    def check(self) -> LostHostError | None:
        """A :class:`LostHostError` naming the hosts with fewer executors than at the start, or None."""
        now = executor_hosts(self.spark)
        lost = sorted((self.at_start - now).keys())
        if not lost or sum(now.values()) >= self.needed:
            return None
        bound = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "120")
        return LostHostError(
            f"Spark lost the executor(s) on {', '.join(lost)} during the job: the executor or its host died, froze "
            f"or lost its network (no heartbeat within the heartbeat bound, {bound} s, {HEARTBEAT_TIMEOUT_ENV})",
            lost,
        )
