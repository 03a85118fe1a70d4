"""Lesson 2 helpers: the network, the plain loop, and ``train`` with early stopping and checkpoint resume.

Real Lightning and real MLflow (a SQLite store in ``tmp_path``) on scikit-learn's digits.
"""

from __future__ import annotations

import importlib.util
import re

import mlflow
import pytest
import pytorch_lightning as pl
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from helpers import CourseInputError
from helpers.loaders import steps_per_epoch
from helpers.model import LitClassificationModel, make_network
from helpers.tracking import metric_history
from helpers.training import train, train_plain

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.usefixtures("one_torch_thread"),
]

IMAGE_SIZE = 16
CLASS_COUNT = 10


def digits_tensors(image_size: int = IMAGE_SIZE) -> tuple[torch.Tensor, ...]:
    """Digits as (train_x, val_x, train_y, val_y): float32 N x 3 x size x size in [0, 1], int64 labels."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(image_size, image_size), mode="bilinear").repeat(1, 3, 1, 1)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    return tuple(train_test_split(images, labels, test_size=0.2, random_state=0, stratify=labels))


class DigitsDataset(Dataset):
    """Dict samples like the course's Petastorm loaders yield."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"features": self.features[index], "label_index": self.labels[index]}


class DigitsDataModule(pl.LightningDataModule):
    """An in-memory stand-in for the Petastorm DataModule: same dict batches, same ``batch_size`` attribute."""

    def __init__(self, batch_size: int = 64, image_size: int = IMAGE_SIZE) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.train_x, self.val_x, self.train_y, self.val_y = digits_tensors(image_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(DigitsDataset(self.train_x, self.train_y), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(DigitsDataset(self.val_x, self.val_y), batch_size=self.batch_size)


@pytest.fixture(autouse=True)
def seeded(work_dir):
    """Every test writes under its own work directory and starts from the same seed."""
    pl.seed_everything(0, verbose=False)


@pytest.fixture(scope="module")
def digits() -> DigitsDataModule:
    return DigitsDataModule()


# ----------------------------------------------------------------------------------------------- fast checks


@pytest.mark.parametrize(
    ("rows", "batch_size", "world_size", "expected"),
    [(1000, 64, 1, 16), (1000, 64, 2, 8), (1024, 64, 4, 4), (64, 64, 1, 1), (65, 64, 1, 2), (10, 64, 8, 1)],
)
def test_steps_per_epoch_covers_the_data_once(rows, batch_size, world_size, expected):
    steps = steps_per_epoch(rows, batch_size, world_size)
    assert steps == expected
    assert steps * batch_size * world_size >= rows


@pytest.mark.parametrize(("rows", "batch_size", "world_size"), [(0, 64, 1), (100, 0, 1), (100, 64, -2)])
def test_steps_per_epoch_rejects_non_positive_inputs(rows, batch_size, world_size):
    with pytest.raises(CourseInputError):
        steps_per_epoch(rows, batch_size, world_size)


@pytest.mark.parametrize("image_size", [8, 16, 32])
def test_small_cnn_takes_any_image_size(image_size):
    network = make_network(CLASS_COUNT, "small_cnn")
    assert network(torch.rand(4, 3, image_size, image_size)).shape == (4, CLASS_COUNT)


def test_freeze_backbone_leaves_only_the_head_trainable():
    network = make_network(CLASS_COUNT, "small_cnn", freeze_backbone=True)
    assert not any(p.requires_grad for p in network.features.parameters())
    assert all(p.requires_grad for p in network.classifier.parameters())


def test_unknown_backbone_lists_the_valid_ones():
    with pytest.raises(CourseInputError, match="small_cnn.*mobilenet_v2"):
        LitClassificationModel(CLASS_COUNT, backbone="resnet9000")


def test_pretrained_small_cnn_is_rejected():
    with pytest.raises(CourseInputError, match="pretrained"):
        make_network(CLASS_COUNT, "small_cnn", pretrained=True)


def test_mobilenet_v2_needs_torchvision_or_has_a_new_head():
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises(CourseInputError, match="install torchvision"):
            make_network(5, "mobilenet_v2")
    else:
        network = make_network(5, "mobilenet_v2", freeze_backbone=True)
        assert network(torch.rand(2, 3, 32, 32)).shape == (2, 5)
        assert not any(p.requires_grad for p in network.features.parameters())


# ----------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_plain_loop_learns_digits(digits):
    network = make_network(CLASS_COUNT, "small_cnn")
    history = train_plain(
        network, digits.train_dataloader, digits.val_dataloader(), epochs=5, learning_rate=1e-2, momentum=0.9
    )
    assert [len(values) for values in history.values()] == [5, 5, 5]
    assert history["train_loss"][-1] < history["train_loss"][0]
    assert history["val_loss"][-1] < history["val_loss"][0]
    assert history["val_acc"][-1] >= 0.9


@pytest.mark.slow
def test_train_learns_and_writes_checkpoints(digits, work_dir):
    model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
    result = train(model, digits, max_epochs=5, early_stopping=False, run_name="learns", progress_bar=False)
    assert result.epochs_run == 5
    assert result.stopped_reason == "max_epochs"
    assert [row["epoch"] for row in result.history] == [0, 1, 2, 3, 4]
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    assert result.val_acc >= 0.9
    assert result.best_val_loss <= result.last_val_loss
    assert result.best_val_loss == pytest.approx(min(row["val_loss"] for row in result.history))
    assert result.mlflow_run_id is None
    checkpoints = work_dir / "checkpoints" / "learns"
    assert result.last_checkpoint == str(checkpoints / "last.ckpt")
    assert result.best_checkpoint.startswith(str(checkpoints / "best-"))


@pytest.mark.slow
def test_stopping_threshold_and_patience_end_training_early(digits, capfd):
    model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
    result = train(model, digits, max_epochs=20, early_stopping={"stopping_threshold": 0.5}, progress_bar=False)
    assert result.stopped_reason == "stopping_threshold"
    assert result.epochs_run < 20
    assert result.last_val_loss < 0.5

    # An improvement of 100 is never reached: patience 1 stops after the second epoch; its one bar says so
    model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
    capfd.readouterr()
    result = train(model, digits, max_epochs=20, early_stopping={"min_delta": 100.0, "patience": 1})
    assert (result.stopped_reason, result.epochs_run) == ("patience", 2)
    bar = [line for line in re.split(r"[\r\n]+", capfd.readouterr().err) if line.strip()]
    assert bar and all(line.startswith("fit:") for line in bar), bar  # no bar of Lightning's, a line per batch
    assert len(bar) <= 4 and "2/20" in bar[-1] and "val_loss=" in bar[-1], bar


def test_unknown_early_stopping_key_is_rejected(digits):
    with pytest.raises(CourseInputError, match="patiense"):
        train(LitClassificationModel(CLASS_COUNT), digits, early_stopping={"patiense": 3})


# ----------------------------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def two_epochs(digits, tmp_path_factory):
    """A tracked 2-epoch training, shared by the resume tests."""
    work = tmp_path_factory.mktemp("two_epochs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_WORK_DIR", str(work))
        pl.seed_everything(0, verbose=False)
        model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
        result = train(model, digits, max_epochs=2, mlflow_experiment="resume", run_name="first", progress_bar=False)
    return work, result


@pytest.mark.slow
def test_resume_continues_the_epoch_count(digits, two_epochs, monkeypatch):
    work, first = two_epochs
    monkeypatch.setenv("COURSE_WORK_DIR", str(work))
    assert first.epochs_run == 2
    model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
    resumed = train(
        model,
        digits,
        max_epochs=4,
        ckpt_restore=first.last_checkpoint,
        mlflow_experiment="resume",
        progress_bar=False,
    )
    assert resumed.epochs_run == 4
    assert [row["epoch"] for row in resumed.history] == [2, 3]
    assert [step for step, _ in metric_history(first.mlflow_run_id, "val_loss")] == [0, 1]
    assert [step for step, _ in metric_history(resumed.mlflow_run_id, "val_loss")] == [2, 3]
    # it continued from trained weights, not from scratch
    assert resumed.history[0]["val_loss"] < first.history[0]["val_loss"]
    runs = mlflow.search_runs(experiment_names=["resume"], output_format="list")
    assert sorted(run.info.run_id for run in runs) == sorted([first.mlflow_run_id, resumed.mlflow_run_id])
    assert {run.data.params["ckpt_restore"] for run in runs} == {"None", first.last_checkpoint}


class _RatesSeen(pl.Callback):
    """The learning rate the optimizer holds right before each of its steps."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.rates.append(optimizer.param_groups[0]["lr"])


def warm_up(step: int) -> float:
    """0.01 ramped to 0.03 over 10 steps (lesson 3's warm-up for 3 processes), then held."""
    return 0.01 + 0.02 * min(step, 10) / 10


def test_a_learning_rate_schedule_sets_every_step_s_rate_and_logs_it(digits, work_dir):
    seen = _RatesSeen()
    model = LitClassificationModel(CLASS_COUNT, learning_rate=0.5, image_size=IMAGE_SIZE, lr_schedule=warm_up)
    trainer = pl.Trainer(max_epochs=1, callbacks=[seen], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_train_batches=14,
                         limit_val_batches=0)  # fmt: skip
    trainer.fit(model, digits)
    assert seen.rates == pytest.approx([warm_up(step) for step in range(14)])  # 0.5 is never used
    result = train(LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE, lr_schedule=warm_up), digits,
                   max_epochs=1, mlflow_experiment="warm-up", progress_bar=False)  # fmt: skip
    logged = metric_history(result.mlflow_run_id, "lr")
    assert [step for step, _ in logged] == list(range(steps_per_epoch(len(digits.train_y), digits.batch_size)))
    assert [rate for _, rate in logged] == pytest.approx([warm_up(step) for step, _ in logged])
    with pytest.raises(CourseInputError, match=r"^lr_schedule=0\.1: pass a function of the step, or None\.$"):
        LitClassificationModel(CLASS_COUNT, lr_schedule=0.1)


def test_missing_checkpoint_is_refused_before_any_run(digits, work_dir):
    missing = work_dir / "nowhere" / "last.ckpt"
    with pytest.raises(CourseInputError, match="nowhere"):
        train(LitClassificationModel(CLASS_COUNT), digits, ckpt_restore=missing, mlflow_experiment="refused")
    assert not (work_dir / "mlflow").exists()  # no MLflow store, so no run was created
    assert not (work_dir / "checkpoints").exists()


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused(digits, two_epochs):
    _, first = two_epochs
    other = LitClassificationModel(5, image_size=IMAGE_SIZE)
    with pytest.raises(CourseInputError, match=r"class_count=10 in the checkpoint, 5 in the model"):
        train(other, digits, ckpt_restore=first.last_checkpoint, max_epochs=4)


def test_a_file_that_is_not_a_checkpoint_is_refused(digits, work_dir):
    junk = work_dir / "junk.ckpt"
    junk.write_text("not a checkpoint")
    with pytest.raises(CourseInputError, match="junk.ckpt"):
        train(LitClassificationModel(CLASS_COUNT), digits, ckpt_restore=junk)
