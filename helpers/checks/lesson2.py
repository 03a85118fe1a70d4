"""Checks for lesson 2: refactoring PyTorch into Lightning, with MLflow tracking and checkpoint resume."""

from __future__ import annotations

import logging
import math
import warnings

import torch
from torch.nn import functional as F

from helpers.checks import CheckFailed, NotAttempted, register, require, require_implemented


def _batch(rows: int = 6, classes: int = 3, size: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "features": torch.randn(rows, 3, size, size, generator=generator),
        "label_index": torch.randint(0, classes, (rows,), generator=generator),
    }


def _fit_one_epoch(model, train_loader, val_loader):
    """Fit ``model`` for one epoch on CPU, without loggers, checkpoints or progress output; return the Trainer."""
    import pytorch_lightning as pl

    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)
    return trainer


@register("2.1")
def epoch_steps_rule(epoch_steps) -> str:
    """``epoch_steps(rows, batch_size, world_size)``: steps per epoch for one pass over the data."""
    require_implemented(epoch_steps)
    for rows, batch, world in [(1438, 64, 1), (1438, 64, 2), (3670, 64, 8), (100, 10, 1), (5, 64, 4)]:
        expected = max(1, math.ceil(rows / (batch * world)))
        got = epoch_steps(rows, batch, world)
        if got != expected:
            raise CheckFailed(f"epoch_steps({rows}, {batch}, {world}) = {got}, expected {expected}: each step "
                              f"consumes batch_size x world_size rows, and a partial last step still counts")
    return "one epoch is one pass over the data, whatever the device count"


@register("2.3")
def lightning_steps(namespace) -> str:
    """``MyModel``: ``training_step`` returns the cross-entropy loss; validation logs ``val_loss``/``val_acc``."""
    from torch.utils.data import DataLoader

    model_class = require(namespace, "MyModel")
    require_implemented(model_class.training_step, model_class.validation_step)
    model = model_class(class_count=3, learning_rate=0.1, image_size=8)
    batch = _batch()
    quiet = logging.getLogger("pytorch_lightning")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = model.training_step(batch, 0)
            with torch.no_grad():
                expected = F.cross_entropy(model(batch["features"]), batch["label_index"])
            trainer = _fit_one_epoch(model, DataLoader([batch, batch], batch_size=None),
                                     DataLoader([batch], batch_size=None))
    finally:
        quiet.setLevel(level)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
        raise CheckFailed("training_step must return the loss: a scalar tensor that gradients flow through")
    if not torch.isclose(loss, expected, atol=1e-5):
        raise CheckFailed(f"training_step returned {loss.item():.4f}, cross-entropy is {expected.item():.4f}")
    missing = {"train_loss", "val_loss", "val_acc"} - {k.removesuffix("_epoch") for k in trainer.callback_metrics}
    if missing:
        raise CheckFailed(f"not logged: {sorted(missing)}; use self.log(...) in the steps")
    accuracy = float(trainer.callback_metrics["val_acc"])
    if not 0.0 <= accuracy <= 1.0:
        raise CheckFailed(f"val_acc = {accuracy}: log the fraction of correct predictions")
    return "training_step returns the loss; train_loss, val_loss and val_acc are logged"


@register("2.2")
def optimizer(make_optimizer) -> str:
    """``make_optimizer(model, learning_rate, momentum)``: SGD over the trainable parameters."""
    from helpers.model import make_network

    require_implemented(make_optimizer)
    network = make_network(3)
    network.features.requires_grad_(False)
    result = make_optimizer(network, 0.03, 0.8)
    if not isinstance(result, torch.optim.SGD):
        raise CheckFailed(f"got {type(result).__name__}: return torch.optim.SGD(...)")
    group = result.param_groups[0]
    if group["lr"] != 0.03 or group["momentum"] != 0.8:
        raise CheckFailed(f"lr={group['lr']}, momentum={group['momentum']}: pass learning_rate and momentum")
    optimised = {id(p) for g in result.param_groups for p in g["params"]}
    trainable = {id(p) for p in network.parameters() if p.requires_grad}
    if optimised != trainable:
        raise CheckFailed("optimise exactly the parameters that require gradients (a frozen backbone stays out)")
    return "SGD with momentum over the trainable parameters"


@register("2.4")
def datamodule_loaders(namespace) -> str:
    """``MyDataModule``: device ``device_id`` reads its own shard; training yields ``steps_per_epoch`` batches."""
    module_class, train_converter, val_converter = require(namespace, "MyDataModule", "train_converter",
                                                            "val_converter")
    require_implemented(module_class.train_dataloader, module_class.val_dataloader)
    ids = []
    for device in range(2):
        dm = module_class(train_converter, val_converter, batch_size=32, image_size=8, device_id=device,
                          device_count=2)
        train = dm.train_dataloader()
        if train is None:
            raise NotAttempted("train_dataloader returns nothing yet")
        batches = sum(1 for _ in train)
        if batches != dm.steps_per_epoch:
            raise CheckFailed(f"device {device}: {batches} training batches per epoch, expected "
                              f"{dm.steps_per_epoch} (steps_per_epoch)")
        ids.append([i for b in dm.val_dataloader() for i in b["row_id"].tolist()])
        dm.teardown("fit")
    if set(ids[0]) & set(ids[1]):
        raise CheckFailed("both devices read the same validation rows: pass cur_shard=device_id, "
                          "shard_count=device_count")
    if len(ids[0]) + len(ids[1]) != len(val_converter):
        raise CheckFailed(f"the 2 devices validated on {len(ids[0]) + len(ids[1])} of {len(val_converter)} rows: "
                          "validation must be one full pass per epoch")
    return "each device reads its own shard; validation covers every row once"


@register("2.5")
def callbacks(make_callbacks) -> str:
    """``make_callbacks(patience, min_delta, checkpoint_dir)``: EarlyStopping and ModelCheckpoint on val_loss."""
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    require_implemented(make_callbacks)
    result = list(make_callbacks(patience=4, min_delta=0.02, checkpoint_dir="ckpts"))
    stops = [c for c in result if isinstance(c, EarlyStopping)]
    saves = [c for c in result if isinstance(c, ModelCheckpoint)]
    if len(stops) != 1 or len(saves) != 1:
        raise CheckFailed("return a list with one EarlyStopping and one ModelCheckpoint")
    stop, save = stops[0], saves[0]
    if stop.monitor != "val_loss" or stop.mode != "min":
        raise CheckFailed(f"EarlyStopping watches {stop.monitor!r} ({stop.mode}): watch 'val_loss', mode 'min'")
    if stop.patience != 4 or not math.isclose(abs(stop.min_delta), 0.02):
        raise CheckFailed(f"patience={stop.patience}, min_delta={abs(stop.min_delta)}: pass the arguments through")
    if save.monitor != "val_loss" or save.mode != "min" or not save.save_last:
        raise CheckFailed("ModelCheckpoint should keep the best val_loss (mode 'min') and the last epoch "
                          "(save_last=True)")
    if save.dirpath is None or not str(save.dirpath).endswith("ckpts"):
        raise CheckFailed(f"checkpoints go to {save.dirpath!r}: pass dirpath=checkpoint_dir")
    return "stop on a val_loss plateau, keep the best and the last checkpoints"
