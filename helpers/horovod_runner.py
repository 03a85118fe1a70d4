"""``HorovodRunner``: the Databricks ``sparkdl.HorovodRunner`` API on open-source Horovod.

``HorovodRunner(np=-N).run(fn, **kwargs)`` starts N processes on this machine (Horovod over Gloo, through
``horovod.run``); ``HorovodRunner(np=N)`` starts N processes as tasks of the active SparkSession (through
``horovod.spark.run``). Both return rank 0's return value, as on Databricks; ``runner_class()`` gives Databricks'
own class where ``sparkdl`` is installed.

Jobs follow the course's job protocol (:mod:`helpers.jobs`): a failing rank leaves a failure record, the driver
raises :class:`HorovodWorkerError` naming the root cause (a killed rank with its exit code and signal), and MLflow
runs left RUNNING are ended FAILED. ``fn`` and its arguments are pickled once up front, so something that cannot be
sent is reported before anything starts. Each worker takes its share of the machine's cores and puts back
Horovod's tuning defaults that ``horovod.run`` 0.28.1 breaks (see :func:`_repair_launcher_env`). A script that
calls ``run`` must do it under ``if __name__ == "__main__":`` (the workers import it); notebooks need no guard.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import cloudpickle

from helpers import CourseInputError
from helpers.devices import gpu_count, horovod_gpu_support, require_horovod
from helpers.jobs import (
    STALL_HINT,
    CollectiveWatch,
    JobError,
    JobFolder,
    StalledCollectiveError,
    WorkerCall,
    pin_threads,
    stall_timeout_s,
)
from helpers.lost_hosts import LOST_GRACE_S, ExecutorLoss, LostHostError
from helpers.network import INTERFACE_ENV
from helpers.ports import HOROVOD_PORTS_ENV, horovod_ports
from helpers.shared_storage import check_shared_folder
from helpers.spark import active_session, check_gpu_per_task, configure_python_env
from helpers.validation import check_flag, one_of
from helpers.workdir import work_dir

__all__ = ["HorovodRunner", "HorovodWorkerError", "runner_class"]

VERBOSITIES = ("log_callback_only", "all")
STOP_GRACE_S = 20  # after a rank's failure record, Horovod on Spark has this long to end the job by itself
_FIRST_FAILED = re.compile(r"Process name: (\S+)\s+Exit code: (-?\d+)")


class HorovodWorkerError(JobError):
    """A Horovod worker failed: ``rank`` says which, ``worker_traceback`` what it raised (empty if it was killed)."""


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


#: Where the name sits among the arguments of Horovod's (0.28.1) torch functions that start a collective.
_NAME_ARGUMENT = {"_allreduce_async": 2, "_allgather_async": 2, "_broadcast_async": 3, "_reducescatter_async": 2}


def _said(name: str) -> str:
    """A collective's name as a stall message says it: ``hvd.allgather_object(obj, name)`` gathers in two steps
    named ``NAME.sz`` and ``NAME.t`` (NAME defaults to the object's type: ``list.sz``), which say the call instead."""
    base, dot, step = name.rpartition(".")
    if dot and step in ("sz", "t"):
        return base if " " in base else f"hvd.allgather_object of a {base}"
    return name


def _watch_collectives(watch: CollectiveWatch) -> None:
    """Tell ``watch`` when this process waits in a Horovod collective, and in which (its tensor's name).

    Every blocking Horovod call (``hvd.allreduce``, ``DistributedOptimizer.step``, ``hvd.broadcast_parameters``, a
    ``sync_dist`` metric) ends in ``mpi_lib.horovod_torch_wait_and_clear(handle)``; the functions that start one
    are wrapped to remember each handle's name.
    """
    from horovod.torch import mpi_ops

    names: dict[int, str] = {}

    def named(function_name: str, position: int):
        start = getattr(mpi_ops, function_name)

        def started(*args, **kwargs):
            handle = start(*args, **kwargs)
            name = kwargs.get("name", args[position] if len(args) > position else None)
            names[handle] = _said(name) if name else f"an unnamed {function_name.strip('_').split('_')[0]}"
            return handle

        return started

    for function_name, position in _NAME_ARGUMENT.items():
        setattr(mpi_ops, function_name, named(function_name, position))
    wait = mpi_ops.mpi_lib.horovod_torch_wait_and_clear

    def watched_wait(handle):
        watch.enter(names.pop(handle, "a Horovod collective"))
        try:
            return wait(handle)
        finally:
            watch.leave()

    mpi_ops.mpi_lib.horovod_torch_wait_and_clear = watched_wait


class _WorkerSetup:
    """Run first in every Horovod worker: repair the launcher's environment, take this process's share of cores,
    bound every wait in a collective by the driver's stall bound (:class:`helpers.jobs.CollectiveWatch`)."""

    def __init__(self, stall_timeout: int) -> None:
        self.driver_tuning = {name: os.environ.get(name) for name in _LAUNCHER_TUNING_ENV}
        self.stall_timeout = stall_timeout

    def __call__(self) -> None:
        _repair_launcher_env(self.driver_tuning)
        local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
        pin_threads((os.cpu_count() or 1) // max(1, local_size))
        # Horovod's own stall inspector, where the user set nothing: warn at half the bound, shut down at twice it
        # (the course's watch ends the job first, naming ranks and tensor; in our runs of 0.28.1 over Gloo the
        # inspector reported nothing, neither for an idle rank nor for ranks waiting in different tensors)
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, self.stall_timeout // 2)))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(2 * self.stall_timeout))
        job = JobFolder.current()
        rank, size = int(os.environ.get("HOROVOD_RANK", "0")), int(os.environ.get("HOROVOD_SIZE", "1"))
        if job is not None and size > 1:
            watch = CollectiveWatch(job, rank, size, self.stall_timeout)
            _watch_collectives(watch)
            watch.start()


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


def _worker_error(original: BaseException, job: JobFolder, np: int) -> HorovodWorkerError:
    """Turn Horovod's generic failure into one error naming the root cause, with its traceback.

    The job protocol's rule (:meth:`helpers.jobs.JobFolder.root_cause`): a rank's own error first; else a rank that
    left no record (it died without a Python error: killed, out of memory), preferring the one Horovod saw exit
    first, with its exit code; else an echo of another rank's failure ("Horovod has been shut down").
    """
    if isinstance(original, LostHostError):
        reason = str(original)
        return HorovodWorkerError(f"The Horovod job on {np} processes was stopped: {reason}.", reason=reason)
    match = _FIRST_FAILED.search(str(original))
    first_rank = int(match.group(1)) if match and match.group(1).isdigit() else None
    exit_code = int(match.group(2)) if match else None
    failures = job.failures()
    cause = job.root_cause()
    silent = [rank for rank in range(np) if rank not in failures]
    if cause is not None and not cause.collateral:
        hint = f"\n{STALL_HINT}" if StalledCollectiveError.__name__ in cause.last_line else ""
        message = (
            f"Horovod worker rank {cause.rank} of {np} failed: {cause.last_line}{hint}\n"
            f"--- traceback from rank {cause.rank} ---\n{cause.text}"
        )
        code = exit_code if cause.rank == first_rank else None
        return HorovodWorkerError(
            message, rank=cause.rank, reason=cause.last_line, worker_traceback=cause.text, exit_code=code
        )
    if silent and (failures or first_rank in silent):
        dead = first_rank if first_rank in silent else silent[0]
        how = _describe_exit(exit_code) if dead == first_rank and exit_code is not None else "no exit code known"
        reason = f"Horovod worker rank {dead} of {np} died without a Python error ({how})"
        message = f"{reason}; the other ranks were stopped. Its last output lines (if shown) start with [{dead}]."
        return HorovodWorkerError(
            message, rank=dead, reason=reason, exit_code=exit_code if dead == first_rank else None
        )
    if cause is not None:
        message = f"Horovod worker rank {cause.rank} of {np} failed:\n{cause.text}"
        return HorovodWorkerError(message, rank=cause.rank, reason=cause.last_line, worker_traceback=cause.text)
    return HorovodWorkerError(f"The Horovod job failed: {original}")


_RANK_LINE = re.compile(r"\[(\d+)\]<(stdout|stderr)>:(.*)", re.DOTALL)  # how Horovod prefixes a rank's lines
_EXIT_NOTICES = re.compile(r"(Process \d+ exit with status code -?\d+\.|Terminating remaining workers after failure)")
_TRACEBACK_STARTS = (
    "Traceback (most recent call last):",
    "During handling of the above exception",
    "The above exception was the direct cause",
    "User function raise error:",  # horovod.runner.run_task's notice, which runs on into the traceback
)


class _WithoutTracebacks:
    """A text stream passing on what a local job's ranks print, line by line, except each rank's tracebacks (up to
    and including the exception's line) and Horovod's notices that a process exited: the job's
    :class:`HorovodWorkerError` carries the traceback of the rank that caused the failure, and the other ranks'
    only echo it ("Horovod has been shut down")."""

    def __init__(self, target: Any) -> None:
        self.target, self._pending = target, ""
        self._in_traceback: set[tuple[str, str]] = set()  # (rank, stream) inside a traceback
        self._ended: set[tuple[str, str]] = set()  # (rank, stream) whose traceback just ended

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = re.split(r"(?<=[\r\n])", self._pending)
        for line in lines:
            if self._kept(line):
                self.target.write(line)
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def close_pending(self) -> None:
        """Pass on the last, unfinished line (if kept)."""
        if self._pending and self._kept(self._pending):
            self.target.write(self._pending)
        self._pending = ""
        self.target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def _kept(self, line: str) -> bool:
        match = _RANK_LINE.match(line)
        if match is None:
            return not _EXIT_NOTICES.match(line)
        stream, content = match.group(1, 2), match.group(3)
        if content.startswith(_TRACEBACK_STARTS):
            self._in_traceback.add(stream)
            return False
        if stream in self._in_traceback:
            if content.strip() and not content[0].isspace():  # the exception's own line ends the traceback
                self._in_traceback.discard(stream)
                self._ended.add(stream)
            return False
        if stream in self._ended:  # the blank line Horovod prints after it, too
            self._ended.discard(stream)
            return bool(content.strip())
        return True


@contextmanager
def _ranks_without_tracebacks() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`_WithoutTracebacks` for the block: Horovod's threads that forward
    the ranks' output write to the streams these names hold when the job starts."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _WithoutTracebacks(streams[0]), _WithoutTracebacks(streams[1])
    try:
        yield
    finally:
        wrappers = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = streams
        for wrapper in wrappers:
            wrapper.close_pending()


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


def _check_pinned_ports() -> None:
    """Where ``COURSE_HOROVOD_PORTS`` is set, it must be a range and the installed Horovod must read it (the build of
    scripts/install_horovod.sh); stock Horovod would pick random ports that a firewall blocks, and fail much later."""
    if horovod_ports() is None:
        return
    from horovod.runner.util import network

    if not hasattr(network, "_course_port_range"):
        raise CourseInputError(
            f"{HOROVOD_PORTS_ENV} is set, but this Horovod picks random ports in 1024-65535 (only the one `make setup` "
            "builds reads it): rebuild Horovod with scripts/install_horovod.sh, or unset it and open those ports "
            "between the hosts."
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
    Local runs (``np < 0``) always stream their workers' output, as Horovod has no switch for it, but not the
    tracebacks of failing ranks or Horovod's notices that a process exited: errors always come back, the root
    cause's traceback in the :class:`HorovodWorkerError`.
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
        one_of("driver_log_verbosity", driver_log_verbosity, VERBOSITIES, "'all' shows every worker's output.")
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

        Raises :class:`CourseInputError` if Horovod is not installed, ``main`` or ``kwargs`` cannot be pickled or
        a local GPU job lacks a GPU per process or a Horovod built with CUDA, and :class:`HorovodWorkerError` if a
        worker raises or dies, or waits in one collective longer than the stall bound
        (``COURSE_STALL_TIMEOUT_S``, :func:`helpers.jobs.stall_timeout_s`): then it names the collective and the
        ranks that did not join.
        """
        if not callable(main):
            raise CourseInputError(f"HorovodRunner.run needs a function to run, got {type(main).__name__}.")
        require_horovod("HorovodRunner")
        self._check_picklable(main, kwargs)
        self._check_resources()
        configure_python_env()
        setup = _WorkerSetup(stall_timeout_s())
        job = JobFolder.create("horovod")
        call = WorkerCall(main, job, rank_env="HOROVOD_RANK", setup=setup)
        try:
            results = self._launch(call, job, kwargs)
        except Exception as exc:
            job.fail_open_mlflow_runs()
            raise _worker_error(exc, job, self.num_processes) from exc
        finally:
            job.remove()
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
        spark = active_session()
        if spark is None:
            raise CourseInputError(
                f"HorovodRunner(np={self.np}) runs on Spark, but there is no active SparkSession: call "
                "helpers.spark.get_spark() first, or use np=-N to run on this machine."
            )
        if self.use_gpu:
            check_gpu_per_task(spark, f"HorovodRunner(np={self.np})")
        _check_pinned_ports()
        check_shared_folder(spark, work_dir())
        slots = spark.sparkContext.defaultParallelism
        if self.num_processes > slots:
            warnings.warn(
                f"HorovodRunner(np={self.np}) needs {self.np} Spark task slots at once but the session has {slots}: "
                "Horovod waits for more executors (HOROVOD_SPARK_START_TIMEOUT, 600 s by default) and then fails.",
                stacklevel=3,
            )

    def _launch(self, call: WorkerCall, job: JobFolder, kwargs: dict[str, Any]) -> list[Any]:
        """Start the job locally or on Spark; return every rank's result, in rank order."""
        if self.np < 0:
            import horovod

            with _ranks_without_tracebacks():
                return horovod.run(call, kwargs=kwargs, num_proc=self.num_processes, use_gloo=True, disable_cache=True)
        return self._run_on_spark(call, job, kwargs)

    def _run_on_spark(self, call: WorkerCall, job: JobFolder, kwargs: dict[str, Any]) -> list[Any]:
        """``horovod.spark.run`` in a thread, ended from here when Spark loses a host of the job
        (:class:`helpers.lost_hosts.ExecutorLoss`), when a rank has failed and Horovod has not ended the job
        :data:`STOP_GRACE_S` later (it waits for every rank, and a frozen or unreachable host's never answers), or on
        an interrupt."""
        import horovod.spark
        from horovod.spark.driver import job_id

        spark = active_session()
        streams = {"stdout": sys.stdout, "stderr": sys.stderr} if self.driver_log_verbosity == "all" else {}
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["results"] = horovod.spark.run(
                    call, kwargs=kwargs, num_proc=self.num_processes, use_gloo=True, verbose=0, nics=_nics(), **streams
                )
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc

        executors = ExecutorLoss(spark, self.num_processes)
        thread = threading.Thread(target=run, name="horovod-spark-run", daemon=True)
        stop = threading.Event()
        with _quiet_cancelled_spark_job(), _stopped_by(stop):
            thread.start()
            try:
                lost = _wait_or_give_up(thread, job, executors)
            except KeyboardInterrupt:
                lost = KeyboardInterrupt()
            if lost is not None or thread.is_alive():
                stop.set()
                spark.sparkContext.cancelJobGroup(f"horovod.spark.run.{job_id.JOB_ID}")
                thread.join(STOP_GRACE_S if lost is None else LOST_GRACE_S)  # a lost host's rank never answers
            if lost is not None:
                raise lost
            if thread.is_alive():
                raise RuntimeError(f"a rank failed and Horovod had not ended the job {STOP_GRACE_S} s later")
        if "error" in outcome:
            cause = job.root_cause()
            lost = executors.wait_for_loss(LOST_GRACE_S) if cause is None or cause.collateral else None
            raise lost or outcome["error"]
        return outcome["results"]


def _wait_or_give_up(thread: threading.Thread, job: JobFolder, executors: ExecutorLoss) -> LostHostError | None:
    """Wait for Horovod's thread; return early with Spark's lost host, or once a rank's failure has been recorded
    for :data:`STOP_GRACE_S` (the thread is then still alive)."""
    failed_at = None
    while thread.is_alive():
        thread.join(0.5)
        lost = executors.check()
        if lost is not None:
            return lost
        failed_at = failed_at or (time.monotonic() if job.failures() else None)
        if failed_at is not None and time.monotonic() - failed_at > STOP_GRACE_S:
            return None
    return None


@contextmanager
def _stopped_by(stop: threading.Event) -> Iterator[None]:
    """While ``horovod.spark.run`` runs in a thread: its stop signal is ``stop``, which the driver sets. Horovod
    0.28.1 makes that event itself and sets it from SIGINT/SIGTERM handlers, which only the main thread may
    install (``register_shutdown_event`` in ``horovod.runner.gloo_run``)."""
    from horovod.runner import gloo_run

    original = gloo_run.register_shutdown_event
    gloo_run.register_shutdown_event = lambda: stop
    try:
        yield
    finally:
        gloo_run.register_shutdown_event = original


def _nics() -> set[str] | None:
    """The interface Horovod's processes talk over: the one the parameter file names (``COURSE_NETWORK_INTERFACE``,
    see :mod:`helpers.network`); else None, and Horovod keeps the interfaces over which every task reached every
    other in its own probe (it never trusts what a hostname resolves to, and a driver's interface name may differ
    from the workers')."""
    return {os.environ[INTERFACE_ENV]} if os.environ.get(INTERFACE_ENV) else None


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
