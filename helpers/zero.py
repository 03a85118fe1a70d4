"""ZeRO as data: the DeepSpeed config a lesson trains with, its checks, and the ZeRO paper's memory arithmetic.

ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020) removes the
copies data parallelism keeps on every device. With mixed-precision Adam each parameter costs 16 bytes of model
state: 2 for its 16-bit value, 2 for its 16-bit gradient and 12 of optimizer state (a 32-bit master copy, momentum
and variance). Stage 1 splits the optimizer state across the ``world_size`` devices, stage 2 the gradients too,
stage 3 the parameters too. :func:`zero_memory` does that arithmetic and :func:`zero_fits` says which stages fit a
device; :func:`zero_config` builds the DeepSpeed config of a stage and :func:`check_zero_config` gives a learner's
own config a one-line error before any process starts.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import numbers
import os
from collections.abc import Iterator
from typing import Any

import pandas as pd

from helpers import CourseInputError
from helpers.logs import logger_levels
from helpers.validation import check_flag, one_of, whole_number

__all__ = [
    "OPTIMIZERS",
    "PRECISIONS",
    "STAGE_PARTITIONS",
    "ZERO_STAGES",
    "check_zero_config",
    "load_deepspeed",
    "zero_config",
    "zero_fits",
    "zero_memory",
]

ZERO_STAGES = (0, 1, 2, 3)
#: what each stage splits across the devices (each stage adds to the one before)
STAGE_PARTITIONS = {
    0: "nothing (plain data parallelism)",
    1: "optimizer states",
    2: "optimizer states, gradients",
    3: "optimizer states, gradients, parameters",
}
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "adam")
# the optimizers of a DeepSpeed config that ZeRO accepts without "zero_allow_untested_optimizer" (DeepSpeed's
# ZERO_SUPPORTED_OPTIMIZERS: torch's Adam, AdamW and Adagrad, its own fused and CPU versions, Lion)
_ZERO_TESTED = ("adam", "adamw", "adagrad", "lion")
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_GIB = 2**30


def zero_config(
    stage: int,
    *,
    micro_batch_size: int,
    world_size: int,
    gradient_accumulation: int = 1,
    offload_optimizer: bool = False,
    learning_rate: float = 0.01,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    precision: str = "fp32",
) -> dict[str, Any]:
    """The DeepSpeed config of a ZeRO stage, ready for ``deepspeed.initialize(config=...)``.

    Args:
        stage: the ZeRO stage, 0 (off) to 3.
        micro_batch_size: rows per process per step (``train_micro_batch_size_per_gpu``).
        world_size: the number of processes training together.
        gradient_accumulation: micro steps per optimizer step.
        offload_optimizer: keep the optimizer states in CPU memory (ZeRO-Offload, stage 1 to 3); useful on GPUs.
        learning_rate: the optimizer's learning rate (already scaled for the world size, if you scale it).
        optimizer: ``"sgd"`` (lesson 2's SGD with momentum) or ``"adam"`` (torch's Adam; DeepSpeed's CPU Adam,
            built at first use, with ``offload_optimizer``).
        momentum: SGD's momentum.
        precision: ``"fp32"`` (the CPU), ``"bf16"`` (the CPU or an Ampere or newer GPU) or ``"fp16"`` (older GPUs).

    Returns:
        A dict: ``train_batch_size`` = micro batch x accumulation x world size, the optimizer, the precision,
        ``zero_optimization.stage`` (and its offload), ``zero_allow_untested_optimizer`` where SGD needs it.

    Raises:
        CourseInputError: a stage, count, optimizer or precision out of range, or offloading with stage 0.
    """
    _check_stage("stage", stage)
    micro_batch_size = whole_number("micro_batch_size", micro_batch_size, hint="Rows per process per step.")
    world_size = whole_number("world_size", world_size, hint="The number of training processes.")
    gradient_accumulation = whole_number("gradient_accumulation", gradient_accumulation)
    check_flag("offload_optimizer", offload_optimizer)
    one_of("optimizer", optimizer, OPTIMIZERS)
    one_of("precision", precision, PRECISIONS, "fp32 on the CPU; bf16 on the CPU or Ampere and newer GPUs.")
    if not isinstance(learning_rate, numbers.Real) or learning_rate <= 0:
        raise CourseInputError(f"learning_rate={learning_rate!r}: pass a positive number such as 1e-2.")
    if offload_optimizer and stage == 0:
        raise CourseInputError("offload_optimizer=True needs stage 1, 2 or 3: stage 0 has no ZeRO optimizer.")
    zero: dict[str, Any] = {"stage": stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if optimizer == "sgd":
        chosen = {"type": "SGD", "params": {"lr": learning_rate, "momentum": momentum}}
    else:  # torch's Adam needs no compiled op; offloaded, DeepSpeed's CPU Adam is the one ZeRO-Offload is made for
        chosen = {"type": "Adam", "params": {"lr": learning_rate, "torch_adam": not offload_optimizer}}
    config: dict[str, Any] = {
        "train_batch_size": micro_batch_size * gradient_accumulation * world_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation,
        "optimizer": chosen,
        "zero_optimization": zero,
        "steps_per_print": 2**31 - 1,  # DeepSpeed's own progress lines; the course logs to MLflow instead
    }
    if precision != "fp32":
        config[precision] = {"enabled": True}
    if stage > 0 and optimizer == "sgd":
        config["zero_allow_untested_optimizer"] = True
    return config


def _check_stage(name: str, stage: Any) -> int:
    """``stage`` if it is a ZeRO stage (an int from 0 to 3; not True, not 2.0), else a one-line error."""
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in ZERO_STAGES:
        splits = "; ".join(f"{each}: {what}" for each, what in STAGE_PARTITIONS.items())
        raise CourseInputError(f"{name}={stage!r}: use 0, 1, 2 or 3. ZeRO splits {splits}.")
    return stage


def check_zero_config(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Check a DeepSpeed config before any process starts: the course's rules, then DeepSpeed's own parser.

    The course's rules: a ZeRO stage of 0 to 3; ``train_batch_size`` = micro batch x accumulation x world size;
    offloading only where the stage has something to offload; an optimizer ZeRO was not tested with only with
    ``"zero_allow_untested_optimizer": true``. DeepSpeed's parser (``DeepSpeedConfig``, which needs no GPU) then
    checks the rest: unknown or removed keys, both fp16 and bf16, ...

    Args:
        config: the config, a dict as ``deepspeed.initialize(config=...)`` takes it.
        world_size: the number of processes that will train with it.

    Returns:
        ``config`` unchanged.

    Raises:
        CourseInputError: one line saying what is wrong and what to change.
    """
    if not isinstance(config, dict):
        raise CourseInputError(f"config={config!r}: pass the DeepSpeed config as a dict, e.g. zero_config(2, ...).")
    world_size = whole_number("world_size", world_size, hint="The number of training processes.")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise CourseInputError(f"zero_optimization={zero!r}: pass a dict such as {{'stage': 2}}.")
    stage = _check_stage("zero_optimization.stage", zero.get("stage", 0))
    _check_batch(config, world_size)
    _check_offload(zero, stage)
    _check_optimizer(config, stage)
    _parse_with_deepspeed(config, world_size)
    return config


def _check_optimizer(config: dict[str, Any], stage: int) -> None:
    """The config's optimizer (if it names one) is DeepSpeed's or torch's, and ZeRO may use it."""
    block = config.get("optimizer")
    optimizer = block.get("type") if isinstance(block, dict) else None
    if optimizer is None:
        return  # the training code passes its own optimizer to deepspeed.initialize
    import torch

    load_deepspeed(torch.cuda.is_available())
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    if not isinstance(optimizer, str) or (
        optimizer.lower() not in DEEPSPEED_OPTIMIZERS and not isinstance(getattr(torch.optim, optimizer, None), type)
    ):
        raise CourseInputError(
            f"optimizer type {optimizer!r} is neither one of DeepSpeed's ({', '.join(DEEPSPEED_OPTIMIZERS)}) nor a "
            "torch.optim class: use e.g. 'Adam' or 'SGD' (torch's spelling)."
        )
    if stage > 0 and optimizer.lower() not in _ZERO_TESTED and config.get("zero_allow_untested_optimizer") is not True:
        raise CourseInputError(
            f'optimizer {optimizer!r} with ZeRO stage {stage}: add "zero_allow_untested_optimizer": true '
            "(DeepSpeed refuses it in deepspeed.initialize otherwise), or use Adam."
        )


def _check_batch(config: dict[str, Any], world_size: int) -> None:
    """``train_batch_size`` = ``train_micro_batch_size_per_gpu`` x ``gradient_accumulation_steps`` x world size,
    for the values given (DeepSpeed computes a missing one; its own parser only knows a world size of 1 here)."""
    given = {key: whole_number(key, config[key]) for key in _BATCH_KEYS if config.get(key) is not None}
    total = given.get("train_batch_size")
    micro = given.get("train_micro_batch_size_per_gpu")
    steps = given.get("gradient_accumulation_steps")
    if total is None and micro is None:
        raise CourseInputError(
            "The config sets neither train_batch_size nor train_micro_batch_size_per_gpu: set "
            "train_micro_batch_size_per_gpu (rows per process per step)."
        )
    if total is None:
        return
    if micro is not None and steps is not None:
        product = micro * steps * world_size
        if total != product:
            raise CourseInputError(
                f"train_batch_size={total} must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                f"x world_size = {micro} x {steps} x {world_size} = {product}: set it to {product}, or leave it "
                "out and DeepSpeed computes it."
            )
    elif micro is not None and total % (micro * world_size):
        raise CourseInputError(
            f"train_batch_size={total} is not a multiple of train_micro_batch_size_per_gpu x world_size = "
            f"{micro} x {world_size} = {micro * world_size}: DeepSpeed could not make whole accumulation steps."
        )
    elif micro is None and total % ((steps or 1) * world_size):
        raise CourseInputError(
            f"train_batch_size={total} is not divisible by gradient_accumulation_steps x world_size = "
            f"{steps or 1} x {world_size}: every process must get the same whole micro batch."
        )


def _offloads(zero: dict[str, Any], key: str) -> bool:
    """Whether ``zero[key]`` (``offload_optimizer`` or ``offload_param``) offloads somewhere."""
    block = zero.get(key)
    return isinstance(block, dict) and block.get("device", "none") != "none"


def _check_offload(zero: dict[str, Any], stage: int) -> None:
    """Offloading needs something partitioned to offload: optimizer states from stage 1, parameters at stage 3."""
    if _offloads(zero, "offload_optimizer") and stage == 0:
        raise CourseInputError(
            "zero_optimization.offload_optimizer with stage 0: offloading needs stage 1, 2 or 3 (stage 0 has no "
            "ZeRO optimizer); raise the stage or remove offload_optimizer."
        )
    if _offloads(zero, "offload_param") and stage != 3:
        raise CourseInputError(
            f"zero_optimization.offload_param with stage {stage}: only stage 3 partitions (and can offload) the "
            "parameters; use stage 3 or remove offload_param."
        )


@contextlib.contextmanager
def _accelerator(use_gpu: bool) -> Iterator[None]:
    """Name DeepSpeed's accelerator (``DS_ACCELERATOR``) while it is first imported, unless the user did: it is
    chosen once per process, and detecting it prints a warning on every CPU-only machine."""
    if "DS_ACCELERATOR" in os.environ:
        yield
        return
    os.environ["DS_ACCELERATOR"] = "cuda" if use_gpu else "cpu"
    try:
        yield
    finally:
        os.environ.pop("DS_ACCELERATOR", None)


def load_deepspeed(use_gpu: bool):
    """Import DeepSpeed for the CPU or the GPU, without its "unable to detect" accelerator warning.

    Args:
        use_gpu: whether this process trains on a CUDA GPU.

    Returns:
        The ``deepspeed`` module.
    """
    with _accelerator(use_gpu):
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        get_accelerator()  # fixed now, while the variable is set
    return deepspeed


def _parse_with_deepspeed(config: dict[str, Any], world_size: int) -> None:
    """Run DeepSpeed's config parser on ``config`` as one process of ``world_size`` sees it (outside a process
    group the parser assumes a world size of 1, so the batch is divided first; :func:`_check_batch` checked it)."""
    import torch

    load_deepspeed(torch.cuda.is_available())
    from deepspeed.runtime.config import DeepSpeedConfig

    view = copy.deepcopy(config)
    if view.get("train_batch_size") is not None:
        view["train_batch_size"] //= world_size
    try:
        with logger_levels({"DeepSpeed": logging.ERROR}):  # its warnings repeat what the error will say
            DeepSpeedConfig(view)
    except Exception as error:  # AssertionError, ValueError, pydantic's ValidationError, DeepSpeedConfigError
        raise CourseInputError(f"DeepSpeed refuses the config: {_one_line(error)}") from None


def _one_line(error: Exception) -> str:
    """The first useful line of a config error (pydantic's: ``field: message``)."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return f"{where}: {first.get('msg', '')} ({error.title})" if where else str(first.get("msg", ""))
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(error).__name__


def zero_memory(
    param_count: int,
    stage: int | None = None,
    world_size: int = 1,
    *,
    param_bytes: int = 2,
    grad_bytes: int = 2,
    optimizer_bytes: int = 12,
) -> pd.DataFrame:
    """Model-state memory per device under ZeRO, the paper's arithmetic (activations and buffers not included).

    Stage 0 keeps everything on every device; stage 1 divides the optimizer state by ``world_size``, stage 2 the
    gradients too, stage 3 the parameters too. The defaults are the paper's mixed-precision Adam (2 + 2 + 12
    bytes per parameter); lesson 2's fp32 SGD with momentum is ``param_bytes=4, grad_bytes=4, optimizer_bytes=4``.

    Args:
        param_count: the model's parameters.
        stage: one stage, or None for all four.
        world_size: the devices the states are divided over.
        param_bytes, grad_bytes, optimizer_bytes: bytes per parameter of each kind of state.

    Returns:
        One row per stage (the index): ``partitions`` (what the stage splits), ``params_bytes``,
        ``grads_bytes``, ``optimizer_bytes``, ``total_bytes`` and ``total_gib`` (total / 2**30).

    Raises:
        CourseInputError: a count or byte size that is not a whole number (at least 1; bytes at least 0), or an
            unknown stage.
    """
    param_count = whole_number("param_count", param_count, hint="The model's parameters.")
    world_size = whole_number("world_size", world_size, hint="The devices training together.")
    sizes = {
        "params_bytes": whole_number("param_bytes", param_bytes, minimum=0),
        "grads_bytes": whole_number("grad_bytes", grad_bytes, minimum=0),
        "optimizer_bytes": whole_number("optimizer_bytes", optimizer_bytes, minimum=0),
    }
    stages = ZERO_STAGES if stage is None else (_check_stage("stage", stage),)
    # the first stage that splits each kind of state
    split_from = {"optimizer_bytes": 1, "grads_bytes": 2, "params_bytes": 3}
    rows = []
    for each in stages:
        row: dict[str, Any] = {"stage": each, "partitions": STAGE_PARTITIONS[each]}
        for column, size in sizes.items():
            row[column] = size * param_count / (world_size if each >= split_from[column] else 1)
        row["total_bytes"] = row["params_bytes"] + row["grads_bytes"] + row["optimizer_bytes"]
        row["total_gib"] = row["total_bytes"] / _GIB
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")


def zero_fits(
    param_count: int, device_gib: float, world_size: int = 1, headroom: float = 0.2, **state_bytes: int
) -> pd.DataFrame:
    """Whether a model's states fit one device's memory under each ZeRO stage (see :func:`zero_memory`), with
    ``headroom`` of the device kept free for what the model states leave out: activations, temporary buffers
    (ZeRO's gather and bucket buffers among them), the CUDA context and the allocator's fragmentation.

    Args:
        param_count: the model's parameters.
        device_gib: one device's memory in GiB (2**30 bytes), e.g. 80 for an 80 GB H100 (74.5 GiB in fact).
        world_size: the devices the states are divided over.
        headroom: the fraction of the device kept free, from 0 (the model states alone) to below 1. A fifth is a
            floor, not a promise: activations grow with the batch and the sequence length, so measure them.
        **state_bytes: ``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` as for :func:`zero_memory`.

    Returns:
        One row per stage: ``partitions``, ``total_gib``, ``free_gib`` (what the states leave of the device) and
        ``fits`` (True where ``total_gib <= device_gib * (1 - headroom)``).

    Raises:
        CourseInputError: ``device_gib`` is not a positive number, ``headroom`` is not in [0, 1), or
            :func:`zero_memory` refuses an argument.
    """
    if isinstance(device_gib, bool) or not isinstance(device_gib, numbers.Real) or device_gib <= 0:
        raise CourseInputError(f"device_gib={device_gib!r}: pass one device's memory in GiB, e.g. 16 or 80.")
    if isinstance(headroom, bool) or not isinstance(headroom, numbers.Real) or not 0 <= headroom < 1:
        raise CourseInputError(f"headroom={headroom!r}: pass the fraction of the device kept free, e.g. 0.2.")
    table = zero_memory(param_count, None, world_size, **state_bytes)[["partitions", "total_gib"]]
    return table.assign(
        free_gib=device_gib - table["total_gib"], fits=table["total_gib"] <= device_gib * (1 - headroom)
    )
