"""GPU smoke check (``make gpu-smoke``): on a machine with an NVIDIA GPU, in a few minutes,

1. lesson 2's ``LitClassificationModel`` trains with ``helpers.training.train(accelerator="gpu")`` on the embedded
   digits, and the loss goes down;
2. a ``HorovodRunner(np=-1)`` job trains it with ``HorovodStrategy`` on ``cuda:<local rank>``;
3. the same model trains with automatic mixed precision (``Trainer(precision=...)`` from ``helpers.devices``);
4. lesson 6's DeepSpeed distributor (``helpers.deepspeed_launcher.train_with_deepspeed``) trains lesson 2's network
   on one GPU (NCCL) under ZeRO stage 2 with mixed precision, and the loss goes down.

Each prints its throughput in images per second (run pytest with ``-s`` to see it). Everything is skipped, with the
reason, where ``torch.cuda.is_available()`` is False. The whole module must finish in under 5 minutes.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest
import torch

# HorovodRunner's workers cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU: torch.cuda.is_available() is False"),
]

BUDGET_S = 300
EPOCHS = 3
BATCH_SIZE = 64
IMAGE_SIZE = 64  # mobilenet_v2 downsamples 32x; 64 px keeps the digits meaningful and the GPU busy
_CLOCK: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _clock():
    """Starts when this module's first test starts (not at collection, which precedes the whole suite)."""
    _CLOCK.setdefault("started", time.monotonic())


def _backbone() -> str:
    """mobilenet_v2 (random weights: no download) when torchvision is installed, else the small CNN."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return "small_cnn"
    return "mobilenet_v2"


def _report(what: str, images: int, seconds: float) -> float:
    rate = images / seconds if seconds > 0 else float("nan")
    print(
        f"\n[gpu-smoke] {what}: {images} images in {seconds:.1f} s = {rate:,.0f} images/s "
        f"({torch.cuda.get_device_name(0)})",
        flush=True,
    )
    return rate


@pytest.fixture(scope="module")
def data(spark):
    from helpers.loaders import prepare_data

    return prepare_data(None, num_devices=1, seed=0, spark=spark)


def test_lesson2_model_trains_on_the_gpu(data, tmp_path):
    from helpers.datamodule import PetastormDataModule
    from helpers.devices import accelerator_for, describe_devices
    from helpers.model import LitClassificationModel
    from helpers.training import train

    print(f"\n[gpu-smoke] {describe_devices()}")
    model = LitClassificationModel(
        len(data.class_names), learning_rate=0.02, backbone=_backbone(), image_size=IMAGE_SIZE
    )
    datamodule = PetastormDataModule(data.train_converter, data.val_converter, BATCH_SIZE, IMAGE_SIZE)
    result = train(
        model,
        datamodule,
        max_epochs=EPOCHS,
        accelerator=accelerator_for(True),
        devices=1,
        early_stopping=False,
        default_dir=tmp_path,
        progress_bar=False,
    )
    assert next(model.parameters()).device.type == "cuda"
    assert result.epochs_run == EPOCHS
    losses = [row["train_loss"] for row in result.history if "train_loss" in row]
    assert losses[-1] < losses[0], losses
    _report(f"train() on 1 GPU, {_backbone()}, {IMAGE_SIZE} px", len(data.train_converter) * EPOCHS, result.wall_time_s)


def _train_on_horovod_gpu(train_converter, val_converter, class_count, backbone, default_dir):
    """Runs in the Horovod process: one GPU per process, HorovodStrategy, train(accelerator="gpu")."""
    import horovod.torch as hvd
    import torch

    from helpers.datamodule import PetastormDataModule
    from helpers.horovod_strategy import HorovodStrategy
    from helpers.model import LitClassificationModel
    from helpers.training import train

    hvd.init()
    model = LitClassificationModel(class_count, learning_rate=0.02, backbone=backbone, image_size=IMAGE_SIZE)
    datamodule = PetastormDataModule(
        train_converter, val_converter, BATCH_SIZE, IMAGE_SIZE, device_id=hvd.rank(), device_count=hvd.size()
    )
    result = train(
        model,
        datamodule,
        max_epochs=EPOCHS,
        strategy=HorovodStrategy(),
        accelerator="gpu",
        early_stopping=False,
        default_dir=default_dir,
        progress_bar=False,
    )
    return {
        "result": result,
        "device": str(next(model.parameters()).device),
        "current_device": torch.cuda.current_device(),
        "local_rank": hvd.local_rank(),
        "size": hvd.size(),
    }


def test_horovod_runner_trains_on_the_gpu(data, tmp_path):
    from helpers.devices import horovod_gpu_support
    from helpers.horovod_runner import HorovodRunner

    support = horovod_gpu_support()
    assert support["installed"], "Horovod is not installed: make setup GPU=1"
    assert support["cuda"], (
        f"Horovod was built without CUDA ({support}): rebuild it with NCCL, `make setup GPU=1` "
        "(rm -rf .cache/wheels/horovod-* .venv/.setup-done first)"
    )
    out = HorovodRunner(np=-1, use_gpu=True).run(
        _train_on_horovod_gpu,
        train_converter=data.train_converter,
        val_converter=data.val_converter,
        class_count=len(data.class_names),
        backbone=_backbone(),
        default_dir=str(tmp_path),
    )
    assert out["size"] == 1
    assert out["device"] == f"cuda:{out['local_rank']}" and out["current_device"] == out["local_rank"]
    assert out["result"].epochs_run == EPOCHS
    _report(
        f"HorovodRunner(np=-1) on the GPU (NCCL built: {support['nccl']})",
        len(data.train_converter) * EPOCHS,
        out["result"].wall_time_s,
    )


def test_mixed_precision_trains_on_the_gpu(data, tmp_path):
    import pytorch_lightning as pl

    from helpers.datamodule import PetastormDataModule
    from helpers.devices import precision_for
    from helpers.model import LitClassificationModel

    precision = precision_for(True, use_gpu=True)
    model = LitClassificationModel(
        len(data.class_names), learning_rate=0.02, backbone=_backbone(), image_size=IMAGE_SIZE
    )
    datamodule = PetastormDataModule(data.train_converter, data.val_converter, BATCH_SIZE, IMAGE_SIZE)
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    started = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - started
    assert torch.isfinite(trainer.callback_metrics["val_loss"])
    _report(f"Trainer(precision={precision!r}) on 1 GPU", len(data.train_converter) * EPOCHS, seconds)


def test_deepspeed_zero_trains_on_the_gpu(spark, data, tmp_path):
    from helpers.deepspeed_launcher import train_with_deepspeed
    from helpers.worker import TrainSettings

    settings = TrainSettings(
        batch_size=BATCH_SIZE,
        image_size=IMAGE_SIZE,
        learning_rate=0.02,
        max_epochs=EPOCHS,
        backbone=_backbone(),
        use_gpu=True,
        mixed_precision=True,
        work_dir=str(tmp_path),
    )
    result = train_with_deepspeed(
        data.train_converter, data.val_converter, len(data.class_names), settings, stage=2, num_processes=1, spark=spark
    )
    assert result.epochs_run == EPOCHS
    losses = [row["train_loss"] for row in result.history]
    assert losses[-1] < losses[0], losses
    _report(
        "DeepSpeed distributor, ZeRO stage 2, mixed precision, 1 GPU",
        len(data.train_converter) * EPOCHS,
        result.wall_time_s,
    )


def test_the_smoke_check_fits_its_budget():
    elapsed = time.monotonic() - _CLOCK["started"]
    print(f"\n[gpu-smoke] whole check: {elapsed:.0f} s (budget {BUDGET_S} s)")
    assert elapsed < BUDGET_S
