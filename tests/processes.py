"""Driver programs (tests/scripts/) that tests run as separate processes, and the processes a test started, found
by the work folder in their environment (COURSE_WORK_DIR)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent

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


NO_HOROVOD = REPO / "tests" / "no_horovod"  # a `horovod` package whose import fails


def no_horovod_env(pythonpath: str | None = None) -> dict[str, str]:
    """The environment change that hides Horovod (as on Databricks Runtime 16.0 ML and later) from a process whose
    ``PYTHONPATH`` would otherwise be ``pythonpath``."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(NO_HOROVOD), pythonpath]))}


def start_driver(script: str, work: Path, *args: object) -> subprocess.Popen:
    """Start the driver program ``tests/scripts/<script>.py`` with ``args`` and ``work`` as its COURSE_WORK_DIR, with
    this interpreter and the repository on PYTHONPATH. stdout is piped, stderr (Spark's chatter) goes to
    ``driver.err`` in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, COURSE_WORK_DIR=str(work), PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", f"tests.scripts.{script}", *map(str, args)]
    with open(work / "driver.err", "w") as err:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)


def driver_errors(work: Path) -> str:
    """The end of a driver script's stderr, for failure messages."""
    return (work / "driver.err").read_text()[-4000:]


def run_driver(script: str, work: Path, timeout: float, *args: object) -> tuple[dict, str]:
    """Run a driver program (see :func:`start_driver`) to its end, at most ``timeout`` seconds; return the last
    ``REPORT {json}`` line it printed, decoded, and its whole output."""
    process = start_driver(script, work, *args)
    try:
        stdout, _ = process.communicate(timeout=timeout)
    finally:
        process.kill()
    lines = [line for line in stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, (
        f"the driver script printed no report (exit {process.returncode}):\n{stdout[-2000:]}\n{driver_errors(work)}"
    )
    return json.loads(lines[-1][len("REPORT ") :]), stdout


_VERSIONS_PROBE = """
import importlib.metadata as m, json, sys

def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None

print(json.dumps({name: version(name) for name in sys.argv[1:]}))
"""


def installed_versions(names: list[str]) -> dict[str, str | None]:
    """The installed version of each of ``names`` (None if not installed), read in a fresh interpreter, which sees
    this venv as pip and a lesson's kernel do: in the suite's process, once a test has imported Ray, its vendored
    psutil (``ray/thirdparty_files``, first on ``sys.path``) would be read instead."""
    done = subprocess.run([sys.executable, "-c", _VERSIONS_PROBE, *names], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)
