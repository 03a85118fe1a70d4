"""Lesson 5: where 2 processes do beat 1 on a CPU. Time per training step at a small and a large global batch.

Each process of a ``HorovodRunner`` job (or of a ``torchrun`` job of TorchDistributor, where Horovod is not
installed) gets one core of its own and one torch thread (as each would get a GPU of its own) and trains lesson 2's
``small_cnn`` on in-memory random images, at a fixed *global* batch: each of n processes takes global / n rows per
step. Rank 0 times every step and splits it into compute (forward and backward) and the rest (the gradients'
allreduce, with the wait for the slower process, and the optimizer's step). Each part's median over the timed steps
goes into the table (a step is the sum of the two: one slow step of a shared machine does not move it); the first
steps warm up and are not counted.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from helpers.validation import one_of, whole_number

__all__ = ["STEP_COLUMNS", "measure_step_scaling", "plot_step_times", "time_steps", "time_steps_torch"]

#: The columns of :func:`measure_step_scaling`'s table.
STEP_COLUMNS = ["global_batch", "processes", "step_ms", "compute_ms", "comm_ms", "job_s", "steps_s"]
_IMAGE_SIZE = 32
_CLASSES = 10


def _own_core(rank: int) -> None:
    """Pin this process to one core (rank modulo the usable cores) and one torch thread."""
    import torch

    if hasattr(os, "sched_getaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)


def _timed(model, optimizer, world_size: int, global_batches: list[int], steps: int, warmup: int, average) -> dict:
    """Train ``warmup + steps`` steps at each global batch, ``global / world_size`` rows each; time each step's
    compute (zero_grad, forward, backward) apart from the rest (``average()``, the optimizer's step)."""
    import torch
    import torch.nn.functional as F

    out: dict[str, Any] = {"step_ms": {}, "compute_ms": {}, "comm_ms": {}}
    started = time.perf_counter()
    for batch in global_batches:
        rows = batch // world_size
        x, y = torch.randn(rows, 3, _IMAGE_SIZE, _IMAGE_SIZE), torch.randint(0, _CLASSES, (rows,))
        compute, comm = [], []
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            t1 = time.perf_counter()
            average()
            optimizer.step()
            compute.append(t1 - t0)
            comm.append(time.perf_counter() - t1)
        compute, comm = compute[warmup:], comm[warmup:]
        out["compute_ms"][batch] = 1000 * statistics.median(compute)
        out["comm_ms"][batch] = 1000 * statistics.median(comm)
        out["step_ms"][batch] = out["compute_ms"][batch] + out["comm_ms"][batch]
    out["steps_s"] = time.perf_counter() - started
    return out


def time_steps(global_batches: list[int], steps: int, warmup: int) -> dict[str, Any]:
    """Time plain Horovod steps at each global batch (see :func:`_timed`); runs in every process of a
    ``HorovodRunner`` job. Horovod starts each gradient's allreduce during the backward pass, and the optimizer's
    step waits for them.

    Args:
        global_batches: the global batches, each divisible by the number of processes.
        steps: the timed steps per batch.
        warmup: the untimed steps before them.

    Returns:
        ``{"compute_ms" | "comm_ms": {global batch: median milliseconds}}``, ``"step_ms"``: their sum, and
        ``"steps_s"``: the seconds all the steps took, as this process saw them.
    """
    import horovod.torch as hvd
    import torch

    from helpers.model import make_network

    hvd.init()
    _own_core(hvd.rank())
    torch.manual_seed(0)
    model = make_network(_CLASSES)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return _timed(model, optimizer, hvd.size(), global_batches, steps, warmup, average=lambda: None)


def time_steps_torch(global_batches: list[int], steps: int, warmup: int) -> dict[str, Any]:
    """:func:`time_steps` with ``torch.distributed`` (Gloo) instead of Horovod; runs in every process of a
    ``torchrun`` job (TorchDistributor). After the backward pass the gradients, flattened into one tensor (as
    Horovod's tensor fusion does), are averaged with one allreduce: the communication is timed on its own, with
    none of it hidden behind the backward pass.

    Args, Returns: as for :func:`time_steps`.
    """
    import torch
    import torch.distributed as dist

    from helpers.model import make_network

    dist.init_process_group("gloo")
    try:
        _own_core(dist.get_rank())
        torch.manual_seed(0)
        model = make_network(_CLASSES)
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        world_size = dist.get_world_size()

        def average() -> None:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads]).div_(world_size)
            dist.all_reduce(flat)
            for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(part.view_as(grad))

        return _timed(model, optimizer, world_size, global_batches, steps, warmup, average)
    finally:
        dist.destroy_process_group()


def _job(launcher: str, processes: int, spark):
    """A function that runs ``fn(**kwargs)`` in ``processes`` local processes with ``launcher``, and the function
    each process runs."""
    if launcher == "horovod":
        from helpers.horovod_runner import HorovodRunner

        return (lambda fn, **kwargs: HorovodRunner(np=-processes).run(fn, **kwargs)), time_steps
    from helpers.distributor import make_distributor, run_with_distributor

    distributor = make_distributor(processes, local_mode=True, spark=spark)
    return (lambda fn, **kwargs: run_with_distributor(distributor, fn, spark=spark, **kwargs)), time_steps_torch


def measure_step_scaling(
    global_batches: tuple[int, ...] = (64, 256),
    steps: int = 20,
    warmup: int = 3,
    processes: tuple[int, ...] = (1, 2),
    launcher: str = "horovod",
    spark=None,
) -> pd.DataFrame:
    """Time steps at each global batch with 1 and 2 local processes: ``HorovodRunner(np=-n)`` or TorchDistributor
    in local mode (``torch.distributed`` over Gloo, :func:`time_steps_torch`).

    Args:
        global_batches: the global batches, each divisible by every process count.
        steps: the timed steps per batch.
        warmup: the untimed steps before them.
        processes: the process counts, one job each.
        launcher: ``"horovod"`` or ``"torch_distributor"``.
        spark: TorchDistributor's SparkSession (default: the active one).

    Returns:
        One row per (global batch, process count) with :data:`STEP_COLUMNS`: the median step, compute and
        communication-and-waiting times on rank 0 (ms), the job's whole wall time seen from here (``job_s``, start-up
        included) and the seconds its steps took (``steps_s``).

    Raises:
        CourseInputError: a count or batch that is not a whole number of at least 1, or another launcher.
        HorovodWorkerError, DistributorError: a process failed.
    """
    one_of("launcher", launcher, ("horovod", "torch_distributor"))
    whole_number("steps", steps)
    whole_number("warmup", warmup, minimum=0)
    rows = []
    for n in processes:
        whole_number("processes", n)
        batches = [whole_number("global_batches", b) for b in global_batches]
        run, fn = _job(launcher, n, spark)
        started = time.perf_counter()
        result = run(fn, global_batches=batches, steps=steps, warmup=warmup)
        job_s = time.perf_counter() - started
        for batch in batches:
            rows.append(
                {
                    "global_batch": batch,
                    "processes": n,
                    **{key: result[key][batch] for key in ("step_ms", "compute_ms", "comm_ms")},
                    "job_s": job_s,
                    "steps_s": result["steps_s"],
                }
            )
    return pd.DataFrame(rows, columns=STEP_COLUMNS).sort_values(["global_batch", "processes"], ignore_index=True)


def plot_step_times(steps: pd.DataFrame):
    """Time per step at each global batch: compute and communication stacked, 1-process time / n dashed.

    Args:
        steps: a :func:`measure_step_scaling` table.

    Returns:
        The matplotlib figure.
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels, positions = [], []
    for i, (batch, rows) in enumerate(steps.groupby("global_batch")):
        one = float(rows.loc[rows["processes"] == 1, "step_ms"].iloc[0])
        for j, row in enumerate(rows.itertuples()):
            x = 3 * i + j
            ax.bar(x, row.compute_ms, color="tab:blue", label="compute (forward, backward)" if x == 0 else None)
            ax.bar(
                x,
                row.comm_ms,
                bottom=row.compute_ms,
                color="tab:orange",
                label="allreduce and waiting" if x == 0 else None,
            )
            if row.processes > 1:
                ax.hlines(
                    one / row.processes,
                    x - 0.4,
                    x + 0.4,
                    colors="grey",
                    linestyles="--",
                    label="1-process step / n" if i == 0 else None,
                )
            labels.append(f"batch {batch}\n{row.processes} proc")
            positions.append(x)
    ax.set_xticks(positions, labels, fontsize=8)
    ax.set(ylabel="ms per step (median)", title="Time per step: 1 process against 2, same global batch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
