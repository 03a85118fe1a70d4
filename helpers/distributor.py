"""The TorchDistributor launcher: ``pyspark.ml.torch.distributor.TorchDistributor`` under the course's job protocol.

In distributed mode (``local_mode=False``) TorchDistributor runs one Spark barrier task per process, each starting
``torchrun`` for one process (the Trainer gets ``devices=1, num_nodes=N``); in local mode ``torchrun`` starts N
processes on the driver (``devices=N, num_nodes=1``). :func:`run_with_distributor` adds to a plain
``distributor.run(fn)``:

* **Preflight** (:func:`make_distributor`): not enough task slots for a barrier job, or ``use_gpu`` without one GPU
  per task, is reported before anything starts (a barrier job would otherwise wait and retry for minutes).
* **Fail fast.** Spark answers a failed barrier task by retrying the whole stage (training from epoch 0 again, or
  minutes of waiting when a worker is gone). A watchdog cancels the job as soon as a task fails or an executor is
  lost, and :class:`DistributorError` names the root cause and the last checkpoint to resume from.
* **The job protocol** (:mod:`helpers.jobs`): failure records and their root-cause rule, rank 0's result even when
  ``torchrun`` loses it, MLflow runs of a failed job ended FAILED.
* **A sealed call** (:func:`run_sealed`): the function, its arguments and rank 0's result travel as bytes through
  the Spark tasks that only start ``torchrun``, which never import what the function needs.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from helpers import CourseInputError
from helpers.jobs import (
    STALL_HINT,
    STALL_TIMEOUT_ENV,
    JobError,
    JobFolder,
    SealedCall,
    opened,
    ranked_call,
    run_job,
    stall_timeout_s,
)
from helpers.logs import drop_below_warning
from helpers.lost_hosts import LOST_GRACE_S, ExecutorLoss
from helpers.shared_storage import check_shared_folder
from helpers.spark import check_gpu_per_task, configure_python_env, task_slots
from helpers.validation import whole_number
from helpers.workdir import work_dir

# pyspark's launchers announce every start and end at INFO, in every notebook cell that trains with them
drop_below_warning("TorchDistributor", "DeepspeedTorchDistributor")

__all__ = [
    "DistributorError",
    "ddp_layout",
    "failure_reason",
    "make_distributor",
    "process_group_backend",
    "run_sealed",
    "run_with_distributor",
    "spark_session",
    "threads_per_process",
    "watched_job",
]

# a collective that ran past the process group's timeout (Gloo; NCCL's watchdog)
_TIMED_OUT = re.compile(r"Timed out waiting|collective operation timeout|Watchdog caught", re.IGNORECASE)
# a frame of the user's code in a traceback, and the line it ran
_USER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in \S+\n\s*(?P<code>(?!File ")\S.*)$', re.MULTILINE)
# a Python error line of a training process, possibly prefixed by torchrun with its rank
_ERROR_LINE = re.compile(
    r"^\s*(?:\[(?:rank|default)\d+\]:\s*)?([\w.]+(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE
)


class DistributorError(JobError):
    """A TorchDistributor job failed: ``reason`` in one line, ``last_checkpoint`` to resume from (or None)."""

    def __init__(self, message: str, *, elapsed_s: float, **details: Any):
        super().__init__(message, **details)
        self.elapsed_s = elapsed_s


def ddp_layout(num_processes: int, local_mode: bool) -> dict[str, int]:
    """The Trainer's ``devices`` and ``num_nodes`` for ``num_processes`` DDP processes under TorchDistributor.

    Local mode: one node (the driver) with ``num_processes`` devices. Distributed mode: every Spark task is a
    "node" of its own with one device (its GPU, or a CPU share).
    """
    whole_number("num_processes", num_processes)
    if local_mode:
        return {"devices": num_processes, "num_nodes": 1}
    return {"devices": 1, "num_nodes": num_processes}


def process_group_backend(use_gpu: bool) -> str:
    """The ``torch.distributed`` backend: NCCL between GPUs, Gloo between CPU processes."""
    return "nccl" if use_gpu else "gloo"


def spark_session(spark=None):
    """``spark``, else the session TorchDistributor will use: this thread's active one or the process's default."""
    from pyspark.sql import SparkSession

    if spark is not None:
        return spark
    try:
        return SparkSession.active()
    except Exception:  # pyspark raises its own error types here
        raise CourseInputError(
            "TorchDistributor needs a SparkSession: start the cluster (or get_spark()) first."
        ) from None


def make_distributor(num_processes: int = 2, use_gpu: bool = False, local_mode: bool = False, spark=None):
    """A ``TorchDistributor`` for ``num_processes`` processes, after checking the session can run them.

    Distributed mode needs ``num_processes`` free task slots at once (a barrier job), and on GPU one GPU per task
    (``spark.task.resource.gpu.amount=1``). Raises ``CourseInputError`` with what to change otherwise.
    """
    from pyspark.ml.torch.distributor import TorchDistributor

    ddp_layout(num_processes, local_mode)
    spark = spark_session(spark)
    if not local_mode:
        slots = task_slots(spark)
        if num_processes > slots:
            raise CourseInputError(
                f"TorchDistributor(num_processes={num_processes}, local_mode=False) runs {num_processes} Spark tasks "
                f"at once, but the session has {slots} task slots: use num_processes={slots} or add workers."
            )
        if use_gpu:
            check_gpu_per_task(spark, f"TorchDistributor(num_processes={num_processes}, local_mode=False)")
    return TorchDistributor(num_processes=num_processes, local_mode=local_mode, use_gpu=use_gpu)


class _Watchdog(threading.Thread):
    """Cancels a distributed TorchDistributor job as soon as one of its tasks fails or an executor is lost.

    Spark would retry the barrier stage: training from epoch 0 again, or minutes of waiting for slots when a worker
    is gone. ``reason`` says why it cancelled (None if it did not).
    """

    def __init__(self, spark, group: str, executors_needed: int, poll_s: float = 0.5):
        super().__init__(name="torch-distributor-watchdog", daemon=True)
        self.spark = spark
        self.sc = spark.sparkContext
        self.group = group
        self.executors = ExecutorLoss(spark, executors_needed)
        self.poll_s = poll_s
        self.done = threading.Event()
        self.reason: str | None = None
        self.task_failed = False  # the reason is a failed task, which may turn out a lost host (see why())

    def why(self) -> str | None:
        """Why the job ended: a host that lost its executors, else :attr:`reason` (a failed task is given
        :data:`helpers.lost_hosts.LOST_GRACE_S` to turn out a lost host)."""
        lost = self.executors.wait_for_loss(LOST_GRACE_S if self.task_failed else 0)
        return str(lost) if lost is not None else self.reason

    def run(self) -> None:
        tracker = self.sc.statusTracker()
        while not self.done.wait(self.poll_s):
            try:
                lost = self.executors.check()
                if lost is not None:
                    self.reason = str(lost)
                failed = 0
                for job_id in tracker.getJobIdsForGroup(self.group):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in job.stageIds if job else []:
                        stage = tracker.getStageInfo(stage_id)
                        if stage and (stage.numFailedTasks > 0 or stage.currentAttemptId > 0):
                            failed += 1
                if failed and self.reason is None:
                    self.task_failed = True
                    self.reason = "a training task failed (its process raised, exited or was killed)"
                if self.reason:
                    self.sc.cancelJobGroup(self.group)
                    return
            except Exception:  # the context may be stopping: nothing left to watch
                if self.sc._jsc is None:
                    return


@contextlib.contextmanager
def watched_job(spark, num_processes: int) -> Iterator[_Watchdog]:
    """Run the distributed TorchDistributor job started inside the block under a :class:`_Watchdog`: cancelled as
    soon as one of its tasks fails or an executor is lost (not retried by Spark); ``watchdog.reason`` says why."""
    sc = spark.sparkContext
    group = f"torch-distributor-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "TorchDistributor training", interruptOnCancel=True)
    watchdog = _Watchdog(spark, group, executors_needed=num_processes)
    watchdog.start()
    try:
        yield watchdog
    finally:
        watchdog.done.set()
        watchdog.join()
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)


def _summarise(error: BaseException) -> str:
    """The most telling line of a failed TorchDistributor job: the training process's last Python error, else
    torchrun's return code, else the first line of Spark's error."""
    text = str(error)
    errors = [
        line.strip()
        for line in _ERROR_LINE.findall(text)
        if not line.strip().startswith(("py4j", "org.apache", "java.", "pyspark."))
    ]
    meaningful = [line for line in errors if "ChildFailedError" not in line and "RuntimeError: Command" not in line]
    if meaningful:
        return meaningful[-1][:300]
    code = re.search(r"failed with return code (-?\d+)", text)
    if code:
        return f"torchrun exited with code {code.group(1)}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return first[:300]


def threads_per_process(spark, num_processes: int, local_mode: bool) -> int:
    """CPU threads for each training process: its task's cores on a cluster, a share of this machine locally."""
    if local_mode:
        return max(1, (os.cpu_count() or 1) // num_processes)
    return max(1, int(spark.conf.get("spark.task.cpus", "1")))


def run_sealed(distributor, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``distributor.run(fn, *args, **kwargs)``, with the call and rank 0's result sealed in bytes
    (:class:`helpers.jobs.SealedCall`): in distributed mode each Spark task, which only starts ``torchrun``, would
    otherwise unpickle the call to pickle it again, and rank 0's result to send it back, importing what they need.

    Args:
        distributor: a ``TorchDistributor``.
        fn: the function every training process runs.
        args: ``fn``'s positional arguments.
        kwargs: ``fn``'s keyword arguments.

    Returns:
        What ``fn`` returned on global rank 0 (what ``distributor.run`` returns).
    """
    return opened(distributor.run(SealedCall(fn, *args, **kwargs)))


def run_with_distributor(
    distributor,
    fn: Callable[..., Any],
    *,
    checkpoint_dir: str | None = None,
    fail_fast: bool = True,
    spark=None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(**kwargs)`` in every process of ``distributor``'s job; return global rank 0's result.

    Args:
        distributor: a ``TorchDistributor`` (see :func:`make_distributor`).
        fn: the function every process runs (it finds its rank in ``RANK``, the world size in ``WORLD_SIZE``).
        checkpoint_dir: where ``fn`` writes checkpoints, so that an error can name the last one.
        fail_fast: in distributed mode, cancel the job as soon as a task fails or an executor is lost.
        spark: the SparkSession (default: the active one).
        **kwargs: ``fn``'s arguments.

    Returns:
        What ``fn`` returned on global rank 0.

    Raises:
        DistributorError: a process raised or died; the message names the root cause and the checkpoint to resume.
    """
    spark = spark_session(spark)
    configure_python_env()
    num_processes, local_mode = distributor.num_processes, distributor.local_mode
    if not local_mode:
        check_shared_folder(spark, work_dir())
    job = JobFolder.create("torch_distributor")
    call = ranked_call(fn, job, threads_per_process(spark, num_processes, local_mode))
    watch = watched_job(spark, num_processes) if fail_fast and not local_mode else contextlib.nullcontext()
    started = time.monotonic()
    with watch as watchdog:

        def error_for(exc: Exception) -> DistributorError:
            elapsed = time.monotonic() - started
            return _distributor_error(exc, watchdog, job, checkpoint_dir, distributor, elapsed)

        return run_job(job, lambda: run_sealed(distributor, call, **kwargs), error_for)


def _stall_reason(job: JobFolder, num_processes: int) -> str | None:
    """When ranks of the job timed out in a collective: which, where in their code, which ranks did not join, and
    the usual causes (:data:`helpers.jobs.STALL_HINT`); else None."""
    timed_out = {rank: f.text for rank, f in job.failures().items() if _TIMED_OUT.search(f.text)}
    if not timed_out:
        return None
    waited = []
    for rank, text in sorted(timed_out.items()):
        frames = [
            m for m in _USER_FRAME.finditer(text) if "site-packages" not in m["file"] and "<frozen" not in m["file"]
        ]
        waited.append(f"{rank} (at `{frames[-1]['code'].strip()}`)" if frames else str(rank))
    missing = job.ranks_with_hosts([rank for rank in range(num_processes) if rank not in timed_out]) or "?"
    return (
        f"a collective stalled: rank(s) {', '.join(waited)} waited longer than the stall bound "
        f"({stall_timeout_s()} s, {STALL_TIMEOUT_ENV}) and rank(s) {missing} "
        f"did not join it. {STALL_HINT.rstrip('.')}"
    )


def failure_reason(exc: BaseException, job: JobFolder, num_processes: int, lost: str | None = None) -> str:
    """Why a job of ``torchrun`` processes failed, in one line, by the job protocol's rule.

    Args:
        exc: what the launcher raised.
        job: the job's folder, with its failure records.
        num_processes: the job's processes.
        lost: the watchdog's reason when an executor was lost, or None.

    Returns:
        A stall (ranks that timed out in a collective) unless a rank raised an error of its own; else that error;
        else ``lost``; else an echo of another rank's failure; else the best line of ``exc``.
    """
    cause = job.root_cause()
    stall = _stall_reason(job, num_processes)
    if stall and (cause is None or cause.collateral):
        return stall
    if cause is not None and (not cause.collateral or lost is None):
        return f"rank {cause.rank} raised {cause.last_line}"
    return lost or _summarise(exc)


def _distributor_error(
    exc: BaseException, watchdog, job: JobFolder, checkpoint_dir: str | None, distributor, elapsed: float
) -> DistributorError:
    """The :class:`DistributorError` for a failed job, by the job protocol's rule: a rank's own error; else a
    lost executor (no Python error); else an echo of another rank's failure; else the best line of Spark's error."""
    cause = job.root_cause()
    lost = watchdog.why() if watchdog is not None and (cause is None or cause.collateral) else None
    reason = failure_reason(exc, job, distributor.num_processes, lost=lost)
    mode = "on the driver" if distributor.local_mode else "on Spark workers"
    message = (
        f"TorchDistributor training with {distributor.num_processes} processes {mode} failed after {elapsed:.0f} s: "
        f"{reason.rstrip('.')}. The job was stopped"
    )
    details = {"rank": cause.rank, "worker_traceback": cause.text} if cause is not None else {}
    error = DistributorError(message, reason=reason, elapsed_s=elapsed, **details)
    return error.add_resume_hint(checkpoint_dir)
