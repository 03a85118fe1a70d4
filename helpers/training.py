"""Lesson 2: training, first as a plain PyTorch loop, then as one ``train(...)`` function around Lightning.

``train`` is the function every later lesson reuses: lesson 3 passes a Horovod strategy, lesson 4 DDP under
TorchDistributor. It adds early stopping, checkpoints (and resuming from one) and MLflow tracking on global
rank 0 only.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import mlflow
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.cloud_io import get_filesystem
from mlflow.models import infer_signature
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason
from torch import nn
from torch.nn import functional as F

from helpers import CourseInputError
from helpers.jobs import record_mlflow_run
from helpers.tracking import setup_mlflow
from helpers.workdir import work_path

Batch = dict[str, torch.Tensor]
Batches = Iterable[Batch] | Callable[[], Iterable[Batch]]

# Lightning 2.6 warns about torch's pytree API in every fit; it is Lightning's to fix and only clutters notebooks.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")

EARLY_STOPPING_DEFAULTS: dict[str, Any] = {"min_delta": 0.01, "patience": 10, "stopping_threshold": None}


def steps_per_epoch(rows: int, batch_size: int, world_size: int = 1) -> int:
    """Optimizer steps per epoch when ``world_size`` devices each take ``batch_size`` rows per step.

    An epoch is one pass over the ``rows`` training rows whatever the device count:
    ``ceil(rows / (batch_size * world_size))``, at least 1. (The original notebooks kept the steps fixed while
    adding devices, so one "epoch" on n devices was about n passes of the data.)
    """
    for name, value in (("rows", rows), ("batch_size", batch_size), ("world_size", world_size)):
        if not isinstance(value, int) or value <= 0:
            raise CourseInputError(f"{name}={value!r}: pass a positive integer.")
    return max(1, math.ceil(rows / (batch_size * world_size)))


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

    ``train_batches`` and ``val_batches`` give dict batches (``features``, ``label_index``) once per epoch:
    either something iterable again and again (a ``DataLoader``, a list) or a function returning a fresh
    iterable (``datamodule.train_dataloader``). Returns ``{"train_loss": [...], "val_loss": [...],
    "val_acc": [...]}``, one value per epoch.
    """
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


def _default_run_name(model: pl.LightningModule, devices: Any) -> str:
    """``<backbone>-devices<n>-<time>-<random>``: readable and unique. Ranks may differ here; Lightning takes
    the checkpoint folder from rank 0 and only rank 0 names an MLflow run."""
    backbone = model.hparams.get("backbone", type(model).__name__)
    return f"{backbone}-devices{devices}-{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"


def _registered_name(experiment: str) -> str:
    """A model registry name derived from an experiment name (its last path part, e.g. ``/Users/me/x`` -> x)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", experiment.rstrip("/").rsplit("/", 1)[-1]).strip("-") or "classifier"


def _log_and_register_model(model: pl.LightningModule, name: str) -> str:
    """Log the trained network (torch.export "pt2" format, CPU) to the active run and register it; return
    the new version. The example input fixes the signature: float32 N x 3 x image_size x image_size."""
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
        registered_model_name=name,
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
    )
    return str(info.registered_model_version)


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

    - ``accelerator``, ``devices``, ``num_nodes``, ``strategy`` and ``precision`` go to the Trainer unchanged (a
      strategy object such as the course's Horovod strategy, ``"ddp"``, ...; ``"16-mixed"`` or ``"bf16-mixed"``
      for mixed precision on a GPU, see ``helpers.devices.precision_for``). Every epoch ends with a full
      validation pass.
    - ``early_stopping``: ``None`` (default) or ``True`` uses ``EARLY_STOPPING_DEFAULTS`` (monitor
      ``val_loss``, min_delta 0.01, patience 10, no stopping_threshold); a dict overrides some of them
      (``{"stopping_threshold": 0.55}``); ``False`` switches early stopping off.
    - Checkpoints (the best by ``val_loss`` and ``last.ckpt``) go to ``default_dir``: by default the folder of
      ``ckpt_restore`` when resuming, else ``work_path("checkpoints", run_name)``.
    - ``ckpt_restore``: a ``.ckpt`` to continue from (e.g. ``result.last_checkpoint``); training resumes at the
      next epoch and runs until ``max_epochs`` epochs in total. It is checked before anything starts:
      ``CourseInputError`` if it is missing or does not fit ``model``.
    - ``mlflow_experiment``: when given, global rank 0 sets up MLflow (``tracking_uri``, default: the local
      store under the work directory), turns on ``mlflow.pytorch.autolog`` and records exactly one run: the
      parameters (learning rate and the effective one after any scaling, batch size, devices, world size, early
      stopping, max_epochs, ``extra_params``, whose keys must not clash with autolog's ``lr``, ``epochs``, ...),
      the epoch metrics (step = epoch) and the trained model, registered as ``registered_model_name``
      (default: derived from the experiment name). If training raises, the run ends FAILED and the error
      propagates; in a ``HorovodRunner`` job the driver also ends it FAILED when this process is terminated or
      killed first. ``None``: no MLflow at all. Other ranks never call MLflow.
    - ``logging_level`` applies to Lightning's loggers (``logging.INFO`` shows its device and model summaries).
    """
    if not isinstance(max_epochs, int) or max_epochs < 1:
        raise CourseInputError(f"max_epochs={max_epochs!r}: pass a positive integer.")
    stopping = _early_stopping_settings(early_stopping)
    if ckpt_restore is not None:
        _check_checkpoint(ckpt_restore, model)
    for name in ("pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging_level)

    run_name = run_name or _default_run_name(model, devices)
    if default_dir is None:
        default_dir = Path(ckpt_restore).parent if ckpt_restore is not None else work_path("checkpoints", run_name)
    checkpoint = ModelCheckpoint(
        dirpath=str(default_dir),
        filename="best-epoch={epoch}-val_loss={val_loss:.4f}",
        auto_insert_metric_name=False,
        monitor="val_loss",
        mode="min",
        save_last=True,
    )
    history = _EpochHistory()
    callbacks: list[pl.Callback] = [checkpoint, history]
    stopper = None
    if stopping is not None:
        stopper = EarlyStopping(monitor="val_loss", mode="min", **stopping)
        callbacks.append(stopper)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        precision=precision,
        max_epochs=max_epochs,
        callbacks=callbacks,
        default_root_dir=str(default_dir),
        logger=False,
        enable_progress_bar=progress_bar,
    )
    ckpt_path = str(ckpt_restore) if ckpt_restore is not None else None
    tracked = mlflow_experiment is not None and trainer.global_rank == 0

    def fit() -> float:
        started = time.perf_counter()
        with warnings.catch_warnings():
            if ckpt_path is not None:  # resuming writes into the checkpoint's own folder on purpose
                warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        return time.perf_counter() - started

    run_id = model_name = model_version = None
    if tracked:
        experiment_id = setup_mlflow(mlflow_experiment, tracking_uri)
        mlflow.pytorch.autolog(log_models=False, checkpoint=False, silent=True)
        params: dict[str, Any] = {
            "learning_rate": model.hparams.get("learning_rate", getattr(model, "learning_rate", None)),
            "max_epochs": max_epochs,
            "accelerator": accelerator,
            "devices": devices,
            "num_nodes": num_nodes,
            "world_size": trainer.world_size,
            "strategy": strategy if isinstance(strategy, str) else type(strategy).__name__,
            "precision": precision,
            "early_stopping": stopping is not None,
            "ckpt_restore": ckpt_path,
        }
        if getattr(datamodule, "batch_size", None) is not None:
            params["batch_size"] = datamodule.batch_size
        for key in ("class_count", "backbone", "pretrained", "freeze_backbone", "image_size"):
            if key in model.hparams:
                params[key] = model.hparams[key]
        if stopping is not None:
            params.update({f"early_stopping_{key}": value for key, value in stopping.items()})
        params.update(extra_params or {})
        model_name = registered_model_name or _registered_name(mlflow_experiment)
        nested = mlflow.active_run() is not None
        with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, nested=nested) as run:
            run_id = run.info.run_id
            # in a HorovodRunner job, the driver ends this run FAILED if this process is stopped before it can
            record_mlflow_run(run_id, mlflow.get_tracking_uri())
            mlflow.log_params(params)
            wall_time_s = fit()
            mlflow.log_metric("wall_time_s", wall_time_s)
            # the lr the optimizer really used: a distributed strategy may have scaled it by the world size
            mlflow.log_param("effective_learning_rate", trainer.optimizers[0].param_groups[0]["lr"])
            model_version = _log_and_register_model(trainer.lightning_module, model_name)
    else:
        if mlflow_experiment is None and trainer.global_rank == 0:
            # autolog left on by an earlier tracked train() in this process would open a run of its own
            mlflow.pytorch.autolog(disable=True)
        wall_time_s = fit()

    metrics = trainer.callback_metrics
    best = checkpoint.best_model_score
    # should_stop is reset by every fit, while the callback's reason may come from a resumed checkpoint
    stopped_early = stopper is not None and trainer.should_stop
    stopped_reason = _STOP_REASONS.get(stopper.stopping_reason, "max_epochs") if stopped_early else "max_epochs"
    return TrainResult(
        epochs_run=trainer.current_epoch,
        best_val_loss=float(best) if best is not None else None,
        last_val_loss=float(metrics["val_loss"]) if "val_loss" in metrics else None,
        val_acc=float(metrics["val_acc"]) if "val_acc" in metrics else None,
        wall_time_s=wall_time_s,
        best_checkpoint=checkpoint.best_model_path or None,
        last_checkpoint=checkpoint.last_model_path or None,
        stopped_reason=stopped_reason,
        mlflow_run_id=run_id,
        registered_model_name=model_name if tracked else None,
        registered_model_version=model_version,
        history=history.epochs,
    )
