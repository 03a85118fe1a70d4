"""Ray Train as a launcher: ``fn(**kwargs)`` in every worker of a ``TorchTrainer``, on the course's job protocol.

Ray Train starts one worker (a Ray actor) per training process on the Ray cluster this process is connected to
(:func:`helpers.ray_on_spark.ray_cluster`), sets up ``torch.distributed`` in them (Gloo on the CPU, NCCL between
GPUs) and exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` like ``torchrun``. :func:`run_with_ray` adds what the other
launchers give (:mod:`helpers.jobs`): every worker runs inside a :class:`~helpers.jobs.WorkerCall` (a failure
record when it raises), takes its share of the CPU threads, returns rank 0's result; a failed job ends its
MLflow runs FAILED and raises :class:`RayJobError` naming the rank that failed first and its error, or the rank
whose process died without one (killed, out of memory). ``max_failures`` is Ray Train's ``FailureConfig``: after
a failure Ray Train stops every worker and starts a new group, which resumes from the last checkpoint a training
function reported (:mod:`helpers.ray_faults` shows it).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import psutil

from helpers import RAY_TRAIN_V2, CourseInputError
from helpers.distributor import process_group_backend
from helpers.jobs import JobError, JobFolder, SealedCall, ranked_call, run_job, stall_timeout_s
from helpers.validation import check_flag, whole_number

__all__ = ["RayJobError", "run_with_ray"]


_WORKER_EXIT_S = 30  # Ray Train's own patience with a worker that does not exit is 5 s, then it kills it


class RayJobError(JobError):
    """A Ray Train job failed: ``reason`` names the root cause (see :class:`helpers.jobs.JobError`)."""


def _check_resources(num_workers: int, cpus_per_worker: int, use_gpu: bool) -> None:
    """Refuse a job the connected Ray cluster cannot place (Ray would wait for resources forever)."""
    import ray

    if not ray.is_initialized():
        raise CourseInputError(
            "run_with_ray needs a running Ray cluster: start one with `with ray_cluster(spark):` "
            "(helpers.ray_on_spark) and launch inside the block."
        )
    have = ray.cluster_resources()
    for resource, each in (("CPU", cpus_per_worker), ("GPU", 1 if use_gpu else 0)):
        available = have.get(resource, 0)
        if num_workers * each > available:
            raise CourseInputError(
                f"{num_workers} Ray Train workers of {each} {resource} need {num_workers * each}, but the Ray cluster "
                f"has {available:g}: use num_workers={int(available // each)} or fewer, or more Ray worker nodes."
            )


def _require_v2() -> None:
    """Refuse Ray Train's V1 API: it was imported before ``RAY_TRAIN_V2_ENABLED=1`` was set."""
    from ray.train.v2._internal.constants import is_v2_enabled

    if not is_v2_enabled():
        raise CourseInputError(
            f"Ray Train's V1 API is loaded ({RAY_TRAIN_V2} is not 1 when ray.train was imported): restart the "
            f"kernel, set os.environ['{RAY_TRAIN_V2}'] = '1' (or import helpers) before anything imports ray.train."
        )


def _trainer(
    loop: SealedCall, job: JobFolder, num_workers: int, cpus_per_worker: int, use_gpu: bool, max_failures: int
):
    """The ``TorchTrainer`` (Ray Train V2: its controller takes no resources, so the workers may have every CPU):
    one worker of ``cpus_per_worker`` CPUs per Ray node if it can (SPREAD), ``max_failures`` restarts of the worker
    group, its files (checkpoints) in the job folder."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        loop,
        torch_config=TorchConfig(backend=process_group_backend(use_gpu), timeout_s=stall_timeout_s()),
        scaling_config=ScalingConfig(
            num_workers=num_workers,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": cpus_per_worker},
            placement_strategy="SPREAD",
        ),
        run_config=RunConfig(
            name="ray_train", storage_path=str(job.path), failure_config=FailureConfig(max_failures=max_failures)
        ),
    )


def run_with_ray(
    fn: Callable[..., Any],
    num_workers: int = 2,
    *,
    use_gpu: bool = False,
    cpus_per_worker: int = 1,
    max_failures: int = 0,
    **kwargs: Any,
) -> Any:
    """Run ``fn(**kwargs)`` in every worker of a Ray Train ``TorchTrainer``; return global rank 0's result.

    Args:
        fn: the function every worker runs (``torch.distributed`` is set up; ``RANK``, ``WORLD_SIZE`` exported).
        num_workers: how many workers (training processes).
        use_gpu: one GPU per worker, NCCL between them (else Gloo on the CPU).
        cpus_per_worker: the CPUs each worker takes (and its compute threads).
        max_failures: how many failures Ray Train recovers from (``FailureConfig``): it stops the worker group and
            starts a new one, whose ``fn`` resumes from ``ray.train.get_checkpoint()`` (None if it reported none).
        **kwargs: ``fn``'s arguments.

    Returns:
        What ``fn`` returned on global rank 0.

    Raises:
        CourseInputError: a bad count, no Ray cluster connected, or too few CPUs or GPUs in it.
        RayJobError: a worker raised or died; the message names the root cause.
    """
    whole_number("num_workers", num_workers)
    whole_number("cpus_per_worker", cpus_per_worker)
    whole_number("max_failures", max_failures, minimum=0, hint="Restarts of the worker group after a failure.")
    check_flag("use_gpu", use_gpu)
    _require_v2()
    _check_resources(num_workers, cpus_per_worker, use_gpu)
    job = JobFolder.create("ray")
    # sealed: Ray Train's controller only hands the loop on (the arguments stay out of train_loop_config, which Ray
    # Tune copies and searches)
    loop = SealedCall(ranked_call(fn, job, cpus_per_worker), **kwargs)
    started = time.monotonic()

    def error_for(exc: Exception) -> RayJobError:
        return _ray_error(exc, job, num_workers, time.monotonic() - started)

    def launch() -> Any:
        try:
            return _trainer(loop, job, num_workers, cpus_per_worker, use_gpu, max_failures).fit()
        finally:
            _wait_for_workers(job)

    return run_job(job, launch, error_for)


def _wait_for_workers(job: JobFolder) -> None:
    """Wait until the job's workers on this machine have exited: after a failure Ray Train kills them a moment after
    ``fit`` returns, and until then rank 0 still holds torch's rendezvous store, listening on every interface."""
    processes = []
    for pid in job.local_pids():
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(processes, timeout=_WORKER_EXIT_S)
    if alive:
        warnings.warn(f"Ray Train workers left running after the job: {[p.pid for p in alive]}", stacklevel=3)


def _lost_ranks(exc: BaseException) -> list[int]:
    """The ranks whose process Ray Train lost (its health check of the worker failed: the process died)."""
    failures = getattr(exc, "worker_failures", None) or {}
    return sorted(rank for rank, error in failures.items() if type(error).__name__ == "WorkerHealthCheckFailedError")


def _ray_error(exc: BaseException, job: JobFolder, num_workers: int, elapsed: float) -> RayJobError:
    """The :class:`RayJobError` for a failed job: a rank's own error first, then a rank whose process died (it
    records nothing; the others' errors only echo it), then an echo, else Ray's error."""
    cause, lost = job.root_cause(), _lost_ranks(exc)
    details: dict[str, Any] = {}
    if cause is not None and (not cause.collateral or not lost):
        reason = f"rank {cause.rank} raised {cause.last_line}"
        details = {"rank": cause.rank, "worker_traceback": cause.text}
    elif lost:
        pids = job.pids()
        where = ", ".join(f"{rank} (pid {pids[rank]})" if rank in pids else str(rank) for rank in lost)
        reason = f"rank {where} died without a Python error (its process was killed, or ran out of memory)"
        details = {"rank": lost[0]}
    else:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:300]
    message = f"Ray Train training with {num_workers} workers failed after {elapsed:.0f} s: {reason}."
    return RayJobError(message, reason=reason, **details)
