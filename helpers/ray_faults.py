"""A Ray Train worker killed on purpose, and what ``FailureConfig(max_failures=...)`` does about it.

:func:`lose_a_worker` is a training function for :func:`helpers.ray_launcher.run_with_ray`: a small linear model
trained with DDP for ``epochs`` epochs, reporting a Ray Train checkpoint (model, optimizer, epoch) from rank 0 at the
end of every epoch, and resuming from ``ray.train.get_checkpoint()`` when Ray Train restarts it. At the start of
``kill_epoch``, once Ray Train has registered the previous epoch's checkpoint, rank ``kill_rank`` notes its process
id in the job folder and SIGKILLs its own process, once per job: a restarted rank finds the note and trains on.
Every start of a rank is noted too (rank, process id, the epoch it resumed after), so the run's
:class:`LostWorkerRun` is measured, not told: how many times Ray Train started the worker group, the killed
process, and the new one that replaced it.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.jobs import JobFolder
from helpers.validation import whole_number

__all__ = ["LostWorkerRun", "lose_a_worker"]

_KILLED = "killed.json"  # in the job folder: the process that killed itself
_STATE = "state.pt"  # in a Ray Train checkpoint: model, optimizer and the epoch done


@dataclass(frozen=True)
class LostWorkerRun:
    """What a run of :func:`lose_a_worker` measured.

    Attributes:
        epochs: the epochs the run trained, each counted once.
        losses: the mean training loss of each epoch the last attempt trained, by epoch.
        killed: ``{"rank", "pid", "epoch", "time"}`` of the process that killed itself (None if none did).
        starts: one ``{"rank", "pid", "resumed_after", "time"}`` per rank's start, in order of time;
            ``resumed_after`` is the epoch of the Ray Train checkpoint it resumed from (None: from the start).
    """

    epochs: int
    losses: dict[int, float]
    killed: dict | None
    starts: list[dict]

    @property
    def attempts(self) -> int:
        """How many times Ray Train started the worker group (rank 0's starts)."""
        return sum(start["rank"] == 0 for start in self.starts)

    def pids(self, rank: int) -> list[int]:
        """The process ids that ran ``rank``, one per attempt."""
        return [start["pid"] for start in self.starts if start["rank"] == rank]

    @property
    def restart_s(self) -> float | None:
        """Seconds from the kill until rank 0 of the new worker group started training (None without a restart)."""
        if self.killed is None or self.attempts < 2:
            return None
        return max(start["time"] for start in self.starts if start["rank"] == 0) - self.killed["time"]

    @property
    def resumed_after(self) -> int | None:
        """The epoch of the checkpoint the last attempt resumed from (None: it started from scratch)."""
        return self.starts[-1]["resumed_after"] if self.starts else None


def _resume(model, optimizer) -> int | None:
    """Load Ray Train's latest checkpoint into ``model`` and ``optimizer``; the epoch it was saved after."""
    import ray.train
    import torch

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / _STATE, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"])


def _report(epoch: int, loss: float, model, optimizer, rank: int) -> None:
    """Report the epoch's loss to Ray Train from every rank, with a checkpoint from rank 0."""
    import ray.train
    import torch

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, Path(folder) / _STATE)
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report({"epoch": epoch, "loss": loss}, checkpoint=checkpoint)


def _collected(epoch: int, bound_s: float = 60.0) -> None:
    """Wait until Ray Train's controller has registered a checkpoint of ``epoch`` or later, at most ``bound_s``.

    The controller collects the workers' reports by polling them (every 2 s) and registers a checkpoint once every
    worker reported it, writing its checkpoint manager's snapshot to the run's storage; this reads that snapshot.
    """
    import ray.train

    storage = ray.train.get_context().get_storage()
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            with storage.storage_filesystem.open_input_stream(storage.checkpoint_manager_snapshot_path) as stream:
                latest = json.loads(stream.read())["latest_checkpoint_result"]
        except (OSError, ValueError, KeyError):
            latest = None
        if latest is not None and latest["metrics"].get("epoch", -1) >= epoch:
            return
        time.sleep(0.2)


def _epoch(model, optimizer, features, targets, steps: int) -> float:
    """``steps`` DDP steps on this rank's rows; the mean loss over every rank."""
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F

    total = torch.zeros(1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(features), targets)
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        total += loss.detach()
    dist.all_reduce(total)
    return total.item() / steps / dist.get_world_size()


def lose_a_worker(epochs: int = 3, kill_rank: int = 1, kill_epoch: int = 2, steps: int = 20) -> LostWorkerRun | None:
    """Train a linear model with DDP in a Ray Train worker; rank ``kill_rank`` SIGKILLs itself once.

    Args:
        epochs: the epochs to train.
        kill_rank: the rank whose process dies (a rank that does not exist: none dies).
        kill_epoch: the epoch at whose start it dies, once Ray Train's controller has registered the checkpoint
            of ``kill_epoch - 1`` (:func:`_collected`; at most 60 s later): a restart resumes from that one.
        steps: optimizer steps per epoch.

    Returns:
        A :class:`LostWorkerRun` on rank 0 of the attempt that finished, None on the other ranks.
    """
    import torch
    import torch.distributed as dist

    whole_number("epochs", epochs)
    job, rank = JobFolder.current(), dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)  # each rank its own rows of one linear problem
    features = torch.randn(64, 16, generator=generator)
    targets = features.sum(dim=1, keepdim=True)
    resumed_after = _resume(model, optimizer)
    start = {"rank": rank, "pid": os.getpid(), "resumed_after": resumed_after, "time": time.time()}
    job.write_json(f"start-rank-{rank}-{os.getpid()}.json", start)
    losses = {}
    for epoch in range(0 if resumed_after is None else resumed_after + 1, epochs):
        if rank == kill_rank and epoch == kill_epoch and not job.read_json(_KILLED):
            if epoch > 0:  # so that a restart resumes from the last epoch's checkpoint
                _collected(epoch - 1)
            job.write_json(_KILLED, {"rank": rank, "pid": os.getpid(), "epoch": epoch, "time": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer, or a lost machine, would
        losses[epoch] = _epoch(model, optimizer, features, targets, steps)
        _report(epoch, losses[epoch], model, optimizer, rank)
    if rank != 0:
        return None
    killed = job.read_json(_KILLED)
    return LostWorkerRun(
        epochs=epochs,
        losses=losses,
        killed=killed[0] if killed else None,
        starts=sorted(job.read_json("start-rank-*.json"), key=lambda start: start["time"]),
    )
