"""Is the work folder the same folder on every host? Checked from every executor before a job relies on it.

On a cluster the training processes write their job reports, rank 0's result and the checkpoints under the work
directory, and the driver reads them back; the Petastorm cache is written by Spark and read by every process. A
worker that lacks the shared mount writes to its own disk instead, and the driver then finds nothing. So before a job,
the driver writes a token, one Spark task per task slot reads it and writes one back, and the driver reads those.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from helpers import CourseInputError
from helpers.network import is_loopback

__all__ = ["SharedFolderError", "check_shared_folder", "shared_folder_report"]

CHECK_DIR = ".shared-check"


class SharedFolderError(CourseInputError):
    """A host of the cluster does not see the work folder as the driver does (the message names it)."""


def _probe(folder: str, token: str):
    """The task: does this host see the driver's token, and can it write one back?"""

    def probe(_rows):
        host = socket.gethostname()
        mine = Path(folder) / CHECK_DIR / f"{token}-{host}-{os.getpid()}"
        try:
            seen = (Path(folder) / CHECK_DIR / token).read_text() == token
            if seen:
                mine.write_text(token)
        except OSError as exc:
            yield host, f"{type(exc).__name__}: {exc.strerror or exc}", ""
            return
        yield host, "" if seen else "the file the driver wrote there is not there", str(mine)

    return probe


def shared_folder_report(spark, folder: str | os.PathLike, tasks: int | None = None) -> dict[str, str]:
    """What every executor's host finds in ``folder``: ``{host: ""}`` where it shares the driver's folder, else
    ``{host: the problem}``.

    Args:
        spark: a SparkSession on a cluster (in local mode, or on a cluster on loopback, there is nothing to check:
            returns ``{}``).
        folder: the folder (the work directory).
        tasks: how many tasks, all at once (a barrier job): default every task slot, so every executor runs one.

    Returns:
        The problem each host has ("" for none).
    """
    from helpers.spark import executor_count, task_slots

    if executor_count(spark) < 1 or is_loopback(spark.conf.get("spark.driver.host")):
        return {}  # local mode, or a cluster on this machine's loopback: one file system
    folder = Path(folder)
    token = uuid.uuid4().hex
    (folder / CHECK_DIR).mkdir(parents=True, exist_ok=True)
    (folder / CHECK_DIR / token).write_text(token)
    tasks = tasks or task_slots(spark)
    found: dict[str, str] = {}
    try:
        rdd = spark.sparkContext.parallelize(range(tasks), tasks)
        for host, problem, written in rdd.barrier().mapPartitions(_probe(str(folder), token)).collect():
            if not problem and not Path(written).exists():
                problem = "what it wrote there does not reach the driver"
            found[host] = found.get(host) or problem
        return found
    finally:
        for leftover in (folder / CHECK_DIR).glob(f"{token}*"):
            leftover.unlink(missing_ok=True)


def check_shared_folder(spark, folder: str | os.PathLike, tasks: int | None = None) -> list[str]:
    """Check that every executor's host sees ``folder`` as the driver does (:func:`shared_folder_report`).

    Args:
        spark: the SparkSession.
        folder: the folder (the work directory).
        tasks: how many tasks (default: every task slot).

    Returns:
        The hosts that were checked (none in local mode).

    Raises:
        SharedFolderError: a host does not see the driver's file, or cannot write there, with the fix.
    """
    found = shared_folder_report(spark, folder, tasks)
    for host, problem in sorted(found.items()):
        if problem:
            raise SharedFolderError(
                f"{host} does not share {folder} with the driver ({socket.gethostname()}): {problem}. Mount the "
                "shared folder at the same path on every host, or set WORK_DIR to a folder all of them share."
            )
    return sorted(found)
