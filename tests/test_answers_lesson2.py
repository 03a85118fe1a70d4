"""Answer corpus for lesson 2: right answers written differently pass, lazy, hard-coded and subtly wrong ones fail.

Each answer is run against its check directly (``helpers.course.checks._run``), with only the namespace the check needs.
"""

from __future__ import annotations

import math

import mlflow
import numpy as np
import pandas as pd
import pytest
import pytorch_lightning as pl
import torch
from mlflow.tracking import MlflowClient
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.loggers import MLFlowLogger
from torch.nn import functional as F

from helpers.course.checks import PASSED, _run
from helpers.datamodule import PetastormDataModule
from helpers.loaders import PetastormBatches, steps_per_epoch
from helpers.model import LitClassificationModel
from helpers.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def verdict(exercise: str, answer) -> str:
    status, message = _run(exercise, answer)
    assert status in (PASSED, "failed"), message
    return status


# --- 2.1 epoch_steps -------------------------------------------------------------------------------------------


def steps_ceil(rows, batch_size, world_size):
    return max(1, math.ceil(rows / (batch_size * world_size)))


def steps_numpy(rows, batch_size, world_size):
    return np.int64(max(1, -(-rows // (batch_size * world_size))))


def steps_float(rows, batch_size, world_size):
    return float(max(1, np.ceil(rows / batch_size / world_size)))


def steps_delegating(rows, batch_size, world_size):
    return steps_per_epoch(rows, batch_size, world_size)


def steps_floor(rows, batch_size, world_size):
    return max(1, rows // (batch_size * world_size))


def steps_ignoring_world(rows, batch_size, world_size):
    return max(1, math.ceil(rows / batch_size))


def steps_hard_coded(rows, batch_size, world_size):
    return {(1438, 64, 1): 23, (1438, 64, 2): 12, (3670, 64, 8): 8, (100, 10, 1): 10}.get(
        (rows, batch_size, world_size), 1
    )


@pytest.mark.parametrize("answer", [steps_ceil, steps_numpy, steps_float])
def test_2_1_right(answer):
    assert verdict("2.1", answer) == "passed"


@pytest.mark.parametrize("answer", [steps_delegating, steps_floor, steps_ignoring_world, steps_hard_coded])
def test_2_1_wrong(answer):
    assert verdict("2.1", answer) == "failed"


# --- 2.2 make_optimizer ----------------------------------------------------------------------------------------


def optimizer_filter(model, learning_rate, momentum):
    return torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=learning_rate, momentum=momentum)


def optimizer_named_groups(model, learning_rate, momentum):
    weights = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("bias")]
    biases = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("bias")]
    groups = [{"params": group} for group in (weights, biases) if group]
    return torch.optim.SGD(groups, lr=np.float64(learning_rate), momentum=momentum)


def optimizer_every_parameter(model, learning_rate, momentum):
    return torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)


def optimizer_hard_coded(model, learning_rate, momentum):
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.03, momentum=0.8)


def optimizer_head_only(model, learning_rate, momentum):
    network = getattr(model, "network", model)
    return torch.optim.SGD(network.classifier.parameters(), lr=learning_rate, momentum=momentum)


def optimizer_adam(model, learning_rate, momentum):
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=learning_rate)


def optimizer_unfreezes_everything(model, learning_rate, momentum):
    model.requires_grad_(True)  # every parameter then "requires gradients"
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=learning_rate, momentum=momentum)


def optimizer_delegating(model, learning_rate, momentum):
    model.learning_rate = learning_rate
    return LitClassificationModel.configure_optimizers(model)


@pytest.mark.parametrize("answer", [optimizer_filter, optimizer_named_groups])
def test_2_2_right(answer):
    assert verdict("2.2", answer) == "passed"


@pytest.mark.parametrize(
    "answer",
    [
        optimizer_every_parameter,
        optimizer_hard_coded,
        optimizer_head_only,
        optimizer_adam,
        optimizer_unfreezes_everything,
        optimizer_delegating,
    ],
)
def test_2_2_wrong(answer):
    assert verdict("2.2", answer) == "failed"


def test_2_2_an_answer_that_unfreezes_the_model_is_judged_on_the_model_as_given():
    status, message = _run("2.2", {"make_optimizer": optimizer_unfreezes_everything})
    assert status == "failed" and message.endswith(
        "changed which parameters require gradients: leave the model as it is, frozen parameters stay frozen"
    ), message


def _frozen_part(network) -> str:
    frozen = [name for name, parameter in network.named_parameters() if not parameter.requires_grad]
    if not frozen:
        return "nothing"
    return "head" if all(name.startswith("classifier.") for name in frozen) else "backbone"


def test_2_2_meets_every_kind_of_frozen_network():
    from helpers.course.checks.lesson2 import optimizer

    met = {(isinstance(network, pl.LightningModule), _frozen_part(network)) for network, _, _ in optimizer.cases()}
    assert met == {(False, "nothing"), (False, "head"), (False, "backbone"), (True, "backbone")}, met


# --- 2.3 MyModel's steps ---------------------------------------------------------------------------------------


class ModelLogging(LitClassificationModel):
    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["features"]), batch["label_index"])
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        logits = self(batch["features"])
        loss = F.cross_entropy(logits, batch["label_index"])
        accuracy = (logits.argmax(dim=1) == batch["label_index"]).float().mean()
        self.log_dict({"val_loss": loss, "val_acc": accuracy}, sync_dist=True)


class ModelDictLoss(LitClassificationModel):
    def training_step(self, batch, batch_idx):
        loss = torch.nn.CrossEntropyLoss()(self.forward(batch["features"]), batch["label_index"])
        self.log_dict({"train_loss": loss}, on_epoch=True)  # on_step is True in a training step by default
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        logits = self(batch["features"])
        log_probs = F.log_softmax(logits, dim=1)
        self.log("val_loss", F.nll_loss(log_probs, batch["label_index"]), on_epoch=True)
        correct = torch.eq(torch.max(logits, 1).indices, batch["label_index"]).sum()
        self.log("val_acc", correct / len(batch["label_index"]), on_epoch=True)


class ModelInherited(LitClassificationModel):
    pass


class ModelSuper(LitClassificationModel):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        return super().validation_step(batch, batch_idx)


class ModelCorrectCount(ModelLogging):
    def validation_step(self, batch, batch_idx):
        logits = self(batch["features"])
        self.log("val_loss", F.cross_entropy(logits, batch["label_index"]))
        self.log("val_acc", (logits.argmax(dim=1) == batch["label_index"]).sum().float())


class ModelConstantLoss(ModelLogging):
    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["features"]), batch["label_index"])
        self.log("train_loss", loss)
        return loss * 0 + 1.0986


class ModelTrainLossPerEpochOnly(ModelLogging):
    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["features"]), batch["label_index"])
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss


class ModelTrainLossPerStepOnly(ModelLogging):
    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch["features"]), batch["label_index"])
        self.log("train_loss", loss)
        return loss


class ModelDetachedLoss(ModelLogging):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).detach()  # the value, with no gradient to follow


class ModelTrainLossAsVal(ModelLogging):
    def validation_step(self, batch, batch_idx):
        logits = self(batch["features"])
        self.log("val_loss", F.cross_entropy(logits, batch["label_index"]) * 0.5)
        self.log("val_acc", (logits.argmax(dim=1) == batch["label_index"]).float().mean())


@pytest.mark.slow
@pytest.mark.parametrize("answer", [ModelLogging, ModelDictLoss])
def test_2_3_right(answer):
    assert verdict("2.3", {"MyModel": answer}) == "passed"


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        ModelInherited,
        ModelSuper,
        ModelCorrectCount,
        ModelConstantLoss,
        ModelTrainLossPerEpochOnly,
        ModelTrainLossPerStepOnly,
        ModelTrainLossAsVal,
        ModelDetachedLoss,
    ],
)
def test_2_3_wrong(answer):
    assert verdict("2.3", {"MyModel": answer}) == "failed"


# --- 2.4 MyDataModule ------------------------------------------------------------------------------------------


class DataModuleBatches(PetastormDataModule):
    def train_dataloader(self):
        return PetastormBatches(
            self.train_converter,
            self.batch_size,
            self.image_size,
            cur_shard=self.device_id,
            shard_count=self.device_count,
            steps_per_epoch=self.steps_per_epoch,
            shuffle=True,
        )

    def val_dataloader(self):
        return PetastormBatches(
            self.val_converter,
            self.batch_size,
            self.image_size,
            cur_shard=self.device_id,
            shard_count=self.device_count,
        )


class DataModuleKeywords(PetastormDataModule):
    def _loader(self, converter, **extra):
        shard = {"cur_shard": self.device_id, "shard_count": self.device_count}
        return PetastormBatches(
            converter=converter, batch_size=self.batch_size, image_size=self.image_size, **shard, **extra
        )

    def train_dataloader(self):
        return self._loader(self.train_converter, steps_per_epoch=self.steps_per_epoch)

    def val_dataloader(self):
        return self._loader(self.val_converter)


class DataModuleInherited(PetastormDataModule):
    pass


class DataModuleSuper(PetastormDataModule):
    def train_dataloader(self):
        return super().train_dataloader()

    def val_dataloader(self):
        return super().val_dataloader()


class DataModuleUnshardedTrain(DataModuleBatches):
    def train_dataloader(self):
        return PetastormBatches(
            self.train_converter, self.batch_size, self.image_size, steps_per_epoch=self.steps_per_epoch, shuffle=True
        )


class DataModuleHardCoded(DataModuleBatches):
    def train_dataloader(self):
        return PetastormBatches(
            self.train_converter,
            64,
            32,
            cur_shard=self.device_id,
            shard_count=self.device_count,
            steps_per_epoch=self.steps_per_epoch,
        )


class DataModuleOnePassTraining(DataModuleBatches):
    def train_dataloader(self):  # steps_per_epoch left out: one pass of the shard, however many batches that is
        return PetastormBatches(
            self.train_converter,
            self.batch_size,
            self.image_size,
            cur_shard=self.device_id,
            shard_count=self.device_count,
        )


class DataModuleUnshardedValidation(DataModuleBatches):
    def val_dataloader(self):
        return PetastormBatches(self.val_converter, self.batch_size, self.image_size)


class DataModuleOneValBatch(DataModuleBatches):
    def val_dataloader(self):
        return [
            next(
                iter(
                    PetastormBatches(
                        self.val_converter,
                        self.batch_size,
                        self.image_size,
                        cur_shard=self.device_id,
                        shard_count=self.device_count,
                    )
                )
            )
        ]


@pytest.fixture(scope="module")
def converters(spark, digits_dir, session_work_dir):
    from helpers.loaders import prepare_data

    prepared = prepare_data(
        digits_dir, num_devices=1, spark=spark, table_path=session_work_dir / "tables" / "lesson2-answers"
    )
    return {"train_converter": prepared.train_converter, "val_converter": prepared.val_converter}


@pytest.mark.slow
@pytest.mark.parametrize("answer", [DataModuleBatches, DataModuleKeywords])
def test_2_4_right(answer, converters):
    assert verdict("2.4", {**converters, "MyDataModule": answer}) == "passed"


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        DataModuleInherited,
        DataModuleSuper,
        DataModuleUnshardedTrain,
        DataModuleHardCoded,
        DataModuleOneValBatch,
        DataModuleOnePassTraining,
        DataModuleUnshardedValidation,
    ],
)
def test_2_4_wrong(answer, converters):
    assert verdict("2.4", {**converters, "MyDataModule": answer}) == "failed"


# --- 2.5 make_callbacks ----------------------------------------------------------------------------------------


def callbacks_list(patience, min_delta, checkpoint_dir):
    return [
        EarlyStopping(monitor="val_loss", mode="min", min_delta=min_delta, patience=patience),
        ModelCheckpoint(dirpath=checkpoint_dir, monitor="val_loss", mode="min", save_last=True),
    ]


def callbacks_tuple(patience, min_delta, checkpoint_dir):
    save = ModelCheckpoint(str(checkpoint_dir), "best-{epoch}", "val_loss", save_last=True, save_top_k=2)
    return (save, EarlyStopping("val_loss", np.float64(min_delta), int(patience)), pl.callbacks.LearningRateMonitor())


def callbacks_renamed(wait, delta, folder):
    return [ModelCheckpoint(folder, monitor="val_loss", save_last=True), EarlyStopping("val_loss", delta, wait)]


def callbacks_course_s_own(patience, min_delta, checkpoint_dir):
    from helpers.phases import RankClock
    from helpers.training import _Callbacks

    made = _Callbacks.create(checkpoint_dir, {"patience": patience, "min_delta": min_delta}, False, RankClock())
    return [made.stopper, made.checkpoint]


def callbacks_hard_coded(patience, min_delta, checkpoint_dir):
    return callbacks_list(3, 0.01, checkpoint_dir)


def callbacks_no_last(patience, min_delta, checkpoint_dir):
    return [
        EarlyStopping(monitor="val_loss", min_delta=min_delta, patience=patience),
        ModelCheckpoint(dirpath=checkpoint_dir, monitor="val_loss"),
    ]


def callbacks_max_mode(patience, min_delta, checkpoint_dir):
    return [
        EarlyStopping(monitor="val_loss", mode="max", min_delta=min_delta, patience=patience),
        ModelCheckpoint(dirpath=checkpoint_dir, monitor="val_loss", save_last=True),
    ]


def callbacks_fixed_folder(patience, min_delta, checkpoint_dir):
    return callbacks_list(patience, min_delta, "checkpoints")


@pytest.mark.parametrize("answer", [callbacks_list, callbacks_tuple, callbacks_renamed])
def test_2_5_right(answer):
    assert verdict("2.5", answer) == "passed"


@pytest.mark.parametrize(
    "answer", [callbacks_hard_coded, callbacks_no_last, callbacks_max_mode, callbacks_fixed_folder]
)
def test_2_5_wrong(answer):
    assert verdict("2.5", answer) == "failed"


def test_2_5_the_course_s_own_callbacks_are_not_an_answer():
    status, message = _run("2.5", callbacks_course_s_own)
    assert status == "failed" and "write it yourself" in message, message


# --- 2.6 fit_tracked -------------------------------------------------------------------------------------------

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)


def fit_autolog(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    if trainer.global_rank != 0:
        trainer.fit(model, datamodule=datamodule)
        return trainer
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    mlflow.pytorch.autolog(log_models=False, checkpoint=False, silent=True)
    with mlflow.start_run():
        trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_logger(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    logger = MLFlowLogger(experiment_name=experiment, tracking_uri=tracking_uri)  # Lightning logs on rank 0 only
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=logger, log_every_n_steps=1, **QUIET)
    trainer.fit(model, datamodule)
    return trainer


def fit_autolog_implicit_run(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    if trainer.is_global_zero:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        mlflow.pytorch.autolog(log_models=False, silent=True)  # opens and ends a run around fit
    trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_ignoring_tracking_uri(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    if trainer.is_global_zero:
        mlflow.set_experiment(experiment)  # in whatever store MLflow points at
        mlflow.pytorch.autolog(log_models=False, silent=True)
    trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_returning_the_model(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    fit_autolog(model, datamodule, callbacks, max_epochs, experiment, tracking_uri)
    return model


def fit_twice(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    fit_autolog(model, datamodule, callbacks, max_epochs, experiment, tracking_uri)
    return fit_autolog(model, datamodule, callbacks, max_epochs + 2, experiment, tracking_uri)


def fit_every_rank(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    mlflow.pytorch.autolog(log_models=False, silent=True)
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_no_callbacks(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    return fit_autolog(model, datamodule, [], max_epochs, experiment, tracking_uri)


def fit_untracked(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_run_left_open(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    if trainer.global_rank == 0:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        mlflow.pytorch.autolog(log_models=False, silent=True)
        mlflow.start_run()
    trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_default_experiment(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    if trainer.global_rank == 0:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.pytorch.autolog(log_models=False, silent=True)
    trainer.fit(model, datamodule=datamodule)
    return trainer


def fit_hard_coded_epochs(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    return fit_autolog(model, datamodule, callbacks, 8, experiment, tracking_uri)


def fit_no_return(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    fit_autolog(model, datamodule, callbacks, max_epochs, experiment, tracking_uri)


def fit_delegating(model, datamodule, callbacks, max_epochs, experiment, tracking_uri):
    return train(model, datamodule, max_epochs=max_epochs, mlflow_experiment=experiment, tracking_uri=tracking_uri)


@pytest.mark.slow
@pytest.mark.parametrize("answer", [fit_autolog, fit_logger, fit_autolog_implicit_run])
def test_2_6_right(answer):
    assert verdict("2.6", answer) == "passed"


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        fit_every_rank,
        fit_no_callbacks,
        fit_untracked,
        fit_run_left_open,
        fit_default_experiment,
        fit_hard_coded_epochs,
        fit_delegating,
        fit_ignoring_tracking_uri,
        fit_returning_the_model,
        fit_twice,
    ],
)
def test_2_6_wrong(answer):
    assert verdict("2.6", answer) == "failed"


@pytest.mark.slow
def test_2_6_hints_name_what_is_missing():
    assert _run("2.6", fit_no_callbacks)[1] == (
        "fit_tracked(<model>, <datamodule>, [EarlyStopping(patience=2), ModelCheckpoint], max_epochs=5, "
        "<experiment>, <tracking_uri>) fitted without the callbacks given: pass callbacks=callbacks to the Trainer"
    )
    assert _run("2.6", fit_every_rank)[1].endswith(
        "<tracking_uri>; on global rank 1) recorded an MLflow run on global rank 1: track on rank 0 only "
        "(if trainer.global_rank == 0), or every process opens its own run"
    )
    assert "recorded no MLflow run at tracking_uri" in _run("2.6", fit_ignoring_tracking_uri)[1]


@pytest.mark.slow
def test_2_6_leaves_mlflow_as_it_was():
    def state():
        return mlflow.tracking._tracking_service.utils._tracking_uri, mlflow.tracking.fluent._active_experiment_id

    before = state()
    verdict("2.6", fit_every_rank)
    assert state() == before
    assert mlflow.active_run() is None


# --- 2.7 resume ------------------------------------------------------------------------------------------------


def resume_fit(model, datamodule, ckpt_path, max_epochs, callbacks):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def resume_last(model, datamodule, ckpt_path, max_epochs, callbacks):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=[*callbacks], **QUIET)  # default logger
    trainer.fit(
        model,
        train_dataloaders=datamodule.train_dataloader(),
        val_dataloaders=datamodule.val_dataloader(),
        ckpt_path="last",  # the ModelCheckpoint's latest last.ckpt: ckpt_path itself here
    )
    return trainer


def resume_positional(model, datamodule, ckpt_path, max_epochs, callbacks):
    settings = {"max_epochs": max_epochs, "callbacks": callbacks, "logger": False, **QUIET}
    trainer = pl.Trainer(**settings)
    trainer.fit(model, datamodule, None, None, ckpt_path)
    return trainer


def resume_without_callbacks(model, datamodule, ckpt_path, max_epochs, callbacks):
    trainer = pl.Trainer(max_epochs=max_epochs, logger=False, enable_checkpointing=False, **QUIET)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def resume_default_checkpoints(model, datamodule, ckpt_path, max_epochs, callbacks):
    trainer = pl.Trainer(max_epochs=max_epochs, logger=False, **QUIET)  # Lightning's own ModelCheckpoint
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def resume_early_stopping_only(model, datamodule, ckpt_path, max_epochs, callbacks):
    stops = [c for c in callbacks if isinstance(c, EarlyStopping)]
    return resume_fit(model, datamodule, ckpt_path, max_epochs, stops)


def resume_checkpoint_only(model, datamodule, ckpt_path, max_epochs, callbacks):
    saves = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
    return resume_fit(model, datamodule, ckpt_path, max_epochs, saves)


def resume_own_callbacks(model, datamodule, ckpt_path, max_epochs, callbacks):
    own = [
        EarlyStopping(monitor="val_loss", patience=3),
        ModelCheckpoint(dirpath="checkpoints", monitor="val_loss", save_last=True),
    ]
    return resume_fit(model, datamodule, ckpt_path, max_epochs, own)


def resume_extra_checkpoints(model, datamodule, ckpt_path, max_epochs, callbacks):
    extra = ModelCheckpoint(dirpath="checkpoints", monitor="val_loss")
    return resume_fit(model, datamodule, ckpt_path, max_epochs, [*callbacks, extra])


def resume_checkpointing_off(model, datamodule, ckpt_path, max_epochs, callbacks):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, enable_checkpointing=False, **QUIET)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def resume_from_scratch(model, datamodule, ckpt_path, max_epochs, callbacks):
    trainer = pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, **QUIET)
    trainer.fit(model, datamodule)
    return trainer


def resume_weights_only(model, datamodule, ckpt_path, max_epochs, callbacks):
    saved = torch.load(ckpt_path, weights_only=False)
    model.load_state_dict(saved["state_dict"])
    return resume_fit(model, datamodule, None, max_epochs - saved["epoch"] - 1, callbacks)


def resume_more_epochs(model, datamodule, ckpt_path, max_epochs, callbacks):
    saved = torch.load(ckpt_path, weights_only=False)
    return resume_fit(model, datamodule, ckpt_path, max_epochs + saved["epoch"] + 1, callbacks)


def resume_hard_coded(model, datamodule, ckpt_path, max_epochs, callbacks):
    return resume_fit(model, datamodule, ckpt_path, 4, callbacks)


def resume_returns_nothing(model, datamodule, ckpt_path, max_epochs, callbacks):
    resume_fit(model, datamodule, ckpt_path, max_epochs, callbacks)


def resume_delegating(model, datamodule, ckpt_path, max_epochs, callbacks):
    return train(model, datamodule, max_epochs=max_epochs, ckpt_restore=ckpt_path, early_stopping=False)


@pytest.mark.slow
@pytest.mark.parametrize("answer", [resume_fit, resume_last, resume_positional])
def test_2_7_right(answer):
    assert verdict("2.7", answer) == "passed"


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        resume_without_callbacks,
        resume_default_checkpoints,
        resume_early_stopping_only,
        resume_checkpoint_only,
        resume_own_callbacks,
        resume_extra_checkpoints,
        resume_checkpointing_off,
        resume_from_scratch,
        resume_weights_only,
        resume_more_epochs,
        resume_hard_coded,
        resume_delegating,
    ],
)
def test_2_7_wrong(answer):
    assert verdict("2.7", answer) == "failed"


# --- 2.8 best_run (stretch) ------------------------------------------------------------------------------------


def best_search(experiment, tracking_uri):
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(
        experiment_names=[experiment],
        filter_string="attributes.status = 'FINISHED'",
        order_by=["metrics.val_loss ASC"],
        max_results=1,
    )
    return runs["run_id"].iloc[0]


def best_client(experiment, tracking_uri):
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = [
        r
        for r in client.search_runs([found.experiment_id])
        if r.info.status == "FINISHED" and "val_loss" in r.data.metrics
    ]
    return min(runs, key=lambda r: r.data.metrics["val_loss"]).info.run_id


def best_in_pandas(experiment, tracking_uri):
    runs = MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name(experiment).experiment_id]
    )
    table = pd.DataFrame(
        [(r.info.run_id, r.info.status, r.data.metrics.get("val_loss")) for r in runs],
        columns=["run_id", "status", "val_loss"],
    )
    finished = table[table["status"] == "FINISHED"].dropna()
    return finished.loc[finished["val_loss"].idxmin(), "run_id"]


def best_default_store(experiment, tracking_uri):
    runs = mlflow.search_runs(  # the tracking URI it was given left unused: the notebook's store is searched
        experiment_names=[experiment], filter_string="attributes.status = 'FINISHED'", order_by=["metrics.val_loss"]
    )
    return runs["run_id"].iloc[0]


def best_run_object(experiment, tracking_uri):
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs(
        [found.experiment_id], "attributes.status = 'FINISHED'", order_by=["metrics.val_loss ASC"], max_results=1
    )
    return runs[0]  # the Run, not its id


def best_any_status(experiment, tracking_uri):
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[experiment], order_by=["metrics.val_loss ASC"])
    return runs["run_id"].iloc[0]


def best_descending(experiment, tracking_uri):
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(
        experiment_names=[experiment],
        filter_string="attributes.status = 'FINISHED'",
        order_by=["metrics.val_loss DESC"],
    )
    return runs["run_id"].iloc[0]


def best_every_experiment(experiment, tracking_uri):
    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(
        search_all_experiments=True, filter_string="attributes.status = 'FINISHED'", order_by=["metrics.val_loss ASC"]
    )
    return runs["run_id"].iloc[0]


def best_latest(experiment, tracking_uri):
    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.search_runs(experiment_names=[experiment])["run_id"].iloc[0]


def best_hard_coded(experiment, tracking_uri):
    return "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("answer", [best_search, best_client, best_in_pandas])
def test_2_8_right(answer):
    assert verdict("2.8", answer) == "passed"


@pytest.mark.parametrize(
    "answer",
    [
        best_any_status,
        best_descending,
        best_every_experiment,
        best_latest,
        best_hard_coded,
        best_default_store,
        best_run_object,
    ],
)
def test_2_8_wrong(answer):
    assert verdict("2.8", answer) == "failed"


# --- not attempted ---------------------------------------------------------------------------------------------


def stub(*args): ...


class StubModel(LitClassificationModel):
    def training_step(self, batch, batch_idx): ...

    def validation_step(self, batch, batch_idx): ...


class StubDataModule(PetastormDataModule):
    def train_dataloader(self): ...

    def val_dataloader(self): ...


@pytest.mark.parametrize(
    "exercise, answer",
    [
        ("2.1", stub),
        ("2.2", stub),
        ("2.3", {"MyModel": StubModel}),
        ("2.4", {"MyDataModule": StubDataModule, "train_converter": None, "val_converter": None}),
        ("2.5", stub),
        ("2.6", stub),
        ("2.7", stub),
        ("2.8", stub),
        ("2.3", {"MyModel": ...}),
        ("2.6", fit_no_return),  # fitted, but the Trainer is not returned yet
        ("2.7", resume_returns_nothing),
    ],
)
def test_stubs_are_not_attempted(exercise, answer):
    assert _run(exercise, answer)[0] == "not attempted"
