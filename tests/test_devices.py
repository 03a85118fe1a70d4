"""GPU code paths exercised on the CPU: device selection, precision, and use_gpu reaching the Trainer's settings.

Nothing here needs a GPU or trains: ``cuda_count`` pretends there are GPUs, and the training call is replaced by a
recorder, so the tests check what *would* be asked of Lightning on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from helpers import CourseInputError
from helpers.devices import (
    accelerator_for,
    describe_devices,
    device_for_local_rank,
    gpu_count,
    horovod_gpu_support,
    precision_for,
)


def test_accelerator_for():
    assert accelerator_for(False, cuda_count=4) == "cpu"
    assert accelerator_for(True, cuda_count=1) == "gpu"
    assert accelerator_for(None, cuda_count=2) == "gpu"
    assert accelerator_for(None, cuda_count=0) == "cpu"
    with pytest.raises(CourseInputError, match="no CUDA GPU"):
        accelerator_for(True, cuda_count=0)
    with pytest.raises(CourseInputError, match="True or False"):
        accelerator_for("yes")


def test_one_gpu_per_local_rank():
    assert device_for_local_rank(0, False) == torch.device("cpu")
    assert device_for_local_rank(3, True, cuda_count=4) == torch.device("cuda", 3)
    with pytest.raises(CourseInputError, match="local rank 2 needs GPU 2, but this machine has 2"):
        device_for_local_rank(2, True, cuda_count=2)
    with pytest.raises(CourseInputError, match="local_rank"):
        device_for_local_rank(-1, True, cuda_count=2)


def test_precision_for():
    assert precision_for(False, True) == "32-true"
    assert precision_for(True, True, bf16=True) == "bf16-mixed"
    assert precision_for(True, True, bf16=False) == "16-mixed"  # T4 / V100: float16 with a gradient scaler
    assert precision_for(True, False) == "bf16-mixed"
    with pytest.raises(CourseInputError):
        precision_for(1, True)


def test_detection_on_this_machine_is_consistent():
    has_gpu = gpu_count() > 0
    assert has_gpu == torch.cuda.is_available()
    assert ("no GPU" in describe_devices()) != has_gpu
    support = horovod_gpu_support()
    assert set(support) == {"installed", "cuda", "nccl", "gloo"}
    if support["installed"] and not has_gpu:
        assert support["gloo"]


def test_ddp_talks_nccl_between_gpus():
    from helpers.distributor import process_group_backend

    assert process_group_backend(True) == "nccl"
    assert process_group_backend(False) == "gloo"


def test_horovod_strategy_pins_cuda_local_rank(monkeypatch):
    from helpers.horovod_strategy import HorovodStrategy

    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "3")
    strategy = HorovodStrategy(parallel_devices=[torch.device("cuda", 0)])
    assert strategy.root_device == torch.device("cuda", 3)
    assert HorovodStrategy(parallel_devices=[torch.device("cpu")]).root_device == torch.device("cpu")


class _Converter:
    """Stands in for a Petastorm converter: PetastormDataModule only asks its length before training."""

    def __len__(self) -> int:
        return 100


@pytest.mark.parametrize("launcher", ["horovod", "torch_distributor"])
def test_use_gpu_reaches_the_trainer_settings(monkeypatch, launcher):
    """TrainSettings(use_gpu=True, mixed_precision=True) -> train(accelerator="gpu", precision=<16-bit>, ...) with
    Horovod or DDP over NCCL."""
    import helpers.training
    from helpers import worker

    calls = {}
    monkeypatch.setattr(helpers.training, "train", lambda model, datamodule, **kwargs: calls.update(kwargs))
    if launcher == "horovod":
        hvd = pytest.importorskip("horovod.torch")
        monkeypatch.setattr(hvd, "init", lambda *args, **kwargs: None)
        monkeypatch.setattr(hvd, "rank", lambda: 0)
        monkeypatch.setattr(hvd, "size", lambda: 2)
    settings = worker.TrainSettings(use_gpu=True, mixed_precision=True, max_epochs=1)
    worker.train_process(launcher, _Converter(), _Converter(), 10, settings, num_processes=2)
    assert calls["accelerator"] == "gpu"
    # decided in the process by its GPU: bf16 on Ampere and newer, float16 elsewhere (and without a GPU, here)
    assert calls["precision"] == precision_for(True, True) and calls["precision"] in ("bf16-mixed", "16-mixed")
    if launcher == "torch_distributor":
        assert calls["strategy"]._process_group_backend == "nccl"
        assert (calls["devices"], calls["num_nodes"]) == (1, 2)
    else:
        assert type(calls["strategy"]).__name__ == "HorovodStrategy"


def test_a_horovod_process_on_spark_takes_the_gpu_spark_assigned_to_its_task(monkeypatch):
    task_info = pytest.importorskip("horovod.spark.task.task_info")
    from helpers.devices import assigned_gpu

    assert assigned_gpu(1) == 1  # no Spark assignment: its index on the machine
    monkeypatch.setattr(task_info._info, "resources", {"gpu": type("Gpu", (), {"addresses": ["3"]})()})
    assert assigned_gpu(0) == 3
