"""HorovodStrategy with 2 real Horovod processes over Gloo, each training a tiny model on its own shard of digits.

Sharding: with a global batch of ``B`` samples per step, step ``k`` uses samples ``[k*B, (k+1)*B)``; rank ``r`` of
``n`` takes the ``r``-th ``B/n`` of each step's block. So 2 processes with per-rank batch ``B/2`` see, step by
step, the same global batch as 1 process with batch ``B``, and averaged gradients make them take the same steps.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

from helpers.horovod_runner import HorovodRunner

# The workers cannot import this module (tests/ is not on their path): send its functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

GLOBAL_BATCH = 32
STEPS = 12
BASE_LR = 0.2
VAL_SIZE = 64


pytestmark = pytest.mark.usefixtures("work_dir")


def digits_shard(rank: int, size: int) -> tuple:
    """This rank's training and validation samples (float32 features in [0, 1], int64 labels)."""
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    per_rank = GLOBAL_BATCH // size
    train_idx = [step * GLOBAL_BATCH + rank * per_rank + i for step in range(STEPS) for i in range(per_rank)]
    val_start = STEPS * GLOBAL_BATCH
    val_per_rank = VAL_SIZE // size
    val_idx = list(range(val_start + rank * val_per_rank, val_start + (rank + 1) * val_per_rank))
    return x[train_idx], y[train_idx], x[val_idx], y[val_idx]


def build_module(lr: float):
    """A small MLP LightningModule with plain SGD; validation logs a loss and two per-rank probes."""
    import pytorch_lightning as pl
    import torch
    import torch.nn.functional as F

    class TinyClassifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
            self.lr = lr

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)
            self.log("rank_probe", float(self.global_rank), sync_dist=True)
            self.log("batches_seen", 1.0, sync_dist=True, reduce_fx="sum")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return TinyClassifier()


def train(per_rank_batch: int, accumulate: int, clip: float | None, scale_lr: bool, horovod: bool) -> dict:
    """Train one epoch of ``STEPS`` global steps; return what every rank ended with (gathered on rank 0)."""
    import pytorch_lightning as pl
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from helpers.horovod_strategy import HorovodStrategy
    from helpers.workdir import work_dir

    strategy = HorovodStrategy(scale_lr=scale_lr) if horovod else "auto"
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=str(work_dir()),
    )
    rank, size = trainer.global_rank, trainer.world_size
    x, y, xv, yv = digits_shard(rank, size)
    model = build_module(BASE_LR)
    trainer.fit(
        model,
        DataLoader(TensorDataset(x, y), batch_size=per_rank_batch),
        DataLoader(TensorDataset(xv, yv), batch_size=VAL_SIZE // size // 2),
    )
    with torch.no_grad():
        local_val_loss = float(F.cross_entropy(model(xv), yv))
    mine = {
        "rank": rank,
        "size": size,
        "weights": {k: v.detach().numpy().copy() for k, v in model.state_dict().items()},
        "optimizer_lr": trainer.optimizers[0].param_groups[0]["lr"],
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "local_val_loss": local_val_loss,
        "is_global_zero": trainer.is_global_zero,
    }
    if horovod:
        import horovod.torch as hvd
        from pytorch_lightning.utilities.rank_zero import rank_zero_only

        mine.update(base_lrs=strategy.base_lrs, scaled_lrs=strategy.scaled_lrs, rank_zero_only=rank_zero_only.rank)
        return {"ranks": hvd.allgather_object(mine)}
    return {"ranks": [mine]}


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """2 processes, per-rank batch 16, learning rate scaled by the world size."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_WORK_DIR", str(tmp_path_factory.mktemp("two_process_run")))
        return HorovodRunner(np=-2).run(
            train, per_rank_batch=GLOBAL_BATCH // 2, accumulate=1, clip=None, scale_lr=True, horovod=True
        )


@pytest.mark.slow
def test_weights_are_identical_on_both_ranks(two_process_run: dict) -> None:
    first, second = two_process_run["ranks"]
    assert (first["rank"], second["rank"], first["size"]) == (0, 1, 2)
    for name, weight in first["weights"].items():
        np.testing.assert_array_equal(weight, second["weights"][name], err_msg=name)


@pytest.mark.slow
def test_learning_rate_is_doubled_with_two_processes(two_process_run: dict) -> None:
    for rank in two_process_run["ranks"]:
        assert rank["base_lrs"] == [[BASE_LR]]
        assert rank["scaled_lrs"] == [[pytest.approx(2 * BASE_LR)]]
        assert rank["optimizer_lr"] == pytest.approx(2 * BASE_LR)


@pytest.mark.slow
def test_sync_dist_metrics_reduce_over_ranks(two_process_run: dict) -> None:
    ranks = two_process_run["ranks"]
    mean_val_loss = np.mean([r["local_val_loss"] for r in ranks])
    for rank in ranks:
        assert rank["metrics"]["rank_probe"] == pytest.approx(0.5)  # mean of ranks 0 and 1
        assert rank["metrics"]["batches_seen"] == pytest.approx(4.0)  # 2 validation batches per rank, summed
        assert rank["metrics"]["val_loss"] == pytest.approx(mean_val_loss, rel=1e-5)
    assert ranks[0]["local_val_loss"] != pytest.approx(ranks[1]["local_val_loss"], rel=1e-3)  # shards differ


@pytest.mark.slow
def test_rank_zero_only_on_rank_zero(two_process_run: dict) -> None:
    assert [(r["is_global_zero"], r["rank_zero_only"]) for r in two_process_run["ranks"]] == [(True, 0), (False, 1)]


@pytest.mark.slow
def test_two_processes_match_one_with_the_same_global_batch() -> None:
    """Same global batch: 1 plain process (batch 32) vs 2 Horovod processes (batch 8, 2 accumulated passes each).

    Gradient clipping is on and active, so this also checks that the averaged gradient is what gets clipped.
    """
    single = train(per_rank_batch=GLOBAL_BATCH, accumulate=1, clip=0.3, scale_lr=False, horovod=False)["ranks"][0]
    both = HorovodRunner(np=-2).run(
        train, per_rank_batch=GLOBAL_BATCH // 4, accumulate=2, clip=0.3, scale_lr=False, horovod=True
    )["ranks"]
    unclipped = train(per_rank_batch=GLOBAL_BATCH, accumulate=1, clip=None, scale_lr=False, horovod=False)["ranks"][0]
    name = "net.0.weight"
    assert np.abs(single["weights"][name] - unclipped["weights"][name]).max() > 1e-3, "clipping was not active"
    for rank in both:
        assert rank["optimizer_lr"] == pytest.approx(BASE_LR)
        for key, weight in single["weights"].items():
            np.testing.assert_allclose(rank["weights"][key], weight, atol=1e-5, err_msg=key)


def train_manually(steps: int) -> list:
    """Manual optimization (``self.optimizers()``, ``manual_backward``) on different data per rank."""
    import horovod.torch as hvd
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from helpers.horovod_strategy import HorovodStrategy

    class ManualModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(self.layer(batch[0]).pow(2).mean())
            optimizer.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(
        strategy=HorovodStrategy(),
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    torch.manual_seed(trainer.global_rank)  # different data and initial weights on each rank
    data = torch.randn(4 * steps, 4)
    model = ManualModule()
    trainer.fit(model, DataLoader(TensorDataset(data), batch_size=4))
    return hvd.allgather_object([p.detach().numpy().copy() for p in model.parameters()])


@pytest.mark.slow
def test_manual_optimization_keeps_ranks_in_step() -> None:
    first, second = HorovodRunner(np=-2).run(train_manually, steps=3)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_bad_arguments_are_one_line_errors() -> None:
    import torch

    from helpers import CourseInputError
    from helpers.horovod_strategy import HorovodStrategy

    pytest.importorskip("horovod.torch")
    with pytest.raises(CourseInputError, match=r"^scale_lr='no': pass True or False\.$"):
        HorovodStrategy(scale_lr="no")
    with pytest.raises(CourseInputError, match=r"^reduce_op='prod': use one of 'mean', 'avg', 'sum', 'max', 'min'\.$"):
        HorovodStrategy().reduce(torch.ones(2), reduce_op="prod")
