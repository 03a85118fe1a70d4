"""Lesson 2: training, first as a plain PyTorch loop, then as one ``train(...)`` function around Lightning.

``train`` is the function every later lesson reuses: lesson 3 passes a Horovod strategy, lesson 4 DDP under
TorchDistributor. It adds early stopping, checkpoints (and resuming from one) and MLflow tracking on global
rank 0 only. MLflow is imported only where it is called: the other ranks never import it (about a second of CPU
each).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.cloud_io import get_filesystem
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from helpers import CourseInputError
from helpers.jobs import record_mlflow_run
from helpers.network import pin_interface
from helpers.phases import RankClock
from helpers.tracking import registry_name, setup_mlflow
from helpers.tracking import run_name as new_run_name
from helpers.tracking import tracking_uri as course_tracking_uri
from helpers.validation import check_flag, whole_number
from helpers.workdir import work_path

Batch = dict[str, torch.Tensor]
Batches = Iterable[Batch] | Callable[[], Iterable[Batch]]

__all__ = [
    "CHECKPOINT_FOLDER_REUSED",
    "EARLY_STOPPING_DEFAULTS",
    "Batch",
    "Batches",
    "TrainResult",
    "train",
    "train_plain",
]

#: Lightning's warning when a fit writes into a folder that holds checkpoints: a resume does that on purpose.
CHECKPOINT_FOLDER_REUSED = "Checkpoint directory .* exists and is not empty"

EARLY_STOPPING_DEFAULTS: dict[str, Any] = {"min_delta": 0.01, "patience": 10, "stopping_threshold": None}


def train_plain(
    network: nn.Module,
    train_batches: Batches,
    val_batches: Batches,
    epochs: int,
    learning_rate: float,
    momentum: float = 0.9,
    device: str | torch.device = "cpu",
) -> dict[str, list[float]]:
    """Train ``network`` with SGD and cross-entropy, the plain PyTorch way; return the per-epoch history.

    Args:
        network: the model to train, moved to ``device``.
        train_batches: dict batches (``features``, ``label_index``) once per epoch: something iterable again and
            again (a ``DataLoader``, a list) or a function returning a fresh iterable
            (``datamodule.train_dataloader``).
        val_batches: the validation batches, in the same forms.
        epochs: passes over ``train_batches``.
        learning_rate: SGD's learning rate.
        momentum: SGD's momentum.
        device: where to train (``"cpu"``, ``"cuda"``, a ``torch.device``).

    Returns:
        ``{"train_loss": [...], "val_loss": [...], "val_acc": [...]}``, one value per epoch.

    Raises:
        CourseInputError: ``epochs`` is not a whole number of at least 1.
    """
    whole_number("epochs", epochs)
    network.to(device)
    optimizer = torch.optim.SGD(network.parameters(), lr=learning_rate, momentum=momentum)
    history: dict[str, list[float]] = {"train_loss": [], "val_loss": [], "val_acc": []}
    for _ in range(epochs):
        network.train()
        loss_sum, rows = 0.0, 0
        for batch in train_batches() if callable(train_batches) else train_batches:
            features, labels = batch["features"].to(device), batch["label_index"].to(device)
            loss = F.cross_entropy(network(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum, rows = loss_sum + loss.item() * len(labels), rows + len(labels)
        history["train_loss"].append(loss_sum / rows)

        network.eval()
        loss_sum, correct, rows = 0.0, 0, 0
        with torch.no_grad():
            for batch in val_batches() if callable(val_batches) else val_batches:
                features, labels = batch["features"].to(device), batch["label_index"].to(device)
                logits = network(features)
                loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
                correct += (logits.argmax(dim=1) == labels).sum().item()
                rows += len(labels)
        history["val_loss"].append(loss_sum / rows)
        history["val_acc"].append(correct / rows)
    return history


@dataclass
class TrainResult:
    """What one ``train`` call did.

    ``epochs_run`` counts all epochs including those before a resumed checkpoint; ``history`` holds only this
    call's epochs (``epoch``, ``train_loss``, ``val_loss``, ``val_acc``; averaged over devices).
    ``stopped_reason`` is ``"stopping_threshold"``, ``"patience"``, ``"non_finite_metric"`` (from the
    EarlyStopping callback) or ``"max_epochs"``. The MLflow fields are
    ``None`` on other ranks and without ``mlflow_experiment``.
    """

    epochs_run: int
    best_val_loss: float | None
    last_val_loss: float | None
    val_acc: float | None
    wall_time_s: float
    best_checkpoint: str | None
    last_checkpoint: str | None
    stopped_reason: str
    mlflow_run_id: str | None = None
    registered_model_name: str | None = None
    registered_model_version: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)


class _Connected(pl.Callback):
    """Reads ``clock`` when every rank is connected: Lightning calls ``setup`` after the strategy has set up the
    process group and passed a barrier of all ranks."""

    def __init__(self, clock: RankClock) -> None:
        self.clock = clock

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Every rank has reached this point."""
        self.clock.connected()


class _EpochHistory(pl.Callback):
    """Records the epoch metrics (after validation) into a list: cheap, and available without MLflow."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called after the epoch's validation pass: copy the epoch-level metrics."""
        metrics = trainer.callback_metrics
        row = {"epoch": trainer.current_epoch}
        for key, name in (("train_loss_epoch", "train_loss"), ("val_loss", "val_loss"), ("val_acc", "val_acc")):
            if key in metrics:
                row[name] = float(metrics[key])
        self.epochs.append(row)


class _EpochBar(pl.Callback):
    """One progress bar per fit, a step per epoch with its ``val_loss``, on global rank 0: Lightning's own bar
    writes a line per batch into a notebook's output. Early stopping may end the bar before ``max_epochs``."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Open the bar at the epoch the fit starts from (after a restored checkpoint's)."""
        if trainer.is_global_zero:
            self.bar = tqdm(total=trainer.max_epochs, initial=trainer.current_epoch, desc="fit", unit="epoch",
                            file=sys.stderr, dynamic_ncols=False, ncols=90)  # fmt: skip

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called after the epoch's validation pass: one step, with its val_loss."""
        if self.bar is not None:
            loss = trainer.callback_metrics.get("val_loss")
            if loss is not None:
                self.bar.set_postfix(val_loss=f"{float(loss):.4f}", refresh=False)
            self.bar.update(1)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close the bar where the fit ended."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


_STOP_REASONS = {
    EarlyStoppingReason.STOPPING_THRESHOLD: "stopping_threshold",
    EarlyStoppingReason.PATIENCE_EXHAUSTED: "patience",
    EarlyStoppingReason.NON_FINITE_METRIC: "non_finite_metric",
}


def _early_stopping_settings(early_stopping: dict[str, Any] | bool | None) -> dict[str, Any] | None:
    """The EarlyStopping keyword arguments: course defaults updated by ``early_stopping``; None when off."""
    if early_stopping is False:
        return None
    if early_stopping is None or early_stopping is True:
        return dict(EARLY_STOPPING_DEFAULTS)
    if not isinstance(early_stopping, dict):
        raise CourseInputError(
            f"early_stopping={early_stopping!r}: pass a dict such as {{'patience': 5}}, None for the defaults "
            "or False to switch early stopping off."
        )
    unknown = set(early_stopping) - set(EARLY_STOPPING_DEFAULTS)
    if unknown:
        raise CourseInputError(
            f"early_stopping has unknown keys {sorted(unknown)}: use only {sorted(EARLY_STOPPING_DEFAULTS)}."
        )
    return {**EARLY_STOPPING_DEFAULTS, **early_stopping}


def _check_checkpoint(ckpt_restore: str | Path, model: pl.LightningModule) -> None:
    """Raise ``CourseInputError`` unless ``ckpt_restore`` is a Lightning checkpoint whose weights fit ``model``."""
    path = str(ckpt_restore)
    fs = get_filesystem(path)
    if not fs.isfile(path):
        raise CourseInputError(
            f"ckpt_restore={path}: no such checkpoint file; pass an existing .ckpt (such as "
            "result.last_checkpoint) or ckpt_restore=None to start fresh."
        )
    try:
        with fs.open(path, "rb") as handle:
            checkpoint = torch.load(handle, map_location="cpu")
        saved = checkpoint["state_dict"]
    except Exception as error:  # any unreadable file: torch and pickle raise many types
        raise CourseInputError(
            f"ckpt_restore={path}: not a readable Lightning checkpoint ({type(error).__name__}); pass a .ckpt "
            "written by train(), or ckpt_restore=None to start fresh."
        ) from None
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    found = {name: tuple(tensor.shape) for name, tensor in saved.items()}
    if found != expected:
        saved_hparams = checkpoint.get("hyper_parameters", {})
        differences = [
            f"{key}={saved_hparams[key]!r} in the checkpoint, {model.hparams[key]!r} in the model"
            for key in ("class_count", "backbone")
            if key in saved_hparams and key in model.hparams and saved_hparams[key] != model.hparams[key]
        ]
        detail = "; ".join(differences) or f"{len(set(found.items()) ^ set(expected.items()))} weights differ"
        raise CourseInputError(
            f"ckpt_restore={path} does not fit this model ({detail}): build the model with the checkpoint's "
            "settings, or pass ckpt_restore=None to start fresh."
        )


def _registered_name(experiment: str) -> str:
    """A model registry name derived from an experiment name (its last path part, e.g. ``/Users/me/x`` -> x)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", experiment.rstrip("/").rsplit("/", 1)[-1]).strip("-") or "classifier"


def _log_and_register_model(model: pl.LightningModule, name: str) -> str:
    """Log the trained network (torch.export "pt2" format, CPU) to the active run and register it; return
    the new version. The example input fixes the signature: float32 N x 3 x image_size x image_size."""
    import mlflow
    from mlflow.models import infer_signature

    network = copy.deepcopy(getattr(model, "network", model)).cpu().eval()
    size = int(model.hparams.get("image_size", 32))
    example = torch.zeros(2, 3, size, size)
    with torch.no_grad():
        signature = infer_signature(example.numpy(), network(example).numpy())
    info = mlflow.pytorch.log_model(
        network,
        name="model",
        input_example=example.numpy(),
        signature=signature,
        serialization_format="pt2",
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
    )
    with _without_registry_news():
        return str(mlflow.register_model(info.model_uri, name).version)


# what MLflow's registry prints on every registration (the run records the version; a notebook needs no line for it)
_REGISTRY_NEWS = ("Successfully registered model ", "Registered model ", "Created version ")


@contextlib.contextmanager
def _without_registry_news() -> Iterator[None]:
    """Hold back the registry's announcements (:data:`_REGISTRY_NEWS`) from standard error; pass on anything else
    written there meanwhile, such as a warning, also when the block raises."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        for line in held.getvalue().splitlines(keepends=True):
            if not line.startswith(_REGISTRY_NEWS):
                sys.stderr.write(line)


@dataclass
class _Callbacks:
    """The callbacks of one ``train`` call: checkpoints, the epoch history, early stopping (None when off), the
    progress bar (None when off) and the clock of the fit's phases (:mod:`helpers.phases`)."""

    checkpoint: ModelCheckpoint
    history: _EpochHistory
    stopper: EarlyStopping | None
    bar: _EpochBar | None
    connected: _Connected

    @classmethod
    def create(
        cls, default_dir: str | Path, stopping: dict[str, Any] | None, bar: bool, clock: RankClock
    ) -> _Callbacks:
        """The best checkpoint by ``val_loss`` and ``last.ckpt`` in ``default_dir``; EarlyStopping on
        ``val_loss`` with ``stopping`` unless it is None; one progress bar per fit with ``bar``; ``clock`` read
        when every rank is connected."""
        checkpoint = ModelCheckpoint(
            dirpath=str(default_dir),
            filename="best-epoch={epoch}-val_loss={val_loss:.4f}",
            auto_insert_metric_name=False,
            monitor="val_loss",
            mode="min",
            save_last=True,
        )
        stopper = None if stopping is None else EarlyStopping(monitor="val_loss", mode="min", **stopping)
        return cls(checkpoint, _EpochHistory(), stopper, _EpochBar() if bar else None, _Connected(clock))

    def as_list(self) -> list[pl.Callback]:
        """The callbacks for the Trainer."""
        return [c for c in (self.checkpoint, self.history, self.stopper, self.bar, self.connected) if c is not None]

    def stopped_reason(self, trainer: pl.Trainer) -> str:
        """Why the fit ended: the early-stopping rule that fired, else ``"max_epochs"``."""
        # should_stop is reset by every fit, while the callback's reason may come from a resumed checkpoint
        if self.stopper is None or not trainer.should_stop:
            return "max_epochs"
        return _STOP_REASONS.get(self.stopper.stopping_reason, "max_epochs")


@dataclass
class _Recorded:
    """What MLflow recorded of one ``train`` call: nothing on other ranks and without an experiment."""

    run_id: str | None = None
    model_name: str | None = None
    model_version: str | None = None


def _fit(
    trainer: pl.Trainer, model: pl.LightningModule, datamodule: pl.LightningDataModule, ckpt_path: str | None
) -> float:
    """``trainer.fit`` (resuming from ``ckpt_path`` if given); return its wall time in seconds."""
    started = time.perf_counter()
    with warnings.catch_warnings():
        if ckpt_path is not None:  # resuming writes into the checkpoint's own folder on purpose
            warnings.filterwarnings("ignore", message=CHECKPOINT_FOLDER_REUSED)
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return time.perf_counter() - started


def _fit_untracked(fit: Callable[[], float], trainer: pl.Trainer, experiment: str | None) -> float:
    """Fit without recording; return the wall time."""
    if experiment is None and trainer.global_rank == 0:
        # autolog left on by an earlier tracked train() in this process would open a run of its own
        import mlflow

        mlflow.pytorch.autolog(disable=True)
    return fit()


def _run_params(
    model: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    trainer: pl.Trainer,
    stopping: dict[str, Any] | None,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The MLflow parameters of a run: the model's learning rate and hyperparameters, the batch size, the world
    size, the early-stopping settings and ``settings`` (the ``train`` arguments and ``extra_params``)."""
    params: dict[str, Any] = {
        "learning_rate": model.hparams.get("learning_rate", getattr(model, "learning_rate", None)),
        "world_size": trainer.world_size,
        "early_stopping": stopping is not None,
    }
    if getattr(datamodule, "batch_size", None) is not None:
        params["batch_size"] = datamodule.batch_size
    for key in ("class_count", "backbone", "pretrained", "freeze_backbone", "image_size"):
        if key in model.hparams:
            params[key] = model.hparams[key]
    if stopping is not None:
        params.update({f"early_stopping_{key}": value for key, value in stopping.items()})
    return {**params, **settings}


def _fit_tracked(
    fit: Callable[[], float],
    trainer: pl.Trainer,
    experiment: str,
    uri: str | None,
    run_name: str,
    params: dict[str, Any],
    model_name: str,
    clock: RankClock,
) -> tuple[float, _Recorded]:
    """Fit inside one MLflow run of ``experiment`` (nested in an active run, if any) with autolog on: log
    ``params``, ``wall_time_s``, the ``clock``'s readings, the effective learning rate and the trained model,
    registered as ``registry_name(model_name)``. Return the wall time and what was recorded."""
    # checked before the fit, and before MLflow opens the registry: a name Unity Catalog's registry refuses would
    # otherwise fail only when the trained model is registered
    import mlflow

    mlflow.set_tracking_uri(course_tracking_uri(uri))
    model_name = registry_name(model_name, mlflow.get_registry_uri())
    experiment_id = setup_mlflow(experiment, uri)
    mlflow.pytorch.autolog(log_models=False, checkpoint=False, silent=True)
    nested = mlflow.active_run() is not None
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, nested=nested) as run:
        # in a HorovodRunner job, the driver ends this run FAILED if this process is stopped before it can
        record_mlflow_run(run.info.run_id, mlflow.get_tracking_uri())
        mlflow.log_params(params)
        wall_time_s = fit()
        mlflow.log_metrics({"wall_time_s": wall_time_s, **clock.metrics()})
        # the lr the optimizer really used: a distributed strategy may have scaled it by the world size
        mlflow.log_param("effective_learning_rate", trainer.optimizers[0].param_groups[0]["lr"])
        version = _log_and_register_model(trainer.lightning_module, model_name)
    return wall_time_s, _Recorded(run.info.run_id, model_name, version)


def _result(trainer: pl.Trainer, callbacks: _Callbacks, wall_time_s: float, recorded: _Recorded) -> TrainResult:
    """The :class:`TrainResult` of a finished fit."""
    metrics = trainer.callback_metrics
    best = callbacks.checkpoint.best_model_score
    return TrainResult(
        epochs_run=trainer.current_epoch,
        best_val_loss=float(best) if best is not None else None,
        last_val_loss=float(metrics["val_loss"]) if "val_loss" in metrics else None,
        val_acc=float(metrics["val_acc"]) if "val_acc" in metrics else None,
        wall_time_s=wall_time_s,
        best_checkpoint=callbacks.checkpoint.best_model_path or None,
        last_checkpoint=callbacks.checkpoint.last_model_path or None,
        stopped_reason=callbacks.stopped_reason(trainer),
        mlflow_run_id=recorded.run_id,
        registered_model_name=recorded.model_name,
        registered_model_version=recorded.model_version,
        history=callbacks.history.epochs,
    )


def train(
    model: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    *,
    max_epochs: int = 20,
    accelerator: str = "cpu",
    devices: int | str | list[int] = 1,
    num_nodes: int = 1,
    strategy: str | Any = "auto",
    precision: str = "32-true",
    default_dir: str | Path | None = None,
    ckpt_restore: str | Path | None = None,
    mlflow_experiment: str | None = None,
    tracking_uri: str | None = None,
    early_stopping: dict[str, Any] | bool | None = None,
    run_name: str | None = None,
    registered_model_name: str | None = None,
    extra_params: dict[str, Any] | None = None,
    progress_bar: bool = True,
    logging_level: int = logging.WARNING,
) -> TrainResult:
    """Fit ``model`` on ``datamodule`` with Lightning: early stopping, checkpoints, MLflow on global rank 0.

    Every epoch ends with a full validation pass. With ``mlflow_experiment``, global rank 0 turns on
    ``mlflow.pytorch.autolog`` and records exactly one run: the parameters (learning rate and the effective one
    after any scaling, batch size, devices, world size, early stopping, max_epochs, ``extra_params``), the epoch
    metrics (step = epoch), ``wall_time_s`` and the trained model, registered. If training raises, the run ends
    FAILED and the error propagates; in a ``HorovodRunner`` job the driver also ends it FAILED when this process
    is terminated or killed first. Other ranks never call MLflow.

    Args:
        model: the LightningModule to fit (e.g. ``helpers.model.LitClassificationModel``).
        datamodule: its data (e.g. ``helpers.datamodule.PetastormDataModule``).
        max_epochs: epochs in total, counting those before ``ckpt_restore``.
        accelerator: passed to the Trainer unchanged, like ``devices``, ``num_nodes`` and ``strategy`` (a
            strategy object such as the course's Horovod strategy, ``"ddp"``, ...).
        devices: see ``accelerator``.
        num_nodes: see ``accelerator``.
        strategy: see ``accelerator``.
        precision: the Trainer's precision: ``"16-mixed"`` or ``"bf16-mixed"`` for mixed precision on a GPU (see
            ``helpers.devices.precision_for``).
        default_dir: where checkpoints go (the best by ``val_loss`` and ``last.ckpt``); default: the folder of
            ``ckpt_restore`` when resuming, else ``work_path("checkpoints", run_name)``.
        ckpt_restore: a ``.ckpt`` to continue from (e.g. ``result.last_checkpoint``); training resumes at the
            next epoch.
        mlflow_experiment: the experiment to record the run in; ``None``: no MLflow at all.
        tracking_uri: the MLflow store; default: the local store under the work directory.
        early_stopping: ``None`` (default) or ``True`` uses ``EARLY_STOPPING_DEFAULTS`` (monitor ``val_loss``,
            min_delta 0.01, patience 10, no stopping_threshold); a dict overrides some of them
            (``{"stopping_threshold": 0.55}``); ``False`` switches early stopping off.
        run_name: the MLflow run's name and the default checkpoint folder's; default:
            ``helpers.tracking.run_name(<backbone>, "devices<n>")``.
        registered_model_name: the registry name of the trained model; default: derived from the experiment.
            A name without a dot goes into the Unity Catalog schema ``COURSE_MODEL_SCHEMA`` names, if set
            (``helpers.tracking.registry_name``); ``result.registered_model_name`` is the name registered.
        extra_params: more MLflow parameters; their keys must not clash with autolog's (``lr``, ``epochs``, ...).
        progress_bar: show one progress bar for the fit, a step per epoch (not Lightning's, a line per batch).
        logging_level: the level of Lightning's loggers (``logging.INFO`` shows its device and model summaries).

    Returns:
        A :class:`TrainResult`; its MLflow fields are ``None`` on other ranks and without ``mlflow_experiment``.

    Raises:
        CourseInputError: ``max_epochs`` is not a whole number of at least 1, ``early_stopping`` is not one of
            the forms above, or ``ckpt_restore`` is missing, unreadable or does not fit ``model`` (all checked
            before anything starts); or the model name does not suit the registry (Unity Catalog's takes
            ``catalog.schema.model``), checked on rank 0 before the fit.
    """
    clock = RankClock()  # the training function is called now (helpers.phases)
    whole_number("max_epochs", max_epochs)
    check_flag("progress_bar", progress_bar)
    stopping = _early_stopping_settings(early_stopping)
    if ckpt_restore is not None:
        _check_checkpoint(ckpt_restore, model)
    for name in ("pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging_level)
    run_name = run_name or new_run_name(model.hparams.get("backbone", type(model).__name__), f"devices{devices}")
    if default_dir is None:
        default_dir = Path(ckpt_restore).parent if ckpt_restore is not None else work_path("checkpoints", run_name)
    callbacks = _Callbacks.create(default_dir, stopping, progress_bar, clock)
    pin_interface()  # under torchrun (MASTER_ADDR set): Gloo and NCCL on the interface that reaches the other hosts
    placement = {"accelerator": accelerator, "devices": devices, "num_nodes": num_nodes, "precision": precision}
    trainer = pl.Trainer(
        **placement,
        strategy=strategy,
        max_epochs=max_epochs,
        callbacks=callbacks.as_list(),
        default_root_dir=str(default_dir),
        logger=False,
        enable_progress_bar=False,
    )
    ckpt_path = str(ckpt_restore) if ckpt_restore is not None else None

    def fit() -> float:
        wall_time_s = _fit(trainer, model, datamodule, ckpt_path)
        clock.fit_done()
        return wall_time_s

    if mlflow_experiment is None or trainer.global_rank != 0:
        return _result(trainer, callbacks, _fit_untracked(fit, trainer, mlflow_experiment), _Recorded())
    strategy_name = strategy if isinstance(strategy, str) else type(strategy).__name__
    settings = {**placement, "strategy": strategy_name, "max_epochs": max_epochs, "ckpt_restore": ckpt_path}
    params = _run_params(model, datamodule, trainer, stopping, {**settings, **(extra_params or {})})
    model_name = registered_model_name or _registered_name(mlflow_experiment)
    wall_time_s, recorded = _fit_tracked(
        fit, trainer, mlflow_experiment, tracking_uri, run_name, params, model_name, clock
    )
    return _result(trainer, callbacks, wall_time_s, recorded)
