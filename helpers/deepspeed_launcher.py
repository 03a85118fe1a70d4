"""DeepSpeed ZeRO under Spark: pyspark's ``DeepspeedTorchDistributor`` on the course's job protocol.

``pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor`` (pyspark 3.5) is a ``TorchDistributor``
that runs a training *file* as ``python -m torch.distributed.run --nproc_per_node=N FILE ARGS --deepspeed
--deepspeed_config CONFIG``; ``useGpu=False`` takes TorchDistributor's CPU path. Lightning's DeepSpeed strategy runs
on CUDA GPUs only, so the file (:mod:`helpers.deepspeed_train`) trains lesson 2's network in a plain PyTorch loop
around ``deepspeed.initialize``, which runs on the CPU with Gloo.

:func:`run_with_deepspeed` adds what :func:`helpers.distributor.run_with_distributor` adds to TorchDistributor:

* the config checked on the driver (:func:`helpers.zero.check_zero_config`) before any process starts, and written
  to the job folder (the distributor would leave a temporary file behind);
* **the job protocol** (:mod:`helpers.jobs`): a ``JobFolder`` ("deepspeed-..."), every rank's work inside a
  ``WorkerCall`` (failure records, the root cause), rank 0's result handed back through the folder, MLflow runs of a
  failed job ended FAILED, and a :class:`DeepSpeedJobError` naming the root cause;
* **quiet processes**: ``OMP_NUM_THREADS`` set to each process's threads (else ``torchrun`` sets 1 and prints a
  banner saying so), and no "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" from every rank
  (:class:`_QuietCommOp`; the op is only loaded, ``make setup`` built it).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from helpers import CourseInputError
from helpers.datamodule import ONE_PASS
from helpers.deepspeed_train import CALL_FILE, train_zero
from helpers.devices import precision_for
from helpers.distributor import failure_reason, spark_session, threads_per_process
from helpers.jobs import JobError, JobFolder, ranked_call, run_job
from helpers.spark import configure_python_env
from helpers.tracking import run_name as new_run_name
from helpers.training import TrainResult
from helpers.validation import check_flag, whole_number
from helpers.worker import TrainSettings
from helpers.zero import check_zero_config, zero_config

__all__ = [
    "DEFAULT_STAGE",
    "TRAIN_FILE",
    "DeepSpeedJobError",
    "job_env",
    "run_with_deepspeed",
    "train_with_deepspeed",
]

TRAIN_FILE = Path(__file__).with_name("deepspeed_train.py")
DEFAULT_STAGE = 2
# the Trainer's precision (helpers.devices.precision_for) as DeepSpeed's config names it
_DEEPSPEED_PRECISION = {"32-true": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}
_OP_BUILT = "built successfully"  # the end of the line DeepSpeed prints after loading its CPU communication op


class DeepSpeedJobError(JobError):
    """A DeepSpeed job failed: ``reason`` in one line (the root cause), its ZeRO ``stage`` and ``elapsed_s``."""

    def __init__(self, message: str, *, stage: int, elapsed_s: float, **details: Any):
        super().__init__(message, **details)
        self.stage = stage
        self.elapsed_s = elapsed_s


@contextlib.contextmanager
def job_env(**variables: str) -> Iterator[None]:
    """Set ``variables`` in this process's environment (which the jobs' processes inherit) for the block."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _quiet_build(build: Callable[[], Any]) -> Callable[[], Any]:
    """DeepSpeed's ``build_shm_op`` without its "... built successfully" line (what else it prints still shows)."""

    def quiet() -> Any:
        with contextlib.redirect_stdout(io.StringIO()) as said:
            op = build()
        sys.stdout.write("".join(line for line in said.getvalue().splitlines(True) if _OP_BUILT not in line))
        return op

    return quiet


@dataclass
class _QuietCommOp:
    """``fn`` run in a rank after DeepSpeed's CPU communication op is made to load without its announcement (each
    rank's process group, ``deepspeed.init_distributed``, loads it and prints one line)."""

    fn: Callable[..., Any]
    use_gpu: bool

    def __call__(self, **kwargs: Any) -> Any:
        from helpers.zero import load_deepspeed

        load_deepspeed(self.use_gpu)  # the accelerator chosen as join_process_group will, before its comm module
        comm = importlib.import_module("deepspeed.comm.torch")  # `deepspeed.comm.torch` the attribute is torch

        comm.build_shm_op = _quiet_build(comm.build_shm_op)
        return self.fn(**kwargs)


def run_with_deepspeed(
    fn: Callable[..., Any],
    config: dict[str, Any],
    *,
    num_processes: int = 2,
    use_gpu: bool = False,
    spark=None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(deepspeed_config=PATH, **kwargs)`` in ``num_processes`` DeepSpeed processes on this machine.

    ``DeepspeedTorchDistributor`` (local mode) starts :data:`TRAIN_FILE` under ``torch.distributed.run``; in each
    process the file calls ``fn`` inside the job's ``WorkerCall`` (rank from ``RANK``), then leaves the process
    group cleanly.

    Args:
        fn: the training function, importable in the processes (a module's function, e.g.
            :func:`helpers.deepspeed_train.train_zero`); it gets the config file's path as ``deepspeed_config``.
        config: the DeepSpeed config (see :func:`helpers.zero.zero_config`).
        num_processes: the processes (ranks) to start.
        use_gpu: one CUDA GPU per process (NCCL), else the CPU (Gloo).
        spark: the SparkSession (default: the active one).
        **kwargs: ``fn``'s other arguments (pickled with cloudpickle).

    Returns:
        What ``fn`` returned on global rank 0.

    Raises:
        CourseInputError: a bad process count, flag or config; no SparkSession.
        DeepSpeedJobError: a process raised or died; the message names the root cause.
    """
    from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor

    num_processes = whole_number("num_processes", num_processes, hint="One process per GPU or CPU share.")
    check_flag("use_gpu", use_gpu)
    check_zero_config(config, num_processes)
    spark = spark_session(spark)
    configure_python_env()
    job = JobFolder.create("deepspeed")
    config_file = job.path / "deepspeed_config.json"
    config_file.write_text(json.dumps(config, indent=2))
    threads = threads_per_process(spark, num_processes, True)
    call = ranked_call(_QuietCommOp(fn, use_gpu), job, threads)
    (job.path / CALL_FILE).write_bytes(cloudpickle.dumps((call, kwargs)))
    distributor = DeepspeedTorchDistributor(
        numGpus=num_processes, nnodes=1, localMode=True, useGpu=use_gpu, deepspeedConfig=str(config_file)
    )
    started = time.monotonic()

    def error_for(exc: Exception) -> DeepSpeedJobError:
        stage = config.get("zero_optimization", {}).get("stage", 0)
        return _job_error(exc, job, stage, num_processes, time.monotonic() - started)

    with job_env(OMP_NUM_THREADS=str(threads)):  # torchrun's own default is 1, announced in a banner
        return run_job(job, lambda: distributor.run(str(TRAIN_FILE), "--job", str(job.path)), error_for)


def _job_error(exc: BaseException, job: JobFolder, stage: int, num_processes: int, elapsed: float) -> DeepSpeedJobError:
    """The :class:`DeepSpeedJobError` of a failed job, its reason by :func:`helpers.distributor.failure_reason`."""
    cause = job.root_cause()
    reason = failure_reason(exc, job, num_processes)
    message = (
        f"DeepSpeed training (ZeRO stage {stage}) with {num_processes} processes on the driver failed after "
        f"{elapsed:.0f} s: {reason.rstrip('.')}. The job was stopped."
    )
    details = {"rank": cause.rank, "worker_traceback": cause.text} if cause is not None else {}
    return DeepSpeedJobError(message, reason=reason, stage=stage, elapsed_s=elapsed, **details)


def _check_settings(settings: TrainSettings) -> None:
    """Refuse the settings DeepSpeed's loop does not honour (it trains ``max_epochs`` epochs of one pass each)."""
    if settings.ckpt_restore:
        raise CourseInputError(
            "ckpt_restore: the DeepSpeed launcher does not resume from checkpoints; leave it None (or resume with "
            "launch_training's Horovod or TorchDistributor)."
        )
    if settings.epoch_mode != ONE_PASS or isinstance(settings.early_stopping, dict):
        raise CourseInputError(
            f"DeepSpeed's loop trains max_epochs epochs of one pass each: use epoch_mode={ONE_PASS!r} and no "
            "early_stopping settings."
        )


def train_with_deepspeed(
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings | None = None,
    *,
    stage: int | None = None,
    config: dict[str, Any] | None = None,
    num_processes: int = 2,
    spark=None,
) -> TrainResult:
    """Train lesson 2's network with DeepSpeed ZeRO on ``num_processes`` processes of this machine.

    Args:
        train_converter, val_converter: lesson 1's Petastorm converters.
        class_count: the number of classes.
        settings: the run's settings (default ``TrainSettings()``); the learning rate is per process and multiplied
            by the world size, as with the other launchers; ``mixed_precision`` gives bf16 (fp16 on older GPUs).
        stage: the ZeRO stage (default 2), for a config built by :func:`helpers.zero.zero_config`.
        config: your own DeepSpeed config instead (then leave ``stage`` None); its micro batch must be
            ``settings.batch_size``.
        num_processes: the processes to train with.
        spark: the SparkSession (default: the active one).

    Returns:
        Rank 0's ``TrainResult`` (``history`` per epoch; no checkpoints).

    Raises:
        CourseInputError: both ``stage`` and ``config``, a bad stage or config, or settings DeepSpeed's loop does
            not honour (``ckpt_restore``, ``epoch_mode``, ``early_stopping``).
        DeepSpeedJobError: training failed; the message names the root cause.
    """
    settings = settings or TrainSettings()
    _check_settings(settings)
    num_processes = whole_number("num_processes", num_processes, hint="One process per GPU or CPU share.")
    if config is None:
        precision = _DEEPSPEED_PRECISION[precision_for(settings.mixed_precision, settings.use_gpu)]
        config = zero_config(
            DEFAULT_STAGE if stage is None else stage,
            micro_batch_size=settings.batch_size,
            world_size=num_processes,
            learning_rate=settings.learning_rate * num_processes,
            precision=precision,
        )
    elif stage is not None:
        raise CourseInputError(f"stage={stage!r} and a config: pass a stage, or your own config with its stage in it.")
    elif config.get("train_micro_batch_size_per_gpu", settings.batch_size) != settings.batch_size:
        raise CourseInputError(
            f"config's train_micro_batch_size_per_gpu={config['train_micro_batch_size_per_gpu']!r} but "
            f"settings.batch_size={settings.batch_size}: the loaders read settings.batch_size rows per step; make "
            "them equal."
        )
    settings = settings.replace(run_name=settings.run_name or new_run_name("deepspeed", f"{num_processes}proc"))
    return run_with_deepspeed(
        train_zero,
        config,
        num_processes=num_processes,
        use_gpu=settings.use_gpu,
        spark=spark,
        train_converter=train_converter,
        val_converter=val_converter,
        class_count=class_count,
        settings=settings,
    )
