"""The training worker of lessons 4 and 5, and the calls that start it with either launcher (or with Ray Train).

:func:`train_process` is the one body every training process runs, under Horovod (``HorovodStrategy``), under
TorchDistributor (Lightning's DDP) or in a Ray Train worker (Lightning's DDP in the process group Ray set up,
:func:`train_with_ray`): its shard of the data, the lesson 2 model and ``helpers.training.train``.
:class:`TrainSettings` holds everything a run needs besides the data, the same for both launchers; the learning
rate is per process and both launchers multiply it by the world size. :func:`launch_training` starts a run with
``launcher="horovod"`` (``HorovodRunner``) or ``"torch_distributor"`` (:func:`train_with_distributor`), on this
machine or on the Spark workers.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from helpers import CourseInputError
from helpers.datamodule import ONE_PASS, datamodule_for
from helpers.devices import horovod_installed, precision_for
from helpers.distributor import ddp_layout, make_distributor, process_group_backend, run_with_distributor
from helpers.jobs import JobError, stall_timeout_s
from helpers.ray_launcher import run_with_ray
from helpers.tracking import run_name as new_run_name
from helpers.training import TrainResult
from helpers.validation import check_flag, one_of, whole_number
from helpers.workdir import ENV_VAR, work_dir, work_path

__all__ = [
    "LAUNCHERS",
    "TrainSettings",
    "choose_launcher",
    "launch_training",
    "train_hvd",
    "train_process",
    "train_with_distributor",
    "train_with_ray",
]

LAUNCHERS = ("horovod", "torch_distributor")
AUTO = "auto"  # Horovod where it is installed, TorchDistributor elsewhere (Databricks Runtime 16+ ML)
RAY = "ray"  # Ray Train on a Ray cluster on Spark (helpers.ray_on_spark): not one of the lessons' LAUNCHERS


def choose_launcher(launcher: str) -> str:
    """The launcher a lesson's ``LAUNCHER`` parameter asks for, with ``"auto"`` resolved for this machine.

    Args:
        launcher: ``"auto"``, ``"horovod"`` or ``"torch_distributor"``.

    Returns:
        ``"horovod"`` or ``"torch_distributor"``; ``"auto"`` gives Horovod where it is installed.

    Raises:
        CourseInputError: another value, or ``"horovod"`` where Horovod is not installed.
    """
    one_of("LAUNCHER", launcher, (AUTO, *LAUNCHERS))
    installed = horovod_installed()
    if launcher == AUTO:
        return "horovod" if installed else "torch_distributor"
    if launcher == "horovod" and not installed:
        raise CourseInputError(
            "LAUNCHER='horovod', but Horovod is not installed here (Databricks Runtime 16.0 ML and later ship "
            "none): use LAUNCHER='torch_distributor' or 'auto'."
        )
    return launcher


@dataclass(frozen=True)
class TrainSettings:
    """Everything one training run needs besides the data: the same for both launchers.

    Attributes:
        batch_size: rows per step and process (``epoch_mode="fixed_steps"`` multiplies it by the world size).
        image_size: the side of the square images, in pixels.
        learning_rate: per process; the launchers multiply it by the world size.
        max_epochs: the most epochs the run trains.
        early_stopping: ``helpers.training.train``'s early-stopping settings (None: the defaults, False: off).
        backbone, pretrained: the network (``helpers.model.make_network``).
        epoch_mode: ``"one_pass"`` (an epoch is one pass over the data) or ``"fixed_steps"`` (lesson 5's pitfall).
        use_gpu: one GPU per process.
        mixed_precision: the Trainer's precision from :func:`helpers.devices.precision_for`, decided in each
            process by its own device.
        mlflow_experiment, tracking_uri: where rank 0 records the run (None: no MLflow).
        ckpt_restore: a checkpoint to continue from.
        default_dir: the checkpoint folder (default: one per run under the work directory).
        run_name: the MLflow run's name (default: made on the driver from the launcher and process count).
        seed: the seed of the initial weights and the data order.
        extra_params: more MLflow parameters of the run.
        work_dir: fixed when the settings are made, on the driver, so the workers use the driver's work
            directory (shared storage on a real cluster).

    Raises:
        CourseInputError: a flag that is not True or False, an unknown epoch mode, a batch size or epoch count
            that is not a whole number of at least 1.
    """

    batch_size: int = 32
    image_size: int = 32
    learning_rate: float = 0.01
    max_epochs: int = 4
    early_stopping: dict[str, Any] | bool | None = None
    backbone: str = "small_cnn"
    pretrained: bool = False
    epoch_mode: str = ONE_PASS
    use_gpu: bool = False
    mixed_precision: bool = False
    mlflow_experiment: str | None = None
    tracking_uri: str | None = None
    ckpt_restore: str | None = None
    default_dir: str | None = None
    run_name: str | None = None
    seed: int = 0
    extra_params: dict[str, Any] = field(default_factory=dict)
    work_dir: str = field(default_factory=lambda: str(work_dir()))

    def __post_init__(self) -> None:
        """Refuse bad settings on the driver, before any job starts."""
        check_flag("use_gpu", self.use_gpu)
        check_flag("mixed_precision", self.mixed_precision)
        check_flag("pretrained", self.pretrained)
        whole_number("batch_size", self.batch_size)
        whole_number("max_epochs", self.max_epochs)
        datamodule_for(self.epoch_mode)

    def replace(self, **changes: Any) -> TrainSettings:
        """A copy with ``changes`` (``settings.replace(ckpt_restore=path)``)."""
        return dataclasses.replace(self, **changes)

    def resolved(self, launcher: str, num_processes: int) -> TrainSettings:
        """Fix on the driver what every process must agree on: the run name and the checkpoint folder."""
        run_name = self.run_name or new_run_name(launcher, f"{num_processes}proc")
        default_dir = self.default_dir
        if default_dir is None:
            default_dir = (
                str(Path(self.ckpt_restore).parent)
                if self.ckpt_restore
                else str(work_path("checkpoints", run_name, override=self.work_dir))
            )
        return self.replace(run_name=run_name, default_dir=default_dir)


def _rank_and_strategy(launcher: str, model, settings: TrainSettings, num_processes: int, local_mode: bool):
    """This process's rank, the world size and the Trainer arguments of ``launcher``'s strategy."""
    if launcher == "horovod":
        import horovod.torch as hvd

        from helpers.horovod_strategy import HorovodStrategy

        hvd.init()
        return hvd.rank(), hvd.size(), {"strategy": HorovodStrategy()}  # it scales the learning rate itself
    from pytorch_lightning.strategies import DDPStrategy

    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    model.learning_rate = settings.learning_rate * world_size  # like Horovod: the global batch grew
    if launcher == RAY:  # Ray Train made the process group; its environment gives Lightning the ranks
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment

        strategy = RayDDPStrategy(cluster_environment=RayLightningEnvironment())
        return rank, world_size, {"strategy": strategy, **ddp_layout(world_size, local_mode=False)}
    # a collective that waits longer than the stall bound raises in the waiting rank (a stall, not a hang)
    timeout = timedelta(seconds=stall_timeout_s())
    strategy = DDPStrategy(process_group_backend=process_group_backend(settings.use_gpu), timeout=timeout)
    return rank, world_size, {"strategy": strategy, **ddp_layout(num_processes, local_mode)}


def train_process(
    launcher: str,
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings,
    num_processes: int = 1,
    local_mode: bool = False,
) -> TrainResult | None:
    """The body every training process runs: this process's shard, the lesson 2 model, ``train`` with the
    launcher's strategy, accelerator and precision.

    Args:
        launcher: ``"horovod"`` (call it inside a ``HorovodRunner`` job), ``"torch_distributor"`` or ``"ray"``
            (in a Ray Train worker, see :func:`train_with_ray`).
        train_converter, val_converter: the Petastorm converters of lesson 1.
        class_count: the number of classes.
        settings: the run's settings (made on the driver).
        num_processes, local_mode: the TorchDistributor job's layout (unused with Horovod).

    Returns:
        ``train``'s result on global rank 0, None on the other ranks.

    Raises:
        CourseInputError: an unknown launcher.
    """
    import pytorch_lightning as pl

    from helpers.model import LitClassificationModel
    from helpers.training import train

    one_of("launcher", launcher, (*LAUNCHERS, RAY))
    os.environ[ENV_VAR] = settings.work_dir
    pl.seed_everything(settings.seed, verbose=False)
    model = LitClassificationModel(
        class_count,
        learning_rate=settings.learning_rate,
        backbone=settings.backbone,
        pretrained=settings.pretrained,
        image_size=settings.image_size,
    )
    rank, world_size, trainer_args = _rank_and_strategy(launcher, model, settings, num_processes, local_mode)
    datamodule = datamodule_for(settings.epoch_mode)(
        train_converter,
        val_converter,
        settings.batch_size,
        settings.image_size,
        device_id=rank,
        device_count=world_size,
    )
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
        run_name=settings.run_name or new_run_name(launcher, f"{world_size}proc"),
        extra_params={"launcher": launcher, "local_mode": local_mode, **settings.extra_params},
        progress_bar=False,
        **trainer_args,
    )
    return result if rank == 0 else None


def train_hvd(train_converter, val_converter, class_count: int, settings: TrainSettings) -> TrainResult | None:
    """Lesson 3's ``train_hvd`` as a helper: run it with ``HorovodRunner(np=N).run(train_hvd, ...)``.

    Returns:
        ``train``'s result on rank 0, None on the other ranks.
    """
    return train_process("horovod", train_converter, val_converter, class_count, settings)


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
    """Train the lesson 2 model with Lightning DDP under TorchDistributor.

    Args:
        train_converter, val_converter, class_count: the data, as for :func:`train_process`.
        settings: the run's settings (default: ``TrainSettings()``).
        num_processes, local_mode: the job's layout, used when ``distributor`` is None.
        distributor: a ``TorchDistributor`` to use (its ``num_processes``, ``local_mode`` and ``use_gpu`` win
            over the arguments here and ``settings.use_gpu``); by default :func:`make_distributor` builds one.
        fail_fast: in distributed mode, stop the job as soon as a task fails or an executor is lost.
        spark: the SparkSession (default: the active one).

    Returns:
        Rank 0's ``TrainResult``.

    Raises:
        DistributorError: training failed; it names the last checkpoint to resume from.
        CourseInputError: the session cannot run the job (see :func:`make_distributor`).
    """
    settings = settings or TrainSettings()
    if distributor is None:
        distributor = make_distributor(num_processes, settings.use_gpu, local_mode, spark=spark)
    num_processes, local_mode = distributor.num_processes, distributor.local_mode
    settings = settings.replace(use_gpu=distributor.use_gpu).resolved("torch_distributor", num_processes)
    return run_with_distributor(
        distributor,
        train_process,
        checkpoint_dir=settings.default_dir,
        fail_fast=fail_fast,
        spark=spark,
        launcher="torch_distributor",
        train_converter=train_converter,
        val_converter=val_converter,
        class_count=class_count,
        settings=settings,
        num_processes=num_processes,
        local_mode=local_mode,
    )


def train_with_ray(
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings | None = None,
    *,
    num_workers: int = 2,
) -> TrainResult:
    """Train the lesson 2 model with Lightning DDP in ``num_workers`` Ray Train workers, on the Ray cluster this
    process is connected to (``with ray_cluster(spark):``, :mod:`helpers.ray_on_spark`).

    Args:
        train_converter, val_converter, class_count: the data, as for :func:`train_process`.
        settings: the run's settings (default: ``TrainSettings()``); MLflow records ``launcher="ray"``.
        num_workers: how many training processes (one Ray Train worker each).

    Returns:
        Rank 0's ``TrainResult``.

    Raises:
        CourseInputError: no Ray cluster, or too few CPUs (GPUs) in it for ``num_workers``.
        RayJobError: training failed; it names the rank that failed first and its error.
    """
    whole_number("num_workers", num_workers)
    settings = (settings or TrainSettings()).resolved(RAY, num_workers)
    return run_with_ray(
        train_process,
        num_workers,
        use_gpu=settings.use_gpu,
        launcher=RAY,
        train_converter=train_converter,
        val_converter=val_converter,
        class_count=class_count,
        settings=settings,
        num_processes=num_workers,
    )


def launch_training(
    launcher: str,
    num_processes: int,
    train_converter,
    val_converter,
    class_count: int,
    settings: TrainSettings,
    *,
    on_spark: bool = False,
) -> TrainResult:
    """Train on ``num_processes`` processes with either launcher; return rank 0's result.

    Args:
        launcher: ``"horovod"`` (``HorovodRunner``) or ``"torch_distributor"`` (Lightning DDP under
            ``TorchDistributor``).
        num_processes: how many training processes.
        train_converter, val_converter, class_count: the data, as for :func:`train_process`.
        settings: the run's settings.
        on_spark: run the processes as tasks on the Spark workers instead of on this machine.

    Returns:
        Rank 0's ``TrainResult``.

    Raises:
        CourseInputError: an unknown launcher, or a process count that is not a whole number of at least 1.
        JobError: training failed (``HorovodWorkerError`` or ``DistributorError``).
    """
    from helpers.horovod_runner import HorovodRunner

    one_of("launcher", launcher, LAUNCHERS)
    whole_number("num_processes", num_processes)
    check_flag("on_spark", on_spark)
    if launcher == "torch_distributor":
        return train_with_distributor(
            train_converter, val_converter, class_count, settings, num_processes=num_processes, local_mode=not on_spark
        )
    settings = settings.resolved(launcher, num_processes)
    runner = HorovodRunner(np=num_processes if on_spark else -num_processes, use_gpu=settings.use_gpu)
    try:
        return runner.run(
            train_process,
            launcher=launcher,
            train_converter=train_converter,
            val_converter=val_converter,
            class_count=class_count,
            settings=settings,
        )
    except JobError as error:
        error.add_resume_hint(settings.default_dir)
        raise
