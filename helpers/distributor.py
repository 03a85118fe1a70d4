"""Lesson 4: one training function, two launchers on a Spark cluster.

The lesson 2 pieces (``PetastormDataModule``, ``LitClassificationModel``, ``train``) run unchanged under both:

* **Horovod on Spark**: ``HorovodRunner(np=N).run(train_hvd, ...)`` starts N Horovod processes as Spark tasks;
  ``train_hvd`` is lesson 3's function (``HorovodStrategy``, learning rate x world size).
* **TorchDistributor**: ``train_with_distributor(...)`` runs the same body with Lightning's DDP strategy through
  ``pyspark.ml.torch.distributor.TorchDistributor``. In distributed mode (``local_mode=False``) it runs one Spark
  barrier task per process, each starting ``torchrun`` for one process: the Trainer gets ``devices=1,
  num_nodes=N``. In local mode ``torchrun`` starts N processes on the driver: ``devices=N, num_nodes=1``. DDP
  talks Gloo on CPU and NCCL on GPU. The learning rate is scaled by the world size as Horovod does, so the two
  launchers train alike.

What ``train_with_distributor`` adds to a plain ``TorchDistributor(...).run(fn)``:

* **Preflight.** Not enough task slots for a barrier job, or ``use_gpu`` without one GPU per task, is reported
  before anything starts (a barrier job would otherwise wait and retry for minutes).
* **Fail fast, resume from a checkpoint.** Spark answers a failed barrier task by retrying the whole stage, which
  restarts training from epoch 0 (and, when a worker is gone, waits up to 10 minutes for free slots). A watchdog
  stops the job as soon as a task fails or an executor is lost, and :class:`DistributorError` says what happened
  and names the last checkpoint: rerun with ``ckpt_restore=error.last_checkpoint`` to continue from it.
* **Rank 0's result** comes back in both modes (in local mode ``torchrun``'s processes share one output file), and
  an MLflow run of a failed job is ended FAILED, not left RUNNING.

On a real multi-node cluster the checkpoint folder, the MLflow store and the work directory must be on shared
storage (DBFS, a volume, S3/ABFS) that every worker reads and writes; on the local cluster they are one disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import cloudpickle

from helpers import CourseInputError
from helpers.devices import precision_for
from helpers.horovod_runner import JOB_DIR_ENV, fail_open_mlflow_runs
from helpers.spark import check_gpu_per_task, configure_python_env
from helpers.training import TrainResult
from helpers.validation import check_flag
from helpers.workdir import ENV_VAR, work_dir, work_path

__all__ = [
    "DistributorError",
    "TrainSettings",
    "ddp_layout",
    "make_distributor",
    "process_group_backend",
    "task_slots",
    "train_hvd",
    "train_process",
    "train_with_distributor",
    "watched_job",
]

LAUNCHERS = ("horovod", "torch_distributor")
_RESULT_FILE = "rank0-result.pkl"
# a Python error line of a training process, possibly prefixed by torchrun with its rank
_ERROR_LINE = re.compile(
    r"^\s*(?:\[(?:rank|default)\d+\]:\s*)?([\w.]+(?:Error|Exception|Interrupt)\b.*)$", re.MULTILINE
)


class DistributorError(RuntimeError):
    """A TorchDistributor job failed: ``reason`` in one line, ``last_checkpoint`` to resume from (or None)."""

    def __init__(self, message: str, reason: str, last_checkpoint: str | None, elapsed_s: float):
        super().__init__(message)
        self.reason = reason
        self.last_checkpoint = last_checkpoint
        self.elapsed_s = elapsed_s


@dataclass(frozen=True)
class TrainSettings:
    """Everything one training run needs besides the data: the same for both launchers.

    ``batch_size`` and ``learning_rate`` are per process (the learning rate is multiplied by the world size).
    ``default_dir`` is the checkpoint folder (by default one per run under the work directory); ``ckpt_restore``
    a checkpoint to continue from. ``work_dir`` is fixed when the settings are made, on the driver, so that the
    workers use the driver's work directory (shared storage on a real cluster). ``use_gpu``: one GPU per process;
    ``mixed_precision``: the Trainer's precision from :func:`helpers.devices.precision_for`, decided in each
    process by its own device (``"bf16-mixed"`` on the CPU and on Ampere or newer GPUs, ``"16-mixed"`` on older
    ones). Both must be True or False (:class:`CourseInputError` otherwise).
    """

    batch_size: int = 32
    image_size: int = 32
    learning_rate: float = 0.01
    max_epochs: int = 4
    early_stopping: dict[str, Any] | bool | None = None
    use_gpu: bool = False
    mixed_precision: bool = False
    mlflow_experiment: str | None = None
    tracking_uri: str | None = None
    ckpt_restore: str | None = None
    default_dir: str | None = None
    run_name: str | None = None
    seed: int = 0
    work_dir: str = field(default_factory=lambda: str(work_dir()))

    def __post_init__(self) -> None:
        """Refuse flags that are not True or False (``use_gpu="yes"``) on the driver, before any job starts."""
        check_flag("use_gpu", self.use_gpu)
        check_flag("mixed_precision", self.mixed_precision)

    def replace(self, **changes: Any) -> TrainSettings:
        """A copy with ``changes`` (``settings.replace(ckpt_restore=path)``)."""
        return dataclasses.replace(self, **changes)


def ddp_layout(num_processes: int, local_mode: bool) -> dict[str, int]:
    """The Trainer's ``devices`` and ``num_nodes`` for ``num_processes`` DDP processes under TorchDistributor.

    Local mode: one node (the driver) with ``num_processes`` devices. Distributed mode: every Spark task is a
    "node" of its own with one device (its GPU, or a CPU share).
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise CourseInputError(f"num_processes={num_processes!r}: pass a whole number of at least 1.")
    if local_mode:
        return {"devices": num_processes, "num_nodes": 1}
    return {"devices": 1, "num_nodes": num_processes}


def process_group_backend(use_gpu: bool) -> str:
    """The ``torch.distributed`` backend: NCCL between GPUs, Gloo between CPU processes."""
    return "nccl" if use_gpu else "gloo"


def task_slots(spark) -> int:
    """How many Spark tasks, so training processes, the session runs at once: its cores over ``spark.task.cpus``,
    and with GPU scheduling (``spark.task.resource.gpu.amount``) at most one task per GPU share of each executor."""
    conf = spark.sparkContext.getConf()
    slots = spark.sparkContext.defaultParallelism // max(1, int(conf.get("spark.task.cpus", "1")))
    task_gpus = float(conf.get("spark.task.resource.gpu.amount", "0"))
    if task_gpus > 0:
        executors = len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1
        per_executor = int(float(conf.get("spark.executor.resource.gpu.amount", "0")) // task_gpus)
        slots = min(slots, max(0, executors) * per_executor)
    return slots


def _session(spark=None):
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
    spark = _session(spark)
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


def _seed_and_threads(seed: int, threads: int | None) -> None:
    """Same initial weights on every rank (they are broadcast anyway) and this process's share of the cores."""
    import pytorch_lightning as pl
    import torch

    pl.seed_everything(seed, verbose=False)
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def train_process(
    launcher: str,
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings,
    num_processes: int = 1,
    local_mode: bool = False,
    threads: int | None = None,
    job_dir: str | None = None,
) -> TrainResult | None:
    """The body every process runs, for ``launcher`` ``"horovod"`` or ``"torch_distributor"``: this process's
    shard, the lesson 2 model, and ``train(...)`` with the launcher's strategy, accelerator and precision
    (``settings.use_gpu``, ``settings.mixed_precision``). Returns ``train``'s result on
    global rank 0 (and writes it to ``job_dir``), None on the other ranks."""
    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel
    from helpers.training import train

    if launcher not in LAUNCHERS:
        raise CourseInputError(f"launcher={launcher!r}: use one of {LAUNCHERS}.")
    os.environ[ENV_VAR] = settings.work_dir
    if job_dir:
        os.environ[JOB_DIR_ENV] = job_dir  # train() records its MLflow run there; the driver fails it if we die
    _seed_and_threads(settings.seed, threads)
    model = LitClassificationModel(class_count, learning_rate=settings.learning_rate, image_size=settings.image_size)
    if launcher == "horovod":
        import horovod.torch as hvd

        from helpers.horovod_strategy import HorovodStrategy

        hvd.init()
        rank, world_size = hvd.rank(), hvd.size()
        trainer_args: dict[str, Any] = {"strategy": HorovodStrategy()}  # it scales the learning rate itself
    else:
        from pytorch_lightning.strategies import DDPStrategy

        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        model.learning_rate = settings.learning_rate * world_size  # like Horovod: the global batch grew
        backend = process_group_backend(settings.use_gpu)
        trainer_args = {"strategy": DDPStrategy(process_group_backend=backend), **ddp_layout(num_processes, local_mode)}
    datamodule = PetastormDataModule(
        train_converter,
        val_converter,
        settings.batch_size,
        settings.image_size,
        device_id=rank,
        device_count=world_size,
    )
    # other ranks' names are not used: Lightning takes the checkpoint folder from rank 0, which alone logs
    run_name = settings.run_name or _run_name(launcher, world_size)
    result = train(
        model,
        datamodule,
        max_epochs=settings.max_epochs,
        accelerator="gpu" if settings.use_gpu else "cpu",
        precision=precision_for(settings.mixed_precision, settings.use_gpu),
        default_dir=settings.default_dir,
        ckpt_restore=settings.ckpt_restore,
        mlflow_experiment=settings.mlflow_experiment,
        tracking_uri=settings.tracking_uri,
        early_stopping=settings.early_stopping,
        run_name=run_name,
        extra_params={"launcher": launcher, "local_mode": local_mode},
        progress_bar=False,
        **trainer_args,
    )
    if rank != 0:
        return None
    if job_dir:
        _write_atomically(Path(job_dir) / _RESULT_FILE, cloudpickle.dumps(result))
    return result


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader never sees half a file (write aside, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _ddp_process(job_dir: str, **kwargs: Any) -> TrainResult | None:
    """What TorchDistributor runs in each process: ``train_process``, and on an error a report for the driver.

    ``torchrun``'s wrapper in pyspark exits 0 even when training failed, and the error is only in the process's
    output: the report (rank, time, traceback) lets the driver say which rank failed and why.
    """
    try:
        return train_process("torch_distributor", job_dir=job_dir, **kwargs)
    except BaseException as exc:
        rank = int(os.environ.get("RANK", "0"))
        report = {"rank": rank, "time": time.time(), "text": "".join(traceback.format_exception(exc))}
        _write_atomically(Path(job_dir) / f"rank-{rank}.error.json", json.dumps(report).encode())
        raise


# errors a rank raises because another one stopped: not the root cause
_COLLATERAL = re.compile(r"gloo|nccl|Connection (closed|reset)|ProcessGroup|DistNetworkError|Broken pipe", re.I)


def _rank_error(job_dir: Path) -> tuple[str | None, bool]:
    """The root cause among the ranks' error reports, ``rank N raised <last line>`` (the earliest that is not
    collateral, else the earliest), and whether it is collateral; ``(None, False)`` without reports."""
    reports = []
    for path in job_dir.glob("rank-*.error.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    if not reports:
        return None, False
    for report in reports:
        report["line"] = report["text"].strip().splitlines()[-1][:300]
        report["collateral"] = bool(_COLLATERAL.search(report["line"]))
    first = min(reports, key=lambda r: (r["collateral"], r["time"]))
    return f"rank {first['rank']} raised {first['line']}", first["collateral"]


def train_hvd(train_converter, val_converter, class_count: int, settings: TrainSettings) -> TrainResult | None:
    """Lesson 3's ``train_hvd`` as a helper: run it with ``HorovodRunner(np=N).run(train_hvd, ...)``."""
    return train_process("horovod", train_converter, val_converter, class_count, settings)


def _run_name(launcher: str, processes: int) -> str:
    """``<launcher>-<n>proc-<time>-<random>``: readable in MLflow and unique."""
    return f"{launcher}-{processes}proc-{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"


def _resolved(settings: TrainSettings, launcher: str, num_processes: int) -> TrainSettings:
    """Fix on the driver what every process must agree on: the run name and the checkpoint folder."""
    run_name = settings.run_name or _run_name(launcher, num_processes)
    default_dir = settings.default_dir
    if default_dir is None:
        default_dir = (
            str(Path(settings.ckpt_restore).parent)
            if settings.ckpt_restore
            else str(work_path("checkpoints", run_name, override=settings.work_dir))
        )
    return settings.replace(run_name=run_name, default_dir=default_dir)


def _threads_per_process(spark, num_processes: int, local_mode: bool) -> int:
    """CPU threads for each training process: its task's cores on a cluster, a share of this machine locally."""
    if local_mode:
        return max(1, (os.cpu_count() or 1) // num_processes)
    return max(1, int(spark.conf.get("spark.task.cpus", "1")))


def _last_checkpoint(folder: str | None) -> str | None:
    """``last.ckpt`` in ``folder`` if it exists."""
    if folder and (Path(folder) / "last.ckpt").is_file():
        return str(Path(folder) / "last.ckpt")
    return None


class _Watchdog(threading.Thread):
    """Cancels a distributed TorchDistributor job as soon as one of its tasks fails or an executor is lost.

    Spark would retry the barrier stage: training from epoch 0 again, or minutes of waiting for slots when a worker
    is gone. ``reason`` says why it cancelled (None if it did not).
    """

    def __init__(self, spark, group: str, executors_needed: int, poll_s: float = 0.5):
        super().__init__(name="torch-distributor-watchdog", daemon=True)
        self.sc = spark.sparkContext
        self.group = group
        self.executors_needed = executors_needed
        self.poll_s = poll_s
        self.done = threading.Event()
        self.reason: str | None = None

    def _executors(self) -> int:
        # getExecutorInfos() lists the driver too
        return len(self.sc._jsc.sc().statusTracker().getExecutorInfos()) - 1

    def run(self) -> None:
        tracker = self.sc.statusTracker()
        executors_at_start = self._executors()
        while not self.done.wait(self.poll_s):
            try:
                executors = self._executors()
                if executors < min(executors_at_start, self.executors_needed):
                    self.reason = (
                        f"Spark lost an executor during training ({executors} of {executors_at_start} "
                        "left): a worker or its executor died"
                    )
                failed = 0
                for job_id in tracker.getJobIdsForGroup(self.group):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in job.stageIds if job else []:
                        stage = tracker.getStageInfo(stage_id)
                        if stage and (stage.numFailedTasks > 0 or stage.currentAttemptId > 0):
                            failed += 1
                if failed and self.reason is None:
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


def train_with_distributor(
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings | None = None,
    *,
    num_processes: int = 2,
    local_mode: bool = False,
    distributor=None,
    fail_fast: bool = True,
    spark=None,
) -> TrainResult:
    """Train the lesson 2 model with Lightning DDP under TorchDistributor; return rank 0's ``TrainResult``.

    ``distributor``: a ``TorchDistributor`` to use (its ``num_processes``, ``local_mode`` and ``use_gpu`` win over
    the arguments here and ``settings.use_gpu``); by default :func:`make_distributor` builds one. With
    ``fail_fast`` (distributed mode), the job is stopped as soon as a task fails or an executor is lost.
    Raises :class:`DistributorError` when training fails, naming the last checkpoint to resume from.
    """
    settings = settings or TrainSettings()
    if distributor is None:
        distributor = make_distributor(num_processes, settings.use_gpu, local_mode, spark=spark)
    num_processes, local_mode = distributor.num_processes, distributor.local_mode
    settings = _resolved(settings.replace(use_gpu=distributor.use_gpu), "torch_distributor", num_processes)
    spark = _session(spark)
    configure_python_env()
    job_dir = Path(settings.work_dir) / "distributor_runs" / uuid.uuid4().hex
    job_dir.mkdir(parents=True, exist_ok=True)
    kwargs = dict(
        train_converter=train_converter,
        val_converter=val_converter,
        class_count=class_count,
        settings=settings,
        num_processes=num_processes,
        local_mode=local_mode,
        threads=_threads_per_process(spark, num_processes, local_mode),
        job_dir=str(job_dir),
    )
    watch = watched_job(spark, num_processes) if fail_fast and not local_mode else contextlib.nullcontext()
    started = time.monotonic()
    with watch as watchdog:
        try:
            return _run_and_collect(distributor, job_dir, kwargs)
        except Exception as exc:
            raise _distributor_error(
                exc, watchdog, job_dir, settings, num_processes, local_mode, time.monotonic() - started
            ) from exc
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)


def _run_and_collect(distributor, job_dir: Path, kwargs: dict[str, Any]) -> TrainResult:
    """Run ``_ddp_process`` under ``distributor``; rank 0's result (from its file when ``run`` lost it)."""
    returned = distributor.run(_ddp_process, **kwargs)
    result_file = job_dir / _RESULT_FILE
    if not isinstance(returned, TrainResult) and result_file.exists():
        returned = cloudpickle.loads(result_file.read_bytes())
    return returned


def _distributor_error(
    exc: BaseException,
    watchdog: _Watchdog | None,
    job_dir: Path,
    settings: TrainSettings,
    num_processes: int,
    local_mode: bool,
    elapsed: float,
) -> DistributorError:
    """The :class:`DistributorError` for a failed job: the root cause in one line and the checkpoint to resume."""
    fail_open_mlflow_runs(job_dir)
    rank_error, collateral = _rank_error(job_dir)
    # a rank's own error first; a lost executor (no Python error) before the errors it caused on other ranks
    if rank_error and not collateral:
        reason = rank_error
    else:
        reason = (watchdog and watchdog.reason) or rank_error or _summarise(exc)
    last = _last_checkpoint(settings.default_dir)
    resume = (
        f"rerun with ckpt_restore={last!r} to continue from its last checkpoint"
        if last
        else "no checkpoint was written yet: rerun from the start"
    )
    mode = "on the driver" if local_mode else "on Spark workers"
    message = (
        f"TorchDistributor training with {num_processes} processes {mode} failed after {elapsed:.0f} s: "
        f"{reason}. The job was stopped; {resume}."
    )
    return DistributorError(message, reason, last, elapsed)
