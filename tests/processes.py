"""The processes a test started, found by the work folder in their environment (COURSE_WORK_DIR)."""

from __future__ import annotations

import psutil

SPARK_MARKERS = (
    "org.apache.spark.deploy.master.Master",
    "org.apache.spark.deploy.worker.Worker",
    "CoarseGrainedExecutorBackend",
    "pyspark.daemon",
)
TORCHRUN_MARKERS = ("torch.distributed.run", "torch_run_process_wrapper")


def processes_of(work: str, markers: tuple[str, ...] = SPARK_MARKERS) -> list[int]:
    """Live processes started with ``work`` as COURSE_WORK_DIR whose command line names one of ``markers``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("COURSE_WORK_DIR") == work and any(m in " ".join(proc.cmdline()) for m in markers):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def alive(pids: list[int]) -> list[int]:
    """The processes of ``pids`` that still exist."""
    return [pid for pid in pids if psutil.pid_exists(pid)]
