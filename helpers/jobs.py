"""One protocol for every launcher's jobs: a job folder, failure records, one root-cause rule, MLflow clean-up.

A launcher (``HorovodRunner``, the TorchDistributor launcher, any later one) runs the user's function in several
processes. Each job gets a :class:`JobFolder` on the driver's work directory (shared storage on a real cluster).
The function runs inside :class:`WorkerCall` in every process: when it raises, the process writes a failure record
(rank, time, traceback, whether the error only echoes another rank's) and re-raises. The training code records
the MLflow runs it opens (:func:`record_mlflow_run`). When the job fails, the launcher asks the folder for the root
cause (:meth:`JobFolder.root_cause`), ends the recorded runs that are still RUNNING as FAILED, and raises its
subclass of :class:`JobError`. Every write is atomic (write aside, then rename), so the driver never reads half a
record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from pyspark import cloudpickle as spark_cloudpickle

from helpers.network import pin_interface
from helpers.processes import end_with_parent
from helpers.spark import worker_env
from helpers.validation import whole_number
from helpers.workdir import work_dir

__all__ = [
    "DEFAULT_STALL_TIMEOUT_S",
    "JOB_DIR_ENV",
    "STALL_HINT",
    "STALL_TIMEOUT_ENV",
    "CollectiveWatch",
    "Failure",
    "JobError",
    "JobFolder",
    "SealedCall",
    "StalledCollectiveError",
    "WorkerCall",
    "is_collateral",
    "last_checkpoint",
    "opened",
    "pin_threads",
    "ranked_call",
    "record_mlflow_run",
    "resume_hint",
    "run_job",
    "stall_timeout_s",
    "write_atomically",
    "worker_credentials",
]

JOB_DIR_ENV = "COURSE_JOB_DIR"  # set in every worker process: its job's folder
# The notebook's active MLflow experiment and run (``mlflow.set_experiment`` exports the id): not the workers'; a
# worker inheriting them would log into, or fail on, an experiment of another store. Training picks its own by name.
_DRIVER_ONLY_ENV = ("MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")
DATABRICKS_CREDENTIALS = ("DATABRICKS_HOST", "DATABRICKS_TOKEN")

#: How long a rank may wait in one collective (allreduce, broadcast, ...) before the job is ended as stalled.
STALL_TIMEOUT_ENV = "COURSE_STALL_TIMEOUT_S"
#: The course default: far above a step on the laptop, far below the grader's per-notebook timeout; raise it on a
#: cluster whose first steps are slow (NCCL start-up, data caching): see docs/instructor.md.
DEFAULT_STALL_TIMEOUT_S = 120
STALL_HINT = (
    "Usual causes: uneven shards (a rank with fewer batches), a rank that skipped a step or raised before the "
    "allreduce, a metric logged with sync_dist=True on one rank only."
)

# what a rank raises when *another* rank stopped: Horovod's shutdown, torch.distributed's broken connections
_COLLATERAL_TYPES = ("HorovodInternalError", "DistNetworkError", "DistBackendError")
_COLLATERAL_TEXT = re.compile(
    r"Horovod has been shut down|gloo|nccl|Connection (closed|reset)|ProcessGroup|Broken pipe", re.IGNORECASE
)


class JobError(RuntimeError):
    """A distributed job failed. The base of every launcher's error.

    Attributes:
        rank: the rank that failed first (the root cause), or None when no rank can be named.
        reason: the root cause in one line.
        worker_traceback: that rank's Python traceback ("" when it died without a Python error).
        exit_code: its exit code when the launcher knows it, else None.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        reason: str = "",
        worker_traceback: str = "",
        exit_code: int | None = None,
    ):
        super().__init__(message)
        self.rank = rank
        self.reason = reason or message.splitlines()[0]
        self.worker_traceback = worker_traceback
        self.exit_code = exit_code
        self.last_checkpoint: str | None = None

    def add_resume_hint(self, checkpoint_dir: str | os.PathLike | None) -> JobError:
        """Name the checkpoint to resume from (``last.ckpt`` in ``checkpoint_dir``) at the end of the message's
        first line.

        Returns:
            This error, for ``raise error.add_resume_hint(folder)``.
        """
        self.last_checkpoint = last_checkpoint(checkpoint_dir)
        first, _, rest = str(self.args[0]).partition("\n")
        hinted = f"{first.rstrip('.')}. {resume_hint(self.last_checkpoint)}" + (f"\n{rest}" if rest else "")
        self.args = (hinted, *self.args[1:])
        return self


def last_checkpoint(folder: str | os.PathLike | None) -> str | None:
    """``last.ckpt`` in ``folder`` if it exists (what a rerun continues from)."""
    if folder and (Path(folder) / "last.ckpt").is_file():
        return str(Path(folder) / "last.ckpt")
    return None


def resume_hint(checkpoint: str | None) -> str:
    """What to do after a failed training: rerun from ``checkpoint``, or from the start when there is none."""
    if checkpoint:
        return f"Rerun with ckpt_restore={checkpoint!r} to continue from its last checkpoint."
    return "No checkpoint was written yet: rerun from the start."


@dataclass(frozen=True)
class Failure:
    """What a failing process recorded: its rank, when, whether it only echoes another rank's failure, how."""

    rank: int
    time: float
    collateral: bool
    text: str

    @property
    def last_line(self) -> str:
        """The exception line of the traceback (``ValueError: ...``), at most 300 characters."""
        lines = self.text.strip().splitlines()
        return lines[-1][:300] if lines else ""


def is_collateral(exc: BaseException) -> bool:
    """Whether ``exc`` only reports that another rank stopped (Horovod shut down, a closed Gloo/NCCL connection).

    Args:
        exc: the exception a worker raised.

    Returns:
        True for an echo of another rank's failure, False for an error of the worker's own (a root cause).
    """
    return type(exc).__name__ in _COLLATERAL_TYPES or bool(_COLLATERAL_TEXT.search(str(exc)))


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader never sees half a file (write aside, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class JobFolder:
    """The folder one job's processes and its driver share: failure records, MLflow runs, results.

    Args:
        path: the folder (created when something is written to it).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @classmethod
    def create(cls, launcher: str, work: str | os.PathLike | None = None) -> JobFolder:
        """A new, empty job folder under ``<work dir>/jobs``.

        Args:
            launcher: the launcher's name, the start of the folder's name.
            work: the work directory (default: the driver's, see :func:`helpers.workdir.work_dir`).

        Returns:
            The job folder (it exists).
        """
        folder = cls(work_dir(work) / "jobs" / f"{launcher}-{uuid.uuid4().hex}")
        folder.path.mkdir(parents=True)
        return folder

    @classmethod
    def current(cls) -> JobFolder | None:
        """Inside a worker process: its job's folder; elsewhere None."""
        path = os.environ.get(JOB_DIR_ENV)
        return cls(path) if path else None

    def record_failure(self, rank: int, exc: BaseException) -> None:
        """Record that this process (``rank``) raised ``exc``; called by :class:`WorkerCall`."""
        record = {
            "rank": rank,
            "time": time.time(),
            "collateral": is_collateral(exc),
            "text": "".join(traceback.format_exception(exc)),
        }
        write_atomically(self.path / f"failure-rank-{rank}.json", json.dumps(record).encode())

    def failures(self) -> dict[int, Failure]:
        """The failure records written so far, by rank."""
        records = (json.loads(path.read_text()) for path in sorted(self.path.glob("failure-rank-*.json")))
        return {record["rank"]: Failure(**record) for record in records}

    def root_cause(self) -> Failure | None:
        """The failure that explains the job's: the earliest of a rank's own errors, else the earliest echo.

        Returns:
            That failure, or None when no process recorded one (they were killed, or the job never started).
        """
        failures = sorted(self.failures().values(), key=lambda f: (f.collateral, f.time))
        return failures[0] if failures else None

    def record_host(self, rank: int, host: str, pid: int) -> None:
        """Note the host ``rank`` runs on and its process id (:class:`WorkerCall` does, first thing), so that the
        driver can name the host of a rank that stopped answering, and wait for the processes of this machine."""
        write_atomically(self.path / f"host-rank-{rank}.txt", f"{host}\n{pid}".encode())

    def _started(self) -> dict[int, tuple[str, int]]:
        """``(host, pid)`` of each rank that started, by rank."""
        found = {}
        for path in self.path.glob("host-rank-*.txt"):
            host, pid = path.read_text().split("\n")
            found[int(path.stem.rsplit("-", 1)[1])] = (host, int(pid))
        return found

    def hosts(self) -> dict[int, str]:
        """The host of each rank that started, by rank."""
        return {rank: host for rank, (host, _) in self._started().items()}

    def pids(self) -> dict[int, int]:
        """The process id of each rank that started (the latest, where a rank was started again), by rank."""
        return {rank: pid for rank, (_, pid) in self._started().items()}

    def local_pids(self) -> list[int]:
        """The process ids of the ranks that started on this machine."""
        return [pid for host, pid in self._started().values() if host == socket.gethostname()]

    def ranks_with_hosts(self, ranks: list[int]) -> str:
        """``2 (worker-2), 3 (worker-2)``: ``ranks`` with the host each started on, where known."""
        hosts = self.hosts()
        return ", ".join(f"{rank} ({hosts[rank]})" if rank in hosts else str(rank) for rank in ranks)

    def record_mlflow_run(self, run_id: str, tracking_uri: str) -> None:
        """Note an MLflow run a process opened, so the driver can end it FAILED if the process never does."""
        record = {"run_id": run_id, "tracking_uri": tracking_uri}
        write_atomically(self.path / f"mlflow-run-{run_id}.json", json.dumps(record).encode())

    def fail_open_mlflow_runs(self) -> None:
        """End as FAILED every recorded MLflow run still RUNNING (after a failed job: its processes are gone).

        A run that cannot be reached is reported in a warning, never raised: the worker's error comes first.
        """
        from mlflow.tracking import MlflowClient

        for path in sorted(self.path.glob("mlflow-run-*.json")):
            record = json.loads(path.read_text())
            try:
                client = MlflowClient(record["tracking_uri"])
                if client.get_run(record["run_id"]).info.status == "RUNNING":
                    client.set_terminated(record["run_id"], "FAILED")
            except Exception as exc:  # an unreachable store must not hide the worker's error
                warnings.warn(f"could not mark the MLflow run {record['run_id']} FAILED: {exc}", stacklevel=2)

    def record_waiting(self, rank: int, collective: str) -> None:
        """Note that ``rank`` has been waiting a while in ``collective`` (see :class:`CollectiveWatch`)."""
        write_atomically(self.path / f"waiting-rank-{rank}.json", json.dumps({"collective": collective}).encode())

    def clear_waiting(self, rank: int) -> None:
        """``rank`` left the collective it was noted waiting in."""
        (self.path / f"waiting-rank-{rank}.json").unlink(missing_ok=True)

    def waiting(self) -> dict[int, str]:
        """The collective each rank has been noted waiting in, by rank."""
        found = {}
        for path in self.path.glob("waiting-rank-*.json"):
            try:
                found[int(path.stem.rsplit("-", 1)[1])] = json.loads(path.read_text())["collective"]
            except FileNotFoundError:  # the rank left it meanwhile
                continue
        return found

    def write_json(self, name: str, record: dict) -> None:
        """Store ``record`` as the JSON file ``name`` in the folder, atomically (what a job's processes note for
        each other and for the driver)."""
        write_atomically(self.path / name, json.dumps(record).encode())

    def read_json(self, pattern: str) -> list[dict]:
        """The JSON records whose file names match ``pattern`` (a glob), in name order."""
        return [json.loads(path.read_text()) for path in sorted(self.path.glob(pattern))]

    def write_result(self, data: bytes) -> None:
        """Store rank 0's pickled result, for launchers that do not return it themselves."""
        write_atomically(self.path / "result.pkl", data)

    def read_result(self) -> bytes | None:
        """Rank 0's pickled result, or None if it wrote none."""
        path = self.path / "result.pkl"
        return path.read_bytes() if path.exists() else None

    def remove(self) -> None:
        """Delete the folder and everything in it."""
        shutil.rmtree(self.path, ignore_errors=True)


def record_mlflow_run(run_id: str, tracking_uri: str) -> None:
    """Inside a launcher's worker, note an MLflow run this process opened (see :meth:`JobFolder.record_mlflow_run`).

    Args:
        run_id: the MLflow run's id.
        tracking_uri: where the run is stored.

    Outside a job (a plain ``train`` call in a notebook) it does nothing.
    """
    job = JobFolder.current()
    if job is not None:
        job.record_mlflow_run(run_id, tracking_uri)


def stall_timeout_s() -> int:
    """The stall bound in seconds: ``COURSE_STALL_TIMEOUT_S`` if set, else :data:`DEFAULT_STALL_TIMEOUT_S`.

    Returns:
        How long a rank may wait in one collective before its job is ended.

    Raises:
        CourseInputError: the variable is not a whole number of seconds of at least 1.
    """
    value = os.environ.get(STALL_TIMEOUT_ENV)
    if value is None:
        return DEFAULT_STALL_TIMEOUT_S
    number = int(value) if value.strip().isdigit() else value
    return whole_number(STALL_TIMEOUT_ENV, number, hint="It bounds one wait in a collective, in seconds.")


class StalledCollectiveError(RuntimeError):
    """A rank waited longer than the stall bound in one collective: the other ranks never joined it."""


class CollectiveWatch(threading.Thread):
    """Inside a worker: ends the process when it waits in one collective longer than the stall bound.

    A launcher's hooks call :meth:`enter` and :meth:`leave` around every blocking collective. A wait longer than a
    second is noted in the job folder (so a stalled rank can say where the others wait); a wait longer than
    ``timeout_s`` is recorded as this rank's failure (a :class:`StalledCollectiveError` naming the collective and
    the ranks that did not join) and the process exits, which ends the job; the driver adds :data:`STALL_HINT`.

    Args:
        job: the job's folder.
        rank, world_size: this process's rank and the number of processes.
        timeout_s: the stall bound in seconds.
    """

    def __init__(self, job: JobFolder, rank: int, world_size: int, timeout_s: float, poll_s: float = 0.25):
        super().__init__(name="course-collective-watch", daemon=True)
        self.job, self.rank, self.world_size = job, rank, world_size
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._lock = threading.Lock()
        self._current: tuple[str, float] | None = None
        self._noted = False

    def enter(self, collective: str) -> None:
        """This rank starts waiting in ``collective``."""
        with self._lock:
            self._current, self._noted = (collective, time.monotonic()), False

    def leave(self) -> None:
        """This rank's wait is over."""
        with self._lock:
            if self._noted:
                self.job.clear_waiting(self.rank)
            self._current, self._noted = None, False

    def run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            with self._lock:
                if self._current is None:
                    continue
                collective, since = self._current
                waited = time.monotonic() - since
                if waited > 1 and not self._noted:
                    self.job.record_waiting(self.rank, collective)
                    self._noted = True
            if waited > self.timeout_s:
                self._fail(collective, waited)

    def _fail(self, collective: str, waited: float) -> None:
        """Record the stall as this rank's failure and end the process (the launcher then stops the others)."""
        elsewhere = self.job.waiting()
        missing = [r for r in range(self.world_size) if r != self.rank and elsewhere.get(r) != collective]
        hosts = self.job.hosts()
        where = ", ".join(
            f"{r} ({hosts.get(r, 'host unknown')}, waiting in {elsewhere[r]!r})" if r in elsewhere
            else f"{r} ({hosts[r]})" if r in hosts else str(r)
            for r in missing
        )  # fmt: skip
        error = StalledCollectiveError(
            f"rank {self.rank} waited {waited:.0f} s in {collective!r}; rank(s) {where or '?'} did not join it "
            f"(stall bound {self.timeout_s:g} s, {STALL_TIMEOUT_ENV})"
        )
        self.job.record_failure(self.rank, error)
        print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(1)


def pin_threads(threads: int) -> int:
    """Give this process ``threads`` compute threads (OpenMP, MKL, torch), so processes sharing cores do not fight.

    Args:
        threads: the thread count; values below 1 count as 1.

    Returns:
        The thread count set.
    """
    threads = max(1, threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ImportError:
        return threads
    torch.set_num_threads(threads)
    return threads


def worker_credentials() -> dict[str, str]:
    """On the driver: what a training process on a worker needs to log to the workspace's MLflow on Databricks.

    A Spark task does not inherit the notebook's authentication, so the launchers hand every process the
    workspace's URL and a token (``DATABRICKS_HOST``, ``DATABRICKS_TOKEN``), the way Databricks' TorchDistributor
    examples do: taken from the driver's environment when set, else from the notebook's context.

    Returns:
        The two variables on Databricks (or where the driver's environment sets both), else an empty dict.
    """
    found = {name: os.environ[name] for name in DATABRICKS_CREDENTIALS if os.environ.get(name)}
    if len(found) == len(DATABRICKS_CREDENTIALS):
        return found
    if "DATABRICKS_RUNTIME_VERSION" not in os.environ:
        return {}
    from pyspark.dbutils import DBUtils  # only on Databricks
    from pyspark.sql import SparkSession

    context = DBUtils(SparkSession.getActiveSession()).notebook.entry_point.getDbutils().notebook().getContext()
    return {"DATABRICKS_HOST": context.apiUrl().get(), "DATABRICKS_TOKEN": context.apiToken().get()}


class WorkerCall:
    """What every process of a job runs: the user's function, with a failure record if it raises.

    Args:
        fn: the user's function.
        job: the job's folder.
        rank_env: the environment variable holding the process's global rank (``HOROVOD_RANK``, ``RANK``).
        setup: called first in the process (a launcher's own preparations), or None.

    The driver's MLflow credentials for a Databricks workspace (:func:`worker_credentials`) and the variables of
    the parameter file's ``runner.env`` (:func:`helpers.spark.worker_env`) are taken when the call is made and set
    in every process, so that rank 0 can log from a Spark task; the driver's active experiment and run ids are
    removed; Gloo and NCCL get the interface that :func:`helpers.network.pin_interface` chooses. The process ends
    with the one that started it (:func:`helpers.processes.end_with_parent`).
    """

    def __init__(self, fn: Callable[..., Any], job: JobFolder, rank_env: str, setup: Callable[[], None] | None = None):
        self.fn = fn
        self.job_path = str(job.path)
        self.rank_env = rank_env
        self.setup = setup
        self.env = {**worker_env(), **worker_credentials()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for name in _DRIVER_ONLY_ENV:
            os.environ.pop(name, None)
        os.environ.update(self.env)
        os.environ[JOB_DIR_ENV] = self.job_path
        end_with_parent()
        JobFolder(self.job_path).record_host(int(os.environ.get(self.rank_env, "0")), socket.gethostname(), os.getpid())
        pin_interface()
        if self.setup is not None:
            self.setup()
        try:
            return self.fn(*args, **kwargs)
        except BaseException as exc:
            JobFolder(self.job_path).record_failure(int(os.environ.get(self.rank_env, "0")), exc)
            raise


class SealedCall:
    """``fn(*args, **kwargs)`` sealed in bytes where it is made, opened only in the process that calls it, and its
    result sealed for the way back (:func:`opened`).

    A launcher's go-between processes (each Spark task of TorchDistributor, which only starts ``torchrun``; Ray
    Train's controller, which only hands the loop to the workers) unpickle what they pass on. A plain function would
    make each of them import everything it needs: Lightning and Petastorm, about 5 CPU-s a process, before any
    training process starts.

    Args:
        fn: the function the training processes run.
        args: its positional arguments.
        kwargs: its keyword arguments.
    """

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any):
        # pyspark's cloudpickle, as TorchDistributor itself pickles: a function sent by value keeps its file's name,
        # so a rank's traceback shows the learner's line (cloudpickle 3 names every such frame "<dynamic-code>")
        self.payload = spark_cloudpickle.dumps((fn, args, kwargs))

    def __call__(self) -> bytes:
        fn, args, kwargs = spark_cloudpickle.loads(self.payload)
        return spark_cloudpickle.dumps(fn(*args, **kwargs))


def opened(result: bytes | None) -> Any:
    """What a :class:`SealedCall` returned, unsealed (None stays None: a launcher that returns nothing)."""
    return None if result is None else spark_cloudpickle.loads(result)


class _ThreadsAndStallBound:
    """Run first in every process of a job that :func:`ranked_call` made: take ``threads`` compute threads; the
    driver's stall bound (the process group's timeout, see :func:`stall_timeout_s`)."""

    def __init__(self, threads: int, stall_timeout: int):
        self.threads = threads
        self.stall_timeout = stall_timeout

    def __call__(self) -> None:
        pin_threads(self.threads)
        os.environ[STALL_TIMEOUT_ENV] = str(self.stall_timeout)


class _SaveRankZeroResult:
    """Call ``fn`` and, on global rank 0, store its result in the job folder (``torchrun`` may lose it)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, **kwargs: Any) -> Any:
        result = self.fn(**kwargs)
        job = JobFolder.current()
        if job is not None and int(os.environ.get("RANK", "0")) == 0:
            job.write_result(cloudpickle.dumps(result))
        return result


def ranked_call(fn: Callable[..., Any], job: JobFolder, threads: int) -> WorkerCall:
    """The :class:`WorkerCall` of a job whose processes find their global rank in ``RANK`` (TorchDistributor,
    DeepSpeed, Ray Train).

    Args:
        fn: the user's function.
        job: the job's folder.
        threads: the compute threads each process takes (:func:`pin_threads`).

    Returns:
        A call that first takes ``threads`` threads and the driver's stall bound, then runs ``fn``; global rank 0
        stores what ``fn`` returned in the job folder, for :func:`run_job`.
    """
    return WorkerCall(
        _SaveRankZeroResult(fn), job, rank_env="RANK", setup=_ThreadsAndStallBound(threads, stall_timeout_s())
    )


def run_job(job: JobFolder, launch: Callable[[], Any], error_for: Callable[[Exception], JobError]) -> Any:
    """Run a job of :func:`ranked_call` processes to its end, and always remove its folder.

    Args:
        job: the job's folder.
        launch: starts the processes and returns when they are done (``distributor.run(call, ...)``, ...).
        error_for: the launcher's error for what ``launch`` raised; it runs while the folder still holds the
            failure records (:meth:`JobFolder.root_cause`).

    Returns:
        What the function returned on global rank 0 (None if it stored nothing).

    Raises:
        JobError: ``error_for``'s, after the job's MLflow runs still RUNNING were ended FAILED.
    """
    try:
        launch()
        stored = job.read_result()
        return cloudpickle.loads(stored) if stored is not None else None
    except Exception as exc:
        job.fail_open_mlflow_runs()
        raise error_for(exc) from exc
    finally:
        job.remove()
