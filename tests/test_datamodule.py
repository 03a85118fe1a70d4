"""The Petastorm DataModule: shards per device, fixed steps per epoch, and Lightning training through it."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl

from helpers import CourseInputError
from helpers.datamodule import PetastormDataModule
from helpers.model import LitClassificationModel


def test_an_epoch_is_one_pass_whatever_the_device_count(digits_data):
    rows = len(digits_data.train_converter)
    one = PetastormDataModule(digits_data.train_converter, digits_data.val_converter, batch_size=64)
    two = [
        PetastormDataModule(
            digits_data.train_converter, digits_data.val_converter, batch_size=64, device_id=rank, device_count=2
        )
        for rank in range(2)
    ]
    assert one.steps_per_epoch * 64 >= rows > (one.steps_per_epoch - 1) * 64
    assert all(dm.steps_per_epoch == -(-rows // 128) for dm in two)
    seen = 0
    for dm in two:
        seen += sum(len(b["label_index"]) for b in dm.train_dataloader())
        dm.teardown("fit")
    assert rows <= seen < rows + 2 * 64  # together the two devices cover the data once per epoch


@pytest.mark.parametrize(
    ("device_id", "device_count", "message"), [(2, 2, "below device_count=2"), (-1, 2, "at least 0")]
)
def test_a_device_outside_the_job_is_refused(digits_data, device_id, device_count, message):
    with pytest.raises(CourseInputError, match=message):
        PetastormDataModule(
            digits_data.train_converter, digits_data.val_converter, device_id=device_id, device_count=device_count
        )


def test_validation_shards_cover_the_validation_set(digits_data):
    ids = []
    for rank in range(2):
        dm = PetastormDataModule(
            digits_data.train_converter, digits_data.val_converter, batch_size=50, device_id=rank, device_count=2
        )
        ids += [i for b in dm.val_dataloader() for i in b["row_id"].tolist()]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == len(digits_data.val_converter)


@pytest.mark.slow
def test_lightning_learns_from_petastorm_batches_over_several_epochs(digits_data):
    dm = PetastormDataModule(digits_data.train_converter, digits_data.val_converter, batch_size=64, image_size=16)
    model = LitClassificationModel(class_count=len(digits_data.class_names), learning_rate=0.05, image_size=16)
    trainer = pl.Trainer(
        max_epochs=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    metrics = trainer.callback_metrics
    assert trainer.current_epoch == 4  # no "resetting a reader" error between epochs
    assert float(metrics["val_acc"]) > 0.7
