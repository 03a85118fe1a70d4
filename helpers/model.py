"""Lesson 2: the image classifier, as a plain network and as a LightningModule.

``make_network`` builds the ``nn.Module`` (used by the plain PyTorch loop and by the Lightning model, so the
architecture exists once); ``LitClassificationModel`` adds the loss, the logged metrics and the optimizer.

Batches are dicts ``{"features": float32 N x 3 x H x W, "label_index": int64 N}``, as the course's loaders
yield them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

from helpers import CourseInputError
from helpers.validation import check_flag, one_of, whole_number

__all__ = ["BACKBONES", "LitClassificationModel", "SmallCNN", "make_network"]

BACKBONES = ("small_cnn", "mobilenet_v2")


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head: trains on a CPU in seconds, any image size (adaptive pooling).

    Split into ``features`` and ``classifier`` like torchvision's MobileNetV2, so freezing works the same way.
    """

    def __init__(self, class_count: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, class_count))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Return class logits (N x class_count) for images (N x 3 x H x W)."""
        return self.classifier(self.features(features))


def _mobilenet_v2(class_count: int, pretrained: bool) -> nn.Module:
    """torchvision's MobileNetV2 (ImageNet weights if ``pretrained``) with a new ``class_count`` head."""
    try:
        from torchvision.models import mobilenet_v2
    except ImportError:
        raise CourseInputError(
            'backbone="mobilenet_v2" needs torchvision: install torchvision, or use backbone="small_cnn".'
        ) from None
    try:
        network = mobilenet_v2(weights="DEFAULT" if pretrained else None)
    except OSError as error:  # URLError is an OSError: no internet and no cached weights
        raise CourseInputError(
            f"pretrained=True: the MobileNetV2 weights could not be loaded ({error}); put them in the torch hub "
            "cache ($TORCH_HOME) or pass pretrained=False."
        ) from None
    network.classifier[-1] = nn.Linear(network.last_channel, class_count)
    return network


def make_network(
    class_count: int, backbone: str = "small_cnn", pretrained: bool = False, freeze_backbone: bool = False
) -> nn.Module:
    """Build the classifier network: ``backbone`` features plus a new head with ``class_count`` outputs.

    Args:
        class_count: the number of classes, at least 2.
        backbone: ``"small_cnn"`` (trains on a CPU in seconds) or ``"mobilenet_v2"`` (torchvision).
        pretrained: start from ImageNet weights (``"mobilenet_v2"`` only).
        freeze_backbone: stop gradients in the feature extractor (``network.features``) so only the head trains,
            the usual recipe with ``pretrained`` weights.

    Returns:
        The ``nn.Module``, mapping images (N x 3 x H x W) to class logits.

    Raises:
        CourseInputError: an unknown backbone, a ``class_count`` below 2, a flag that is not a bool,
            ``pretrained`` with ``"small_cnn"`` (it has no pretrained weights), or MobileNetV2 without
            torchvision or its weights.
    """
    one_of("backbone", backbone, BACKBONES)
    whole_number("class_count", class_count, minimum=2, hint="It is the number of classes.")
    check_flag("pretrained", pretrained)
    check_flag("freeze_backbone", freeze_backbone)
    if backbone == "small_cnn":
        if pretrained:
            raise CourseInputError(
                'pretrained=True: backbone="small_cnn" has no pretrained weights; pass pretrained=False or '
                'use backbone="mobilenet_v2".'
            )
        network = SmallCNN(class_count)
    else:
        network = _mobilenet_v2(class_count, pretrained)
    if freeze_backbone:
        network.features.requires_grad_(False)
    return network


class LitClassificationModel(pl.LightningModule):
    """The classifier as a LightningModule: cross-entropy loss, SGD, ``train_loss``/``val_loss``/``val_acc``.

    ``self.learning_rate`` is read when the optimizer is created (``configure_optimizers``), so a distributed
    strategy can scale it by the world size before that. ``image_size`` is recorded for exporting the model
    (the example input's size); the networks themselves accept any size.

    Args:
        class_count: the number of classes.
        learning_rate: SGD's learning rate, positive.
        momentum: SGD's momentum.
        backbone: see :func:`make_network`, like ``pretrained`` and ``freeze_backbone``.
        pretrained: see :func:`make_network`.
        freeze_backbone: see :func:`make_network`.
        image_size: the side of the images the model is exported for.
        lr_schedule: a learning rate per optimizer step, ``lr_schedule(step) -> float`` (step counted from 0 over
            the whole training), set before each step; it replaces ``learning_rate`` and any scaling by a strategy,
            so it must include the world size (e.g. lesson 3's warm-up, ``scaled_learning_rate``). With an MLflow
            run open on global rank 0, each step's rate is logged there as ``lr``. None: ``learning_rate``.

    Raises:
        CourseInputError: ``learning_rate`` is not positive, ``lr_schedule`` is not callable, or
            :func:`make_network` refuses the network settings.
    """

    def __init__(
        self,
        class_count: int,
        learning_rate: float = 1e-2,
        momentum: float = 0.9,
        backbone: str = "small_cnn",
        pretrained: bool = False,
        freeze_backbone: bool = False,
        image_size: int = 32,
        lr_schedule: Callable[[int], float] | None = None,
    ) -> None:
        super().__init__()
        if learning_rate <= 0:
            raise CourseInputError(f"learning_rate={learning_rate!r}: pass a positive number such as 1e-2.")
        if lr_schedule is not None and not callable(lr_schedule):
            raise CourseInputError(f"lr_schedule={lr_schedule!r}: pass a function of the step, or None.")
        self.save_hyperparameters(ignore=["lr_schedule"])  # a function is no hyperparameter to record
        self.learning_rate = learning_rate
        self.lr_schedule = lr_schedule
        self.network = make_network(class_count, backbone, pretrained, freeze_backbone)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Return class logits for a batch of images."""
        return self.network(features)

    def _loss_and_accuracy(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy and accuracy of the model on one batch."""
        logits = self(batch["features"])
        labels = batch["label_index"]
        loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        return loss, accuracy

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch; logs ``train_loss`` per step and per epoch (averaged over devices)."""
        loss, _ = self._loss_and_accuracy(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True, batch_size=len(batch["label_index"]))
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Set the learning rate of the coming optimizer step from ``lr_schedule`` (if any), and log it."""
        if self.lr_schedule is None:
            return
        rate = float(self.lr_schedule(self.global_step))
        optimizers = self.optimizers()
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            for group in optimizer.param_groups:
                group["lr"] = rate
        if self.global_rank == 0:
            import mlflow

            if mlflow.active_run() is not None:
                mlflow.log_metric("lr", rate, step=self.global_step)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Logs ``val_loss`` and ``val_acc`` per epoch, averaged over all batches and devices."""
        loss, accuracy = self._loss_and_accuracy(batch)
        metrics = {"val_loss": loss, "val_acc": accuracy}
        self.log_dict(metrics, on_epoch=True, sync_dist=True, batch_size=len(batch["label_index"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum over the trainable parameters, at ``self.learning_rate``."""
        trainable = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.SGD(trainable, lr=self.learning_rate, momentum=self.hparams.momentum)
