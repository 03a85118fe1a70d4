"""Checks for lesson 2: refactoring PyTorch into Lightning, with MLflow tracking and checkpoint resume.

Every check calls the answer on inputs it generates from a fixed seed (other sizes, class counts, learning
rates, epochs), so a hard-coded answer fails and the verdict is the same on every run. Trainings run on tiny
models and data made here, in a temporary folder (whatever an answer writes to its working directory goes
there); MLflow checks use a throw-away store of their own and leave the notebook's MLflow settings as they were.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import chdir, contextmanager
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from helpers.course.checks import (
    NotAttempted,
    close,
    quiet_lightning,
    register,
    require,
)
from helpers.course.checks.function_check import Case, Collected, FunctionCheck

__all__ = [
    "best_run_check",
    "callbacks",
    "datamodule_loaders",
    "epoch_steps_rule",
    "lightning_steps",
    "optimizer",
    "resumed_training",
    "tracked_fit",
]

# ---------------------------------------------------------------------------------------------------------------
# Small pieces the checks share: quiet Lightning, tiny models and data, a private MLflow store, a faked rank.


def _batch(rows: int, classes: int, size: int, seed: int) -> dict[str, torch.Tensor]:
    """An image batch as the course's loaders yield it, with at least one row of every class."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.arange(classes), torch.randint(0, classes, (rows - classes,), generator=generator)])
    return {"features": torch.randn(rows, 3, size, size, generator=generator), "label_index": labels}


def _trainer(**kwargs) -> pl.Trainer:
    """A CPU Trainer without logger, progress bar or summary (``kwargs`` override or add settings)."""
    settings = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    return pl.Trainer(**{**settings, **kwargs})


class _TinyClassifier(pl.LightningModule):
    """A linear classifier on 4 features that records where each fit starts and which epochs it trains."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(4, 3)
        self.starts: list[dict] = []
        self.epochs: list[int] = []

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["features"]), batch["label_index"])
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch["features"]), batch["label_index"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def on_train_start(self) -> None:
        state = self.trainer.optimizers[0].state_dict()["state"]
        self.starts.append(
            {
                "epoch": self.current_epoch,
                "step": self.trainer.global_step,
                "weights": {k: v.detach().cpu().clone() for k, v in self.state_dict().items()},
                "momentum": {k: v["momentum_buffer"].cpu().clone() for k, v in state.items() if "momentum_buffer" in v},
            }
        )

    def on_train_epoch_start(self) -> None:
        self.epochs.append(self.current_epoch)


class _TinyData(pl.LightningDataModule):
    """``steps`` training batches of 8 rows and 2 validation batches, generated from ``seed``."""

    def __init__(self, steps: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.batches = [
            {
                "features": torch.randn(8, 4, generator=generator),
                "label_index": torch.randint(0, 3, (8,), generator=generator),
            }
            for _ in range(steps + 2)
        ]
        self.steps = steps

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches[: self.steps], batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.batches[self.steps :], batch_size=None)


_STORE: dict[str, str] = {}


def _tracking_store() -> str:
    """The URI of this process's private MLflow store (SQLite in a temporary folder, created once, with every
    experiment's artifacts in that folder too, the default experiment's included)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    if "uri" not in _STORE:
        folder = Path(tempfile.mkdtemp(prefix="course-check-l2-"))
        _STORE.update(uri=f"sqlite:///{folder / 'mlflow.db'}", artifacts=(folder / "artifacts").as_uri())
        SqlAlchemyStore(_STORE["uri"], _STORE["artifacts"])
    return _STORE["uri"]


def _new_experiment(client, prefix: str) -> tuple[str, str]:
    """Create an experiment with a fresh name in the private store; return ``(name, id)``."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return name, client.create_experiment(name, artifact_location=f"{_STORE['artifacts']}/{name}")


def _set_env(key: str, value: str | None) -> None:
    """Set environment variable ``key`` to ``value``, or remove it when ``value`` is None."""
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


@contextmanager
def _isolated_mlflow(uri: str) -> Iterator[None]:
    """Point MLflow at ``uri`` while a check trains, then restore the notebook's tracking URI and active
    experiment, end any run left open and turn autolog off (so a check's fits never log into the notebook's
    store, and each process-like call starts without the previous one's autolog)."""
    import mlflow
    from mlflow.tracking import _tracking_service, fluent

    utils = _tracking_service.utils
    saved_uri, saved_experiment = utils._tracking_uri, fluent._active_experiment_id
    saved_env = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.pytorch.autolog(disable=True)
        utils._tracking_uri, fluent._active_experiment_id = saved_uri, saved_experiment
        for key, value in saved_env.items():
            _set_env(key, value)


@contextmanager
def _as_rank(rank: int) -> Iterator[None]:
    """Make this process look like global rank ``rank`` of a multi-process job to the answer: the Trainer's
    ``global_rank``/``local_rank``/``is_global_zero``, Lightning's ``rank_zero_only`` and ``RANK``."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    names = ("global_rank", "local_rank", "is_global_zero")
    saved = {name: pl.Trainer.__dict__[name] for name in names}
    saved_rank, saved_env = getattr(rank_zero_only, "rank", 0), os.environ.get("RANK")
    pl.Trainer.global_rank = pl.Trainer.local_rank = property(lambda self: rank)
    pl.Trainer.is_global_zero = property(lambda self: rank == 0)
    rank_zero_only.rank, os.environ["RANK"] = rank, str(rank)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(pl.Trainer, name, value)
        rank_zero_only.rank = saved_rank
        _set_env("RANK", saved_env)


# ---------------------------------------------------------------------------------------------------------------
# The checks


def _steps(rows: int, batch_size: int, world_size: int) -> int:
    """The reference: one pass over ``rows``, ``batch_size x world_size`` rows a step, a partial last step too."""
    return max(1, -(-rows // (batch_size * world_size)))


#: ``epoch_steps(rows, batch_size, world_size)``: steps per epoch for one pass over the data, on the lesson's sizes
#: and 20 drawn ones; calling ``helpers.loaders.steps_per_epoch`` is delegating
epoch_steps_rule = register("2.1")(
    FunctionCheck(
        "2.1",
        answer="epoch_steps",
        fixed=[(1438, 64, 1), (1438, 64, 2), (3670, 64, 8), (100, 10, 1), (5, 64, 4), (128, 64, 2), (129, 64, 2)],
        draw=lambda rng: (rng.randint(1, 5000), rng.randint(1, 128), rng.randint(1, 16)),
        draws=20,
        reference=_steps,
        forbid=("helpers.loaders:steps_per_epoch",),
        hint="each step consumes batch_size x world_size rows, and a partial last step still counts",
        passed="one epoch is one pass over the data, whatever the device count ({n} cases)",
    )
)


_FROZEN_PARTS = ("backbone", "nothing", "head", "lightning")  # what 2.2's networks freeze (lightning: its backbone)


def _optimizer_case(rng: random.Random) -> tuple[torch.nn.Module, float, float]:
    """A network with one of :data:`_FROZEN_PARTS` frozen, and the learning rate and momentum to ask for."""
    from helpers.model import LitClassificationModel, make_network

    frozen, classes = rng.choice(_FROZEN_PARTS), rng.randint(3, 9)
    if frozen == "lightning":
        network = LitClassificationModel(classes, freeze_backbone=True)
    else:
        network = make_network(classes, freeze_backbone=frozen == "backbone")
        if frozen == "head":
            network.classifier.requires_grad_(False)
    return network, round(rng.uniform(1e-4, 0.5), 5), round(rng.uniform(0.5, 0.99), 3)


def _optimizer_problem(
    case: tuple[torch.nn.Module, float, float], got: object, given: tuple[torch.nn.Module, float, float]
) -> str | None:
    """What is wrong with the optimizer ``make_optimizer(model, learning_rate, momentum)`` returned, or None: it
    must optimise the parameters of the network it was given (``given``) that required gradients as the case was
    given, and leave which ones do as they were."""
    network, learning_rate, momentum = case
    if not isinstance(got, torch.optim.SGD):
        return f"returned {type(got).__name__}: return torch.optim.SGD(...)"
    for group in got.param_groups:
        if not close(group["lr"], learning_rate) or not close(group["momentum"], momentum):
            return f"has lr={group['lr']}, momentum={group['momentum']}: pass learning_rate and momentum through"
    pairs = list(zip(network.parameters(), given[0].parameters()))
    if any(mine.requires_grad != theirs.requires_grad for mine, theirs in pairs):
        return "changed which parameters require gradients: leave the model as it is, frozen parameters stay frozen"
    optimised = {id(p) for g in got.param_groups for p in g["params"]}
    if optimised != {id(theirs) for mine, theirs in pairs if mine.requires_grad}:
        return "does not optimise exactly the parameters that require gradients (frozen ones stay out)"
    return None


#: ``make_optimizer(model, learning_rate, momentum)``: SGD with momentum over the trainable parameters, on 6 drawn
#: networks (frozen backbone, nothing frozen, frozen head, a LightningModule); the LightningModule's own
#: ``configure_optimizers`` would do it for the answer
optimizer = register("2.2")(
    FunctionCheck(
        "2.2",
        answer="make_optimizer",
        fixed=[],
        draw=_optimizer_case,
        draws=6,  # every kind of _FROZEN_PARTS among them (tests/test_answers_lesson2.py)
        judge=_optimizer_problem,
        forbid=("helpers.model:LitClassificationModel.configure_optimizers",),
        hint="return torch.optim.SGD over the parameters that require gradients",
        passed="SGD with momentum over the trainable parameters ({n} networks)",
    )
)


def _expected_validation(model, batches: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` over equal-sized ``batches``, in eval mode."""
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(b["features"]) for b in batches])
    labels = torch.cat([b["label_index"] for b in batches])
    return F.cross_entropy(logits, labels).item(), (logits.argmax(dim=1) == labels).float().mean().item()


def _loss_of(output: Any) -> torch.Tensor | None:
    """The loss a ``training_step`` returned (itself, or ``{"loss": ...}``) if it is a scalar tensor that gradients
    flow through; else None."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    return loss if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad else None


def _step_and_fit(model: Any, case: tuple[int, int]) -> Any:
    """One ``training_step`` called directly, then one epoch fitted on generated 32-pixel batches of ``case``
    (``classes, rows``): its ``output`` on the first batch and the cross-entropy ``expected`` there, what the fit
    ``logged`` and the validation loss and accuracy computed here afterwards (``val``); anything that is not a
    LightningModule as it is (the judge names it)."""
    classes, rows = case
    if not isinstance(model, pl.LightningModule):
        return model
    train = [_batch(rows, classes, 32, seed) for seed in (1, 2)]
    val = [_batch(rows, classes, 32, seed) for seed in (3, 4)]
    output = model.training_step(train[0], 0)
    with torch.no_grad():
        expected = F.cross_entropy(model(train[0]["features"]), train[0]["label_index"])
    if _loss_of(output) is None:  # nothing to fit with: the judge says so
        return Collected(output=output, expected=expected)
    trainer = _trainer(max_epochs=1)
    trainer.fit(
        model, train_dataloaders=DataLoader(train, batch_size=None), val_dataloaders=DataLoader(val, batch_size=None)
    )
    return Collected(
        output=output, expected=expected, logged=dict(trainer.callback_metrics), val=_expected_validation(model, val)
    )


def _logged_problem(logged: Mapping[str, Any], val_loss: float, val_acc: float) -> str | None:
    """What is wrong with the metrics one epoch logged, against the validation loss and accuracy computed here."""
    metrics = {key.removesuffix("_epoch"): value for key, value in logged.items()}
    missing = {"train_loss", "val_loss", "val_acc"} - set(metrics)
    if missing:
        return f"logged no {sorted(missing)}: use self.log(...) in the steps"
    train_keys = sorted(key for key in logged if key.startswith("train_loss"))
    if not {"train_loss_epoch", "train_loss_step"} <= set(train_keys):
        return (
            f"logged train_loss as {train_keys}: log it per step and per epoch, self.log('train_loss', loss, "
            "on_step=True, on_epoch=True, ...), which Lightning records as train_loss_step and train_loss_epoch"
        )
    if not close(metrics["val_loss"], val_loss, rel=1e-4):
        return (
            f"logged val_loss {float(metrics['val_loss']):.4f}, expected {val_loss:.4f}: log the cross-entropy of "
            "the validation batch"
        )
    if not close(metrics["val_acc"], val_acc, rel=1e-4):
        return (
            f"logged val_acc {float(metrics['val_acc']):.4f}, expected {val_acc:.4f}: log the fraction of "
            "predictions (argmax of the logits) equal to the label"
        )
    return None


def _steps_problem(case: tuple[int, int], got: Any, _given: tuple) -> str | None:
    """What is wrong with the model's steps: the loss ``training_step`` returns, then what the fit logged."""
    if not isinstance(got, Collected):
        return f"made a {type(got).__name__}: keep MyModel a subclass of LitClassificationModel"
    loss = _loss_of(got["output"])
    if loss is None:
        return (
            "has a training_step that returns no loss: return the loss (or {'loss': loss}), a scalar tensor that "
            "gradients flow through"
        )
    if not torch.isclose(loss.detach(), got["expected"], atol=1e-5):
        return f"has a training_step that returned {loss.item():.4f}, cross-entropy is {got['expected'].item():.4f}"
    return _logged_problem(got["logged"], *got["val"])


@contextmanager
def _fit_quietly(_case: tuple = (), _given: Any = None) -> Iterator[None]:
    """Lightning quiet, and MLflow pointed at the check's own store (the notebook's autolog logs nothing here)."""
    with quiet_lightning(), _isolated_mlflow(_tracking_store()):
        yield


#: ``MyModel``'s ``training_step`` and ``validation_step``: one step called directly, then one epoch fitted on
#: generated batches; the loss returned and the metrics logged compared with values computed here
lightning_steps = register("2.3")(
    FunctionCheck(
        "2.3",
        answer="MyModel",
        fixed=[],
        draw=lambda rng: (rng.randint(3, 7), rng.randint(8, 12)),
        draws=1,
        arguments=lambda case: (case[0],),
        collect=_step_and_fit,
        around=_fit_quietly,
        judge=_steps_problem,
        methods=("training_step", "validation_step"),
        show=lambda case: f"{case[0]}",
        forbid=(
            "helpers.model:LitClassificationModel.training_step",
            "helpers.model:LitClassificationModel.validation_step",
            "helpers.model:LitClassificationModel._loss_and_accuracy",
        ),
        hint="training_step returns the cross-entropy and logs train_loss; validation_step logs val_loss and val_acc",
        passed="training_step returns the loss; train_loss, val_loss and val_acc are logged",
    )
)


def _read(loader, what: str) -> list[tuple[list[int], tuple[int, ...]]]:
    """``(row ids, image shape)`` of every batch ``loader`` yields in one pass (NotAttempted if it is None)."""
    if loader is None:
        raise NotAttempted(f"{what} returns nothing yet")
    try:
        return [(batch["row_id"].tolist(), tuple(batch["features"].shape[1:])) for batch in loader]
    finally:
        getattr(loader, "close", lambda: None)()


def _lessons_data(namespace: Mapping[str, Any]) -> list[Case]:
    """The notebook's converters at a seeded batch and image size: the case 2.4 is checked on."""
    train_converter, val_converter = require(namespace, "train_converter", "val_converter")
    rng = random.Random(24)
    return [Case((train_converter, val_converter, rng.choice([24, 40, 48]), rng.choice([8, 12])))]


def _read_module(module: Any, case: tuple) -> Any:
    """One pass of a module's training and validation loaders, then its teardown: the training batches' row ids
    and image shapes (``train``), the validation rows (``val``) and its ``steps``; anything that is not a
    DataModule as it is (the judge names it)."""
    if not isinstance(module, pl.LightningDataModule):
        return module
    try:
        train = _read(module.train_dataloader(), "train_dataloader")
        val = [row for rows, _ in _read(module.val_dataloader(), "val_dataloader") for row in rows]
    finally:
        module.teardown("fit")
    return Collected(train=train, val=val, steps=module.steps_per_epoch)


def _one_device_problem(read: Any, device: int, batch_size: int, image_size: int) -> str | None:
    """What is wrong with one device's training batches, or None."""
    if not isinstance(read, Collected):
        return f"made a {type(read).__name__}: keep MyDataModule a subclass of PetastormDataModule"
    shapes = {shape for _, shape in read["train"]} - {(3, image_size, image_size)}
    if shapes:
        return f"gave images of shape {shapes.pop()}, expected (3, {image_size}, {image_size}): pass self.image_size"
    if len(read["train"]) != read["steps"]:
        return (
            f"gave device {device} {len(read['train'])} training batches per epoch, expected {read['steps']} "
            "(self.steps_per_epoch)"
        )
    sizes = [len(rows) for rows, _ in read["train"]]
    if sizes and set(sizes[:-1]) <= {batch_size} and sizes[-1] < batch_size:
        return (
            f"gave a last training batch of {sizes[-1]} rows: pass steps_per_epoch=self.steps_per_epoch, so that an "
            "epoch is that many full batches"
        )
    if set(sizes) != {batch_size}:
        return f"gave training batches of {sorted(set(sizes))} rows, expected {batch_size}: pass self.batch_size"
    return None


def _devices_problem(case: tuple, reads: list[Any], _given: list[tuple]) -> str | None:
    """What is wrong with the two devices' loaders: each on its own, then together (their own shards, and
    validation one full pass)."""
    _, val_converter, batch_size, image_size = case
    for device, read in enumerate(reads):
        problem = _one_device_problem(read, device, batch_size, image_size)
        if problem:
            return problem
    train = [{row for rows, _ in read["train"] for row in rows} for read in reads]
    if train[0] & train[1]:
        return (
            "trained both devices on the same rows: pass cur_shard=self.device_id, shard_count=self.device_count to "
            "the training loader"
        )
    val = [set(read["val"]) for read in reads]
    if val[0] & val[1]:
        return (
            "read the same validation rows on both devices: pass cur_shard=self.device_id, "
            "shard_count=self.device_count"
        )
    if sum(len(read["val"]) for read in reads) != len(val_converter):
        return (
            f"validated the 2 devices on {sum(len(read['val']) for read in reads)} of {len(val_converter)} rows: "
            "validation must be one full pass per epoch"
        )
    return None


#: ``MyDataModule``'s ``train_dataloader`` and ``val_dataloader``: made for device 0 and device 1 of 2 on the
#: notebook's converters, at a seeded batch and image size, and the two devices judged together
datamodule_loaders = register("2.4")(
    FunctionCheck(
        "2.4",
        answer="MyDataModule",
        fixed=[],
        from_namespace=_lessons_data,
        calls=lambda case: [(*case, device, 2) for device in range(2)],
        collect=_read_module,
        judge=_devices_problem,
        methods=("train_dataloader", "val_dataloader"),
        show=lambda case: f"train_converter, val_converter, {case[2]}, {case[3]}, <each device>, 2",
        forbid=(
            "helpers.datamodule:PetastormDataModule.train_dataloader",
            "helpers.datamodule:PetastormDataModule.val_dataloader",
            "helpers.datamodule:PetastormDataModule._batches",
        ),
        hint=(
            "PetastormBatches(converter, self.batch_size, self.image_size, cur_shard=self.device_id, "
            "shard_count=self.device_count, ...): steps_per_epoch and shuffle for training"
        ),
        passed="each device reads its own shard",
        passed_namespace="; validation covers every row once",
    )
)


def _callbacks_problem(case: tuple[int, float, str], got: object, _given: tuple) -> str | None:
    """What is wrong with the callbacks ``make_callbacks(patience, min_delta, checkpoint_dir)`` returned, or None."""
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    patience, min_delta, folder = case
    result = list(got) if isinstance(got, (list, tuple)) else []
    stops = [c for c in result if isinstance(c, EarlyStopping)]
    saves = [c for c in result if isinstance(c, ModelCheckpoint)]
    if len(stops) != 1 or len(saves) != 1:
        return f"returned {got!r}: return a list with one EarlyStopping and one ModelCheckpoint"
    stop, save = stops[0], saves[0]
    if stop.monitor != "val_loss" or stop.mode != "min":
        return f"has EarlyStopping watching {stop.monitor!r} ({stop.mode}): watch 'val_loss', mode 'min'"
    if stop.patience != patience or not close(abs(stop.min_delta), min_delta):
        return (
            f"has EarlyStopping(patience={stop.patience}, min_delta={abs(stop.min_delta)}): pass patience and "
            "min_delta through"
        )
    if save.monitor != "val_loss" or save.mode != "min" or not save.save_last or save.save_top_k == 0:
        return "has a ModelCheckpoint that should keep the best val_loss (mode 'min') and a last.ckpt (save_last=True)"
    if save.dirpath is None or Path(save.dirpath).resolve() != Path(folder).resolve():
        return f"writes checkpoints to {save.dirpath!r}, not {folder!r}: pass dirpath=checkpoint_dir"
    return None


#: ``make_callbacks(patience, min_delta, checkpoint_dir)``: EarlyStopping and ModelCheckpoint on val_loss, with the
#: arguments passed through, on the lesson's settings and 3 drawn ones; the course's own callbacks
#: (``helpers.training._Callbacks``) would do it for the answer
callbacks = register("2.5")(
    FunctionCheck(
        "2.5",
        answer="make_callbacks",
        fixed=[(3, 0.01, "checkpoints")],
        draw=lambda rng: (rng.randint(2, 15), round(rng.uniform(0.001, 0.1), 4), f"ckpts-{rng.randint(100, 999)}"),
        draws=3,
        judge=_callbacks_problem,
        forbid=("helpers.training:_Callbacks",),
        hint="return [EarlyStopping(...), ModelCheckpoint(...)] built from the arguments",
        passed="stop on a val_loss plateau, keep the best checkpoint and a last.ckpt ({n} settings)",
    )
)


def _case_folder(tracking_uri: str) -> Path:
    """The temporary folder of a 2.6 case, which holds its MLflow store (``sqlite:///<folder>/mlflow.db``)."""
    return Path(tracking_uri.removeprefix("sqlite:///")).parent


def _tracked_fit_arguments(case: tuple[int, int, int, int]) -> tuple:
    """The call of a 2.6 case ``(rank, patience, max_epochs, seed)``: a tiny model and data, an EarlyStopping that
    stops after exactly ``patience + 1`` epochs (its ``min_delta`` is far above any change in val_loss) and a
    ModelCheckpoint, an experiment, and an MLflow store of the case's own, in a new temporary folder."""
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    _, patience, max_epochs, seed = case
    folder = Path(tempfile.mkdtemp(prefix="course-check-2.6-"))
    callbacks = [
        EarlyStopping(monitor="val_loss", min_delta=1e3, patience=patience),
        ModelCheckpoint(dirpath=folder / "checkpoints", monitor="val_loss", save_last=True),
    ]
    model, data = _TinyClassifier(seed=seed), _TinyData(steps=3, seed=seed + 1)
    return model, data, callbacks, max_epochs, f"check-2.6-{seed}", f"sqlite:///{folder / 'mlflow.db'}"


@contextmanager
def _fit_as_rank(case: tuple, given: tuple) -> Iterator[None]:
    """A 2.6 call: quiet Lightning, MLflow on an empty store (an answer must use the tracking_uri it is given), this
    process as the case's global rank, the case's folder as the working directory."""
    with quiet_lightning(), _on_an_empty_store(case, given), _as_rank(case[0]), chdir(_case_folder(given[5])):
        yield


def _fit_and_run_state(result: Any, _case: tuple) -> Collected:
    """The Trainer the answer returned, and whether it left an MLflow run open."""
    import mlflow

    return Collected(trainer=result, left_open=mlflow.active_run() is not None)


def _runs_of(tracking_uri: str) -> list:
    """Every run in a 2.6 case's store (none where the answer never opened it)."""
    from mlflow.tracking import MlflowClient

    if not (_case_folder(tracking_uri) / "mlflow.db").exists():
        return []
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments)


def _not_the_trainer(got: Any, model: pl.LightningModule) -> str | None:
    """Unless ``got`` is the Trainer that fitted ``model``, what to return instead (2.6 and 2.7 ask for it)."""
    if isinstance(got, pl.Trainer) and got.lightning_module is model:
        return None
    return f"returned a {type(got).__name__}: return the pl.Trainer that ran the fit"


def _trainer_problem(trainer: Any, model: _TinyClassifier, callbacks: list, max_epochs: int) -> str | None:
    """What is wrong with the Trainer an answer returned and the epochs it trained, or None."""
    if not model.epochs:
        return "trained nothing: build a pl.Trainer and call trainer.fit(model, datamodule=datamodule)"
    problem = _not_the_trainer(trainer, model)
    if problem:
        return problem
    if not all(any(given is had for had in trainer.callbacks) for given in callbacks):
        return "fitted without the callbacks given: pass callbacks=callbacks to the Trainer"
    if trainer.max_epochs != max_epochs:
        return f"made a Trainer with max_epochs={trainer.max_epochs}: pass max_epochs=max_epochs"
    return None


def _tracked_fit_problem(case: tuple, got: Any, given: tuple) -> str | None:
    """What is wrong with a 2.6 answer's fit on ``given``, and the MLflow runs it recorded, or None."""
    from mlflow.tracking import MlflowClient

    rank, patience, max_epochs, _ = case
    model, _, callbacks, _, experiment, tracking_uri = given
    problem = _trainer_problem(got["trainer"], model, callbacks, max_epochs)
    if problem:
        return problem
    if len(model.epochs) != min(patience + 1, max_epochs):
        return f"trained {len(model.epochs)} epochs, expected {min(patience + 1, max_epochs)}: fit once"
    runs = _runs_of(tracking_uri)
    if rank != 0:
        return (
            "recorded an MLflow run on global rank 1: track on rank 0 only (if trainer.global_rank == 0), or "
            "every process opens its own run"
            if runs
            else None
        )
    if not runs:
        return (
            "recorded no MLflow run at tracking_uri: mlflow.set_tracking_uri(tracking_uri), then on rank 0 turn on "
            "mlflow.pytorch.autolog() (or pass an MLFlowLogger) before trainer.fit"
        )
    if len(runs) > 1:
        return f"opened {len(runs)} MLflow runs for one fit: track it as one run"
    run = runs[0]
    if MlflowClient(tracking_uri).get_experiment(run.info.experiment_id).name != experiment:
        return "recorded its run in another experiment: mlflow.set_experiment(experiment) first"
    if got["left_open"] or run.info.status != "FINISHED":
        return "left its MLflow run open after the fit: end it (with mlflow.start_run(): ...)"
    if "val_loss" not in run.data.metrics:
        return f"logged {sorted(run.data.metrics)}, no val_loss: let autolog or the MLFlowLogger log the epoch metrics"
    return None


def _show_tracked_fit(case: tuple) -> str:
    """A 2.6 call as its hint shows it: ``<model>, ..., <tracking_uri>; on global rank 1``."""
    rank, patience, max_epochs, _ = case
    on = f"; on global rank {rank}" if rank else ""
    return (
        f"<model>, <datamodule>, [EarlyStopping(patience={patience}), ModelCheckpoint], max_epochs={max_epochs}, "
        f"<experiment>, <tracking_uri>{on}"
    )


#: ``fit_tracked(model, datamodule, callbacks, max_epochs, experiment, tracking_uri)``: a Trainer with the callbacks
#: and max_epochs, returned; on global rank 0 one finished MLflow run in ``experiment`` at ``tracking_uri`` with
#: val_loss, none on rank 1 (a simulated rank); every case in a folder and a store of its own
tracked_fit = register("2.6")(
    FunctionCheck(
        "2.6",
        answer="fit_tracked",
        fixed=[(0, 2, 5, 1), (1, 9, 2, 3)],
        draw=lambda rng: (0, rng.randint(1, 3), rng.randint(2, 6), rng.randint(5, 99)),
        draws=1,
        arguments=_tracked_fit_arguments,
        around=_fit_as_rank,
        collect=_fit_and_run_state,
        judge=_tracked_fit_problem,
        cleanup=lambda case, made: shutil.rmtree(_case_folder(made[5]), ignore_errors=True),
        show=_show_tracked_fit,
        forbid=("helpers.training:train", "helpers.tracking:setup_mlflow"),
        hint=(
            "fit a pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, ...) and return it; on global rank 0, "
            "inside one MLflow run at tracking_uri"
        ),
        passed=(
            "the Trainer stops early and checkpoints; rank 0 records one MLflow run with the metrics, rank 1 none "
            "({n} fits)"
        ),
    )
)


def _resume_callbacks(folder: Path, patience: int) -> list[pl.Callback]:
    """The callbacks a checked training is saved and resumed with: an EarlyStopping whose ``min_delta`` is far above
    any change in val_loss (every epoch after the first adds one to its wait count), and a ModelCheckpoint without
    a monitor (it writes ``last.ckpt`` every epoch) into ``folder``."""
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    return [
        EarlyStopping(monitor="val_loss", min_delta=1e3, patience=patience),
        ModelCheckpoint(dirpath=folder, save_last=True),
    ]


_SAVED = "saved-state.pt"  # a copy of the checkpoint as it was before the answer resumed from it (not a *.ckpt)


def _saved_training(case: tuple[int, int, int, int, int]) -> tuple:
    """The call of a 2.7 case ``(done, more, patience, steps, seed)``: a training of ``done`` epochs saved in a new
    temporary folder (``given-checkpoints/last.ckpt``, copied to :data:`_SAVED`), and a new model, the data, the
    checkpoint's path, ``done + more`` and callbacks made like the saved ones."""
    done, more, patience, steps, seed = case
    folder = Path(tempfile.mkdtemp(prefix="course-check-2.7-"))
    saves, data = folder / "given-checkpoints", _TinyData(steps=steps, seed=seed)
    with _fit_quietly():
        first = _trainer(max_epochs=done, enable_checkpointing=True, callbacks=_resume_callbacks(saves, patience))
        first.fit(_TinyClassifier(seed=seed + 1), datamodule=data)
    shutil.copy(saves / "last.ckpt", folder / _SAVED)
    return (
        _TinyClassifier(seed=seed + 2),
        data,
        str(saves / "last.ckpt"),
        done + more,
        _resume_callbacks(saves, patience),
    )


@contextmanager
def _resume_in_its_folder(_case: tuple, given: tuple) -> Iterator[None]:
    """A 2.7 call: quiet Lightning, MLflow on the check's store, the case's folder as the working directory."""
    with _fit_quietly(), chdir(Path(given[2]).parent.parent):
        yield


def _start_problem(start: dict, saved: dict) -> str | None:
    """What the resumed fit, which started at ``start``, did not take from the ``saved`` checkpoint, or None."""
    if not all(torch.equal(start["weights"][k], v) for k, v in saved["state_dict"].items()):
        return "started from other weights than the checkpoint's: pass ckpt_path=ckpt_path to trainer.fit"
    if (start["epoch"], start["step"]) != (saved["epoch"] + 1, saved["global_step"]):
        return (
            f"restarted at epoch {start['epoch']}, step {start['step']}, not epoch {saved['epoch'] + 1}, step "
            f"{saved['global_step']}: loading the weights alone resets the counters and the optimizer, pass ckpt_path "
            "to trainer.fit"
        )
    momentum = saved["optimizer_states"][0]["state"]
    if set(start["momentum"]) != set(momentum) or not all(
        torch.equal(start["momentum"][k], v["momentum_buffer"]) for k, v in momentum.items()
    ):
        return "started the optimizer's momentum afresh: pass ckpt_path to trainer.fit, which restores it too"
    return None


def _epochs_problem(case: tuple, ran: int) -> str | None:
    """What is wrong with the number of epochs the resumed fit of ``case`` ran, or None."""
    done, more, patience, _, _ = case
    due = min(more, patience - done + 1)  # early stopping waited done - 1 epochs already
    if ran == more > due:
        return (
            f"started early stopping over: restored from the checkpoint, it ends the fit with epoch {done + due}, "
            f"not {done + ran}: pass callbacks=callbacks to the Trainer, fit(ckpt_path=...) then restores their state"
        )
    if ran != due:
        return (
            f"ended with epoch {done + ran}, expected {done + due} (the checkpoint ends with epoch {done}): "
            "max_epochs counts all epochs, pass it unchanged"
        )
    return None


def _resume_problem(case: tuple, got: Any, given: tuple) -> str | None:
    """What is wrong with a 2.7 answer's resumed fit, or None."""
    model, _, ckpt_path, _, _ = given
    saves = Path(ckpt_path).parent
    if not model.starts:
        return "trained nothing: call trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)"
    saved = torch.load(saves.parent / _SAVED, map_location="cpu", weights_only=False)
    problem = _start_problem(model.starts[0], saved) or _epochs_problem(case, len(model.epochs))
    if problem:
        return problem
    stray = sorted(str(p.relative_to(saves.parent)) for p in saves.parent.rglob("*.ckpt") if p.parent != saves)
    if stray:
        return (
            f"wrote checkpoints to {stray[0]} in the working directory: give the Trainer callbacks=callbacks (their "
            "ModelCheckpoint writes to the checkpoint's folder), no checkpoint callback of your own"
        )
    if torch.load(ckpt_path, map_location="cpu", weights_only=False)["epoch"] != saved["epoch"] + len(model.epochs):
        return (
            "wrote no checkpoint of the resumed epochs: pass callbacks=callbacks to the Trainer (their ModelCheckpoint "
            "continues in the checkpoint's folder)"
        )
    return _not_the_trainer(got, model)


#: ``resume(model, datamodule, ckpt_path, max_epochs, callbacks)``: continues a saved training (epoch, step, weights,
#: optimizer state and the callbacks' state) until ``max_epochs`` epochs in all, with ``callbacks``, and returns the
#: Trainer: once where early stopping (its wait count restored) stops before ``max_epochs``, once where it does not
resumed_training = register("2.7")(
    FunctionCheck(
        "2.7",
        answer="resume",
        fixed=[(1, 2, 4, 3, 5), (2, 3, 2, 4, 15)],
        draw=lambda rng: (1, rng.randint(1, 2), rng.randint(4, 5), rng.randint(3, 5), rng.randint(20, 99)),
        draws=1,
        arguments=_saved_training,
        around=_resume_in_its_folder,
        judge=_resume_problem,
        cleanup=lambda case, made: shutil.rmtree(Path(made[2]).parent.parent, ignore_errors=True),
        show=lambda case: (
            f"<model>, <datamodule>, <last.ckpt of epoch {case[0]}>, max_epochs={case[0] + case[1]}, "
            f"[EarlyStopping(patience={case[2]}), ModelCheckpoint]"
        ),
        forbid=("helpers.training:train",),
        hint="trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, ...); trainer.fit(..., ckpt_path=...)",
        passed="training continues from the checkpoint's epoch, step, weights, optimizer and callbacks ({n} saves)",
    )
)


def _log_runs(client, experiment_id: str, finals: list[float | None], statuses: list[str]) -> list[str]:
    """Create one run per final val_loss (None: no val_loss), each a decreasing history; return their ids."""
    from mlflow.entities import Metric

    ids = []
    for final, status in zip(finals, statuses):
        run_id = client.create_run(experiment_id).info.run_id
        if final is not None:
            history = [final + 0.3, final + 0.1, final]
            client.log_batch(run_id, metrics=[Metric("val_loss", v, 0, step) for step, v in enumerate(history)])
        else:
            client.log_batch(run_id, metrics=[Metric("train_loss", 0.01, 0, 0)])
        client.set_terminated(run_id, status)
        ids.append(run_id)
    return ids


_FIXED_RUNS = (  # neither the first nor the latest run is the answer; a FAILED run is lower, so is one elsewhere
    ((0.61, "FINISHED"), (0.12, "FAILED"), (0.34, "FINISHED"), (None, "FINISHED"), (1.27, "FINISHED")),
    0.06,
)


def _draw_experiment(rng: random.Random) -> tuple[tuple[tuple[float | None, str], ...], float]:
    """``(runs, elsewhere)``: 3 to 7 runs of ``(final val_loss or None, status)`` with distinct losses, the lowest
    one FAILED or KILLED, at least one finished with a val_loss; and a lower val_loss in another experiment."""
    losses = sorted(rng.sample(range(100, 1500), rng.randint(3, 7)))
    runs = [(losses[0] / 1000, rng.choice(["FAILED", "KILLED"]))]
    runs += [(loss / 1000, rng.choice(["FINISHED", "FINISHED", "FAILED"])) for loss in losses[1:]]
    runs[1] = (runs[1][0], "FINISHED")
    runs += [(None, "FINISHED")] * rng.randint(0, 1)
    rng.shuffle(runs)
    return tuple(runs), losses[0] / 2000


def _experiment_of(case: tuple) -> tuple[str, str]:
    """The case's runs written to a new experiment of the check's private store (and its decoy to another one):
    ``(experiment name, tracking URI)``, the answer's call."""
    from mlflow.tracking import MlflowClient

    runs, elsewhere = case
    uri = _tracking_store()
    client = MlflowClient(uri)
    experiment, experiment_id = _new_experiment(client, "check-2.8")
    _log_runs(client, experiment_id, [loss for loss, _ in runs], [status for _, status in runs])
    _log_runs(client, _new_experiment(client, "check-2.8-other")[1], [elsewhere], ["FINISHED"])
    return experiment, uri


def _best_run_problem(case: tuple, got: object, given: tuple[str, str]) -> str | None:
    """What is wrong with the run id the answer returned for the experiment ``given`` names, or None."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(given[1])
    experiment_id = client.get_experiment_by_name(given[0]).experiment_id
    finished = [r for r in client.search_runs([experiment_id]) if r.info.status == "FINISHED"]
    best = min((r for r in finished if "val_loss" in r.data.metrics), key=lambda r: r.data.metrics["val_loss"])
    if got == best.info.run_id:
        return None
    if not isinstance(got, str):
        return f"returned a {type(got).__name__}: return the run's id, a str (run.info.run_id)"
    try:
        run = client.get_run(got)
    except MlflowException:
        return f"returned {got!r}, no run of this store: return the run_id of a run the search found"
    if run.info.experiment_id != experiment_id:
        return "returned a run of another experiment: search only the experiment given"
    if run.info.status != "FINISHED":
        return f"returned a run that ended {run.info.status}: keep only finished runs (attributes.status = 'FINISHED')"
    return (
        f"returned the run with val_loss {run.data.metrics.get('val_loss')}, expected the lowest "
        f"({best.data.metrics['val_loss']}): order by metrics.val_loss ASC"
    )


@contextmanager
def _on_an_empty_store(_case: tuple = (), _given: Any = None) -> Iterator[None]:
    """MLflow pointed at an empty store of a temporary folder (removed afterwards) while the answer runs: an answer
    must use the tracking_uri it is given."""
    with (
        tempfile.TemporaryDirectory(prefix="course-check-2.8-") as folder,
        _isolated_mlflow(f"sqlite:///{folder}/empty.db"),
    ):
        yield


#: Stretch, ``best_run(experiment, tracking_uri)``: the id of the finished run with the lowest val_loss, in an
#: experiment the check writes to its private MLflow store with decoys (a lower FAILED or KILLED run, a run without
#: val_loss, a lower one in another experiment)
best_run_check = register("2.8")(
    FunctionCheck(
        "2.8",
        answer="best_run",
        fixed=[_FIXED_RUNS],
        draw=_draw_experiment,
        draws=2,
        arguments=_experiment_of,
        around=_on_an_empty_store,
        judge=_best_run_problem,
        show=lambda case: f"<experiment of {len(case[0])} runs>, <the check's tracking URI>",
        hint=(
            "search the experiment's finished runs in the store at tracking_uri, ordered by metrics.val_loss ASC, "
            "and return the first one's run_id"
        ),
        passed="the finished run with the lowest val_loss, found with MLflow's search, in {n} experiments",
    )
)
