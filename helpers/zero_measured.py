"""ZeRO's memory measured: what each rank really holds under stages 0, 2 and 3, next to what is computed for it.

:func:`measure_zero` runs one DeepSpeed job per stage (:func:`helpers.deepspeed_launcher.run_with_deepspeed`:
pyspark's ``DeepspeedTorchDistributor``, ``world_size`` processes on the driver, Gloo on the CPU). In every process
:func:`model_states_of_rank` builds the same MLP, hands it to ``deepspeed.initialize`` with Adam at the stage, and
takes one step (Adam creates its states at the first); in the second step, after the backward pass, when the
parameters, the gradients and the optimizer states are all alive, the rank measures:

* ``tensor_bytes``: the bytes of every tensor the process holds (the distinct storages of the tensors Python's
  garbage collector tracks: the parameters, gradients, optimizer states and DeepSpeed's own flat copies and buffers;
  the batch and activations are a few KiB);
* ``rss_growth_bytes``: how much its resident memory grew since just before the model was built. The jobs run with
  glibc's ``MALLOC_MMAP_THRESHOLD_`` at 1 MiB: by default glibc raises that threshold up to 32 MiB as blocks are
  freed, and keeps freed blocks below it in its heap, so the resident memory would also count tensors already freed
  (stage 3's gathered layers).

:func:`zero_estimates` gives, for the same model, :func:`helpers.zero.zero_memory`'s arithmetic for fp32 Adam
(4 + 4 + 8 bytes per parameter) and DeepSpeed's own estimators of the per-GPU model states, which assume mixed
precision (``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_model_states_mem_needs``, no offload).
"""

from __future__ import annotations

import gc
from typing import Any

import pandas as pd

from helpers.validation import whole_number

__all__ = ["MEASURED_STAGES", "held_tensor_bytes", "measure_zero", "mlp", "model_states_of_rank", "zero_estimates"]

MEASURED_STAGES = (0, 2, 3)
# DeepSpeed's gradient buckets default to 5e8 elements (2 GB in fp32), which a step fills with every gradient
# before reducing them: a bucket of 2e6 elements, as DeepSpeed's docs suggest for small memory, keeps them out of sight
_BUCKETS = {
    "reduce_bucket_size": 2_000_000,
    "allgather_bucket_size": 2_000_000,
    "stage3_prefetch_bucket_size": 2_000_000,
}


def mlp(width: int, layers: int):
    """An MLP of ``layers`` square ``Linear(width, width)`` layers with ReLUs between them (no training data needed).

    Returns:
        The ``torch.nn.Sequential``, with ``layers * (width**2 + width)`` parameters.
    """
    import torch

    blocks: list[Any] = []
    for index in range(layers):
        blocks += [torch.nn.Linear(width, width)] + ([torch.nn.ReLU()] if index < layers - 1 else [])
    return torch.nn.Sequential(*blocks)


def held_tensor_bytes() -> int:
    """The bytes of every tensor this process holds: the distinct storages of the tensors the garbage collector
    tracks (views of one flat buffer count once; tensors only C++ code holds are not seen)."""
    import torch

    storages = {}
    for item in gc.get_objects():
        # type(), not isinstance(): isinstance also reads __class__, which warns on some of torch's deprecated objects
        if issubclass(type(item), torch.Tensor) and item.device.type != "meta":
            storage = item.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _rss() -> int:
    """This process's resident memory in bytes."""
    import psutil

    return psutil.Process().memory_info().rss


def model_states_of_rank(deepspeed_config: str, width: int, layers: int, batch_size: int = 8) -> list[dict] | None:
    """In every process of a DeepSpeed job: build :func:`mlp`, take a step and measure a second (see the module).

    Args:
        deepspeed_config: the DeepSpeed config file (its ZeRO stage, Adam).
        width, layers: the MLP's shape.
        batch_size: rows of random data per step and process.

    Returns:
        On rank 0, one dict per rank: ``rank``, ``stage``, ``tensor_bytes``, ``rss_growth_bytes``; None elsewhere.
    """
    import torch
    import torch.distributed as dist

    from helpers.deepspeed_train import join_process_group, zero_engine

    join_process_group(use_gpu=False)
    gc.collect()
    before = _rss()
    torch.manual_seed(0)
    engine = zero_engine(mlp(width, layers), deepspeed_config, use_gpu=False)
    features = torch.randn(batch_size, width)
    for step in range(2):
        loss = engine(features).pow(2).mean()
        engine.backward(loss)
        if step == 1:  # parameters, gradients and optimizer states all alive
            gc.collect()
            measured = {"rank": dist.get_rank(), "stage": engine.zero_optimization_stage(),
                        "tensor_bytes": held_tensor_bytes(), "rss_growth_bytes": _rss() - before}  # fmt: skip
        engine.step()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, measured)
    return gathered if dist.get_rank() == 0 else None


def measure_zero(
    width: int = 2048, layers: int = 6, world_size: int = 2, stages=MEASURED_STAGES, spark=None
) -> pd.DataFrame:
    """Measure what each rank holds under each ZeRO stage (:func:`model_states_of_rank`), one job per stage.

    Args:
        width, layers: the MLP's shape (the defaults: 25.2 million parameters, 403 MB of fp32 Adam states).
        world_size: the processes of each job.
        stages: the ZeRO stages to measure.
        spark: the SparkSession (default: the active one).

    Returns:
        One row per stage and rank (a ``(stage, rank)`` index): ``tensor_bytes``, ``rss_growth_bytes``.
    """
    from helpers.deepspeed_launcher import job_env

    whole_number("width", width)
    whole_number("layers", layers)
    rows = []
    with job_env(MALLOC_MMAP_THRESHOLD_=str(2**20)):  # read by glibc when each process starts (see the module)
        for stage in stages:
            rows += _measure_stage(stage, width, layers, world_size, spark)
    return pd.DataFrame(rows).set_index(["stage", "rank"]).sort_index()


def _measure_stage(stage: int, width: int, layers: int, world_size: int, spark) -> list[dict]:
    """One DeepSpeed job of :func:`model_states_of_rank` at ``stage``: one dict per rank."""
    from helpers.deepspeed_launcher import run_with_deepspeed
    from helpers.zero import zero_config

    config = zero_config(stage, micro_batch_size=8, world_size=world_size, optimizer="adam", learning_rate=1e-3)
    if stage > 0:
        config["zero_optimization"].update(_BUCKETS)
    return run_with_deepspeed(
        model_states_of_rank, config, num_processes=world_size, spark=spark, width=width, layers=layers
    )


def zero_estimates(width: int = 2048, layers: int = 6, world_size: int = 2, stages=MEASURED_STAGES) -> pd.DataFrame:
    """What is computed for :func:`mlp`'s model states per rank: the ZeRO paper's arithmetic and DeepSpeed's.

    Args:
        width, layers, world_size, stages: as for :func:`measure_zero`.

    Returns:
        One row per stage: ``arithmetic_bytes`` (:func:`helpers.zero.zero_memory`, fp32 Adam: 4 + 4 + 8 bytes per
        parameter) and ``deepspeed_estimate_bytes`` (DeepSpeed's per-GPU estimate without offload, for mixed
        precision: stage 2's ``2Ψ + 18Ψ/N``, stage 3's ``4 x largest layer + 18Ψ/N``; stage 0, which DeepSpeed
        has no estimator for, is stage 2's on one GPU: nothing split).
    """
    import torch

    from helpers.zero import load_deepspeed, zero_memory

    load_deepspeed(torch.cuda.is_available())
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    total, largest = layers * (width * width + width), width * width + width
    rows = []
    for stage in stages:
        if stage == 3:
            _, estimate, _ = estimate_zero3_model_states_mem_needs(
                total, largest, num_gpus_per_node=world_size, cpu_offload=False, cpu_offload_params=False
            )
        else:
            gpus = world_size if stage else 1
            _, estimate = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=gpus, cpu_offload=False)
        arithmetic = zero_memory(total, stage, world_size, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
        rows.append({"stage": stage, "arithmetic_bytes": arithmetic.loc[stage, "total_bytes"],
                     "deepspeed_estimate_bytes": estimate})  # fmt: skip
    return pd.DataFrame(rows).set_index("stage")
