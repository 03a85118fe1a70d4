"""``HorovodRunner``: the Databricks ``sparkdl.HorovodRunner`` API on open-source Horovod.

``HorovodRunner(np=-N).run(fn, **kwargs)`` starts N processes on this machine (Horovod over Gloo, through
``horovod.run``); ``HorovodRunner(np=N)`` starts N processes as tasks of the active SparkSession (through
``horovod.spark.run``). Both return rank 0's return value, as on Databricks. ``runner_class()`` gives Databricks'
own class where ``sparkdl`` is installed, and this one elsewhere.

What this module adds to plain ``horovod.run``:

* **Errors that say what happened.** ``fn`` runs inside a wrapper that, when it raises, writes the rank and the
  formatted traceback to a report file under the work directory and re-raises, so the process still exits
  non-zero and Horovod stops the other ranks at once. The driver then raises :class:`HorovodWorkerError` naming
  the rank, with the worker's traceback in the message. A worker that dies without a Python error (killed by a
  signal, out of memory) is reported with its exit code and signal name. Horovod itself notices a dead process
  and terminates the others, so a killed worker fails the job within seconds instead of hanging. On a multi-node
  cluster the tracebacks come back only if the work directory (``COURSE_WORK_DIR``) is on shared storage;
  otherwise the error still names the first rank that failed, and the traceback is in that executor's log.
* **Functions from notebooks and scripts.** Horovod ships ``fn`` with cloudpickle, which sends functions defined
  in ``__main__`` (a notebook cell, a script) by value. Functions from an importable module are sent by
  reference, so the workers must be able to import that module: the repository is put on the workers'
  ``PYTHONPATH`` (see ``helpers.spark.configure_python_env``). ``fn`` and its arguments are pickled once up front,
  so something that cannot be sent (a lock, an open file, a SparkSession) is reported before anything starts.
* **No MLflow run left RUNNING.** Horovod stops the surviving ranks (SIGTERM, then SIGKILL 5 s later) as soon as
  one fails, and a rank can be killed outright (out of memory): either way the rank that opened an MLflow run may
  never end it. ``helpers.training.train`` records each run it opens in the job's report folder
  (:func:`record_mlflow_run`); after a failed job the driver ends every recorded run that is still RUNNING as
  FAILED. (On a multi-node cluster this needs the work directory on shared storage, like the tracebacks.)
* **One CPU share per process.** Each worker sets ``OMP_NUM_THREADS`` and ``torch.set_num_threads`` to its share
  of the machine's cores (cores // processes on that machine, at least 1), so 2 processes on 2 cores do not each
  start 2 compute threads and fight over the cores.
* **Horovod's own defaults.** ``horovod.run`` 0.28.1 passes its workers ``HOROVOD_CYCLE_TIME`` and
  ``HOROVOD_CACHE_CAPACITY`` as the text ``"(None,)"`` when they are not set, which Horovod reads as 0: its
  background thread then polls without pause and slows training on the same core by 2x (measured with 1
  process on one core). Each worker puts back the driver's value, or Horovod's default.

A script that calls ``HorovodRunner(...).run`` must do it under ``if __name__ == "__main__":``: the workers are
new Python processes, and a script that starts a job at import time would start it again in every worker that
unpickles a function defined in it. Notebooks need no guard.

``np`` larger than the cores of this machine (``np < 0``) or than Spark's task slots (``np > 0``) gives a
warning, not an error: the job still runs (slowly, oversubscribed, or, on Spark, once enough executors join;
Horovod waits ``HOROVOD_SPARK_START_TIMEOUT`` seconds, 600 by default, for them).

``use_gpu=True`` on a local job (``np < 0``, one GPU per process, ``cuda:<local rank>``) is checked before anything
starts: more processes than GPUs, or a Horovod built without CUDA, is a :class:`~helpers.CourseInputError`; a
Horovod built without NCCL gives a warning (it works, but every gradient goes through host memory over Gloo).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from helpers import CourseInputError
from helpers.devices import check_flag, gpu_count, horovod_gpu_support
from helpers.spark import check_gpu_per_task, configure_python_env
from helpers.workdir import work_dir

__all__ = ["HorovodRunner", "HorovodWorkerError", "record_mlflow_run", "runner_class"]

VERBOSITIES = ("log_callback_only", "all")
JOB_DIR_ENV = "COURSE_HOROVOD_JOB_DIR"  # set in every worker: the job's report folder
_FIRST_FAILED = re.compile(r"Process name: (\S+)\s+Exit code: (-?\d+)")


class HorovodWorkerError(RuntimeError):
    """A Horovod worker failed: ``rank`` says which, ``worker_traceback`` what it raised (empty if it was killed)."""

    def __init__(self, message: str, rank: int | None, worker_traceback: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.worker_traceback = worker_traceback
        self.exit_code = exit_code


@dataclass(frozen=True)
class _Report:
    """What a failing worker wrote: when, whether it only failed because another rank had (``collateral``), how."""

    rank: int
    time: float
    collateral: bool
    text: str


def _is_collateral(exc: BaseException) -> bool:
    """True when ``exc`` is Horovod reporting that *another* rank stopped (not the root cause)."""
    return type(exc).__name__ == "HorovodInternalError" or "Horovod has been shut down" in str(exc)


def _pin_threads() -> int:
    """Give this worker its share of the machine's cores (for OpenMP and torch); return the thread count."""
    local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
    threads = max(1, (os.cpu_count() or 1) // max(1, local_size))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ImportError:
        return threads
    torch.set_num_threads(threads)
    return threads


#: Tuning variables that ``horovod.run`` (0.28.1) hands every worker as the text ``"(None,)"`` when the caller
#: did not set them (trailing commas in its ``_HorovodArgs``). Horovod's core parses that as 0: a cycle time of
#: 0 ms, so its background thread polls without pause and takes about half of the worker's core, and no response
#: cache.
_LAUNCHER_TUNING_ENV = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")


def _repair_launcher_env(driver_values: dict[str, str | None]) -> None:
    """Undo ``horovod.run``'s ``"(None,)"`` tuning values in this worker before ``hvd.init()`` reads them: the
    driver's own setting where it had one, else unset (Horovod's defaults)."""
    for name in _LAUNCHER_TUNING_ENV:
        if os.environ.get(name) != "(None,)":
            continue
        if driver_values.get(name) is None:
            del os.environ[name]
        else:
            os.environ[name] = driver_values[name]


class _WorkerCall:
    """The function the workers run: repairs the launcher's environment, pins threads, calls ``fn`` and writes a
    report file if it raises."""

    def __init__(self, fn: Callable[..., Any], report_dir: str):
        self.fn = fn
        self.report_dir = report_dir
        self.driver_tuning = {name: os.environ.get(name) for name in _LAUNCHER_TUNING_ENV}

    def __call__(self, **kwargs: Any) -> Any:
        _repair_launcher_env(self.driver_tuning)
        _pin_threads()
        os.environ[JOB_DIR_ENV] = self.report_dir
        try:
            return self.fn(**kwargs)
        except BaseException as exc:
            rank = int(os.environ.get("HOROVOD_RANK", "0"))
            text = "".join(traceback.format_exception(exc))
            self._write_report(rank, _is_collateral(exc), text)
            raise

    def _write_report(self, rank: int, collateral: bool, text: str) -> None:
        """Write the report atomically (write, then rename) so the driver never reads half a file."""
        folder = Path(self.report_dir)
        folder.mkdir(parents=True, exist_ok=True)
        payload = {"rank": rank, "time": time.time(), "collateral": collateral, "text": text}
        tmp = folder / f".rank-{rank}.tmp"
        tmp.write_bytes(cloudpickle.dumps(payload))
        tmp.replace(folder / f"rank-{rank}.pkl")


def _read_reports(report_dir: Path) -> dict[int, _Report]:
    """The reports failing workers left in ``report_dir``, by rank."""
    reports = {}
    for path in sorted(report_dir.glob("rank-*.pkl")):
        payload = cloudpickle.loads(path.read_bytes())
        reports[payload["rank"]] = _Report(**payload)
    return reports


def record_mlflow_run(run_id: str, tracking_uri: str) -> None:
    """Inside a ``HorovodRunner`` worker, note an MLflow run this process opened, so that the driver can end it
    FAILED if the job fails before this process ends it (it is terminated or killed). Elsewhere: does nothing."""
    folder = os.environ.get(JOB_DIR_ENV)
    if not folder:
        return
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".mlflow-run-{run_id}.tmp"
    tmp.write_text(json.dumps({"run_id": run_id, "tracking_uri": tracking_uri}))
    tmp.replace(path / f"mlflow-run-{run_id}.json")


def fail_open_mlflow_runs(report_dir: Path) -> None:
    """After a failed job: end as FAILED the recorded MLflow runs that are still RUNNING (their ranks are gone)."""
    for path in sorted(report_dir.glob("mlflow-run-*.json")):
        try:
            from mlflow.tracking import MlflowClient

            record = json.loads(path.read_text())
            client = MlflowClient(record["tracking_uri"])
            if client.get_run(record["run_id"]).info.status == "RUNNING":
                client.set_terminated(record["run_id"], "FAILED")
        except Exception as exc:  # never hide the worker's error behind a bookkeeping one
            warnings.warn(f"HorovodRunner could not mark the MLflow run in {path.name} FAILED: {exc}", stacklevel=3)


def _describe_exit(code: int) -> str:
    """``exit code 137 (killed by SIGKILL)`` for a shell-style or negative signal exit code."""
    signum = -code if code < 0 else code - 128 if code > 128 else None
    if signum is None:
        return f"exit code {code}"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"exit code {code}"
    hint = "; out of memory is a common cause" if name == "SIGKILL" else ""
    return f"exit code {code} (killed by {name}{hint})"


def _worker_error(original: BaseException, reports: dict[int, _Report], np: int) -> HorovodWorkerError:
    """Turn Horovod's generic failure into one error naming the rank that failed first, with its traceback.

    The root cause is, in order: the earliest report of an exception raised by the user's code; else a rank that
    left no report (it died without a Python error: killed, out of memory), preferring the one Horovod saw exit
    first; else the first report. Reports of "Horovod has been shut down" are collateral: that rank only noticed
    another one had stopped.
    """
    match = _FIRST_FAILED.search(str(original))
    first_rank = int(match.group(1)) if match and match.group(1).isdigit() else None
    exit_code = int(match.group(2)) if match else None
    root_causes = sorted((r for r in reports.values() if not r.collateral), key=lambda r: r.time)
    silent = [rank for rank in range(np) if rank not in reports]
    if root_causes:
        report = root_causes[0]
        last_line = report.text.strip().splitlines()[-1]
        message = (
            f"Horovod worker rank {report.rank} of {np} failed: {last_line}\n"
            f"--- traceback from rank {report.rank} ---\n{report.text}"
        )
        return HorovodWorkerError(message, report.rank, report.text, exit_code if report.rank == first_rank else None)
    if silent and (reports or first_rank in silent):
        dead = first_rank if first_rank in silent else silent[0]
        how = _describe_exit(exit_code) if dead == first_rank and exit_code is not None else "no exit code known"
        message = (
            f"Horovod worker rank {dead} of {np} died without a Python error ({how}); the other ranks were "
            f"stopped. Its last output lines (if shown) start with [{dead}]."
        )
        return HorovodWorkerError(message, dead, "", exit_code if dead == first_rank else None)
    if reports:
        report = reports[min(reports, key=lambda rank: reports[rank].time)]
        message = f"Horovod worker rank {report.rank} of {np} failed:\n{report.text}"
        return HorovodWorkerError(message, report.rank, report.text)
    return HorovodWorkerError(f"The Horovod job failed: {original}", None)


def _check_local_gpus(np: int, gpus: int, support: dict[str, bool]) -> None:
    """Before a local GPU job (``np < 0``, ``use_gpu=True``): one GPU per process, and a Horovod that can use them.

    ``gpus`` is the number of GPUs on this machine, ``support`` what :func:`helpers.devices.horovod_gpu_support`
    says about the installed Horovod. Raises :class:`CourseInputError` for more processes than GPUs or a Horovod
    without CUDA (it cannot allreduce GPU tensors); warns for a Horovod without NCCL (it copies every gradient to
    the host and averages it over Gloo: correct, but much slower).
    """
    processes = -np
    if processes > gpus:
        have = f"{gpus} GPU{'s' if gpus > 1 else ''}" if gpus else "no CUDA GPU"
        fix = f"use np=-{gpus}" if gpus else "run it on a GPU machine"
        asked = f"{processes} local processes with one GPU each" if processes > 1 else "1 local process with a GPU"
        raise CourseInputError(
            f"HorovodRunner(np={np}, use_gpu=True) asks for {asked}, but this machine has {have}: {fix}, or "
            "use_gpu=False to train on the CPU."
        )
    rebuild = "rm -rf .cache/wheels/horovod-* .venv/.setup-done && make setup GPU=1"
    if not support["cuda"]:
        state = "was built without CUDA" if support["installed"] else "is not installed"
        raise CourseInputError(
            f"HorovodRunner(np={np}, use_gpu=True): Horovod {state}, so it cannot average GPU gradients: build it "
            f"with CUDA and NCCL (`{rebuild}`), or use_gpu=False to train on the CPU."
        )
    if not support["nccl"]:
        warnings.warn(
            f"HorovodRunner(np={np}, use_gpu=True): Horovod was built without NCCL, so every gradient is copied to "
            f"the host and averaged over Gloo (much slower): rebuild it with `{rebuild}`.",
            stacklevel=4,
        )


class HorovodRunner:
    """Run a training function on ``|np|`` Horovod processes and return rank 0's result.

    ``np < 0``: ``-np`` processes on this machine (Gloo over local TCP); use it to develop and on a single node.
    ``np > 0``: ``np`` processes, one per task of the active SparkSession (``horovod.spark.run`` over Gloo).

    ``use_gpu``: the processes train on GPUs, one each. For a local job it is checked before anything starts (see
    :func:`_check_local_gpus`; ``cuda_count`` overrides the detected number of GPUs, for tests). On Spark the GPUs
    are the workers' and the driver cannot count them, so it checks that the session gives every task one
    (``spark.task.resource.gpu.amount=1``, :func:`helpers.spark.check_gpu_per_task`).

    ``driver_log_verbosity``: ``"all"`` streams every worker's stdout and stderr into the notebook;
    ``"log_callback_only"`` (the default, as on Databricks) leaves Spark workers' output in the executor logs.
    Local runs (``np < 0``) always stream their workers' output, as Horovod has no switch for it. Errors always
    come back (see :class:`HorovodWorkerError`).
    """

    def __init__(
        self,
        np: int,
        driver_log_verbosity: str = "log_callback_only",
        *,
        use_gpu: bool = False,
        cuda_count: int | None = None,
    ):
        if isinstance(np, bool) or not isinstance(np, int):
            raise CourseInputError(
                f"HorovodRunner(np=...) takes an int, got {np!r}: np=-2 (2 local processes) or np=2 (2 Spark tasks)."
            )
        if np == 0:
            raise CourseInputError(
                "HorovodRunner(np=0) runs nothing: use np=-N for N processes on this machine or np=N for N Spark tasks."
            )
        if driver_log_verbosity not in VERBOSITIES:
            raise CourseInputError(
                f"driver_log_verbosity={driver_log_verbosity!r} is not one of {VERBOSITIES}: use 'all' to see every "
                "worker's output."
            )
        check_flag("use_gpu", use_gpu)
        self.np = np
        self.driver_log_verbosity = driver_log_verbosity
        self.use_gpu = use_gpu
        self.cuda_count = cuda_count

    @property
    def num_processes(self) -> int:
        """How many Horovod processes ``run`` starts."""
        return abs(self.np)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every process; return what rank 0 returned.

        Raises :class:`CourseInputError` if ``main`` or ``kwargs`` cannot be pickled or a local GPU job lacks
        a GPU per process or a Horovod built with CUDA, and :class:`HorovodWorkerError` if a worker raises or dies.
        """
        if not callable(main):
            raise CourseInputError(f"HorovodRunner.run needs a function to run, got {type(main).__name__}.")
        self._check_picklable(main, kwargs)
        self._check_resources()
        configure_python_env()
        report_dir = work_dir() / "horovod_runs" / uuid.uuid4().hex
        call = _WorkerCall(main, str(report_dir))
        try:
            results = self._launch(call, kwargs)
        except Exception as exc:
            reports = _read_reports(report_dir) if report_dir.exists() else {}
            fail_open_mlflow_runs(report_dir)
            raise _worker_error(exc, reports, self.num_processes) from exc
        finally:
            shutil.rmtree(report_dir, ignore_errors=True)
        return results[0]

    @staticmethod
    def _check_picklable(main: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        """Fail before starting anything if the function or its arguments cannot be sent to the workers."""
        for what, obj in [(f"the function {getattr(main, '__name__', main)!r}", main), ("its arguments", kwargs)]:
            try:
                cloudpickle.dumps(obj)
            except Exception as exc:
                raise CourseInputError(
                    f"HorovodRunner cannot send {what} to the workers: it cannot be pickled "
                    f"({type(exc).__name__}: {exc}). Create locks, open files, Spark sessions and data loaders "
                    "inside the function instead of capturing them."
                ) from exc

    def _check_resources(self) -> None:
        """Warn when there are fewer cores (local) or task slots (Spark) than processes; Spark needs a session; a
        local GPU job needs a GPU per process and a Horovod built for GPUs."""
        if self.np < 0:
            if self.use_gpu:
                gpus = gpu_count() if self.cuda_count is None else self.cuda_count
                _check_local_gpus(self.np, gpus, horovod_gpu_support())
            cores = os.cpu_count() or 1
            if self.num_processes > cores:
                warnings.warn(
                    f"HorovodRunner(np={self.np}) starts {self.num_processes} processes on a machine with {cores} "
                    f"cores: they will share cores and run slower than np=-{cores}.",
                    stacklevel=3,
                )
            return
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise CourseInputError(
                f"HorovodRunner(np={self.np}) runs on Spark, but there is no active SparkSession: call "
                "helpers.spark.get_spark() first, or use np=-N to run on this machine."
            )
        if self.use_gpu:
            check_gpu_per_task(spark, f"HorovodRunner(np={self.np})")
        slots = spark.sparkContext.defaultParallelism
        if self.num_processes > slots:
            warnings.warn(
                f"HorovodRunner(np={self.np}) needs {self.np} Spark task slots at once but the session has {slots}: "
                "Horovod waits for more executors (HOROVOD_SPARK_START_TIMEOUT, 600 s by default) and then fails.",
                stacklevel=3,
            )

    def _launch(self, call: _WorkerCall, kwargs: dict[str, Any]) -> list[Any]:
        """Start the job locally or on Spark; return every rank's result, in rank order."""
        if self.np < 0:
            import horovod

            return horovod.run(call, kwargs=kwargs, num_proc=self.num_processes, use_gloo=True, disable_cache=True)
        import horovod.spark

        streams = {"stdout": sys.stdout, "stderr": sys.stderr} if self.driver_log_verbosity == "all" else {}
        with _quiet_cancelled_spark_job():
            return horovod.spark.run(
                call, kwargs=kwargs, num_proc=self.num_processes, use_gloo=True, verbose=0, **streams
            )


@contextmanager
def _quiet_cancelled_spark_job() -> Iterator[None]:
    """Hide the Java stack trace of the Spark job that Horovod cancels after a failure (the real error follows).

    ``horovod.spark.run`` runs the Spark job in a thread, cancels it when a worker fails and joins that thread
    before it returns, so the hook is only needed, and only installed, while it runs.
    """
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        cancelled = "cancelled job group horovod.spark.run" in str(args.exc_value)
        if not (cancelled and args.thread is not None and "run_spark" in args.thread.name):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def runner_class() -> type:
    """``sparkdl.HorovodRunner`` on Databricks (where ``sparkdl`` is importable), this module's class elsewhere."""
    try:
        from sparkdl import HorovodRunner as DatabricksRunner  # type: ignore[import-not-found]
    except ImportError:
        return HorovodRunner
    return DatabricksRunner
