"""Which device a training process uses: CPU or one GPU, the Lightning accelerator and precision that go with it.

Small and without side effects, so that the helpers and notebooks take the same decisions everywhere and the tests
can exercise the GPU branches on a CPU-only machine (``cuda_count`` lets them pretend there are GPUs):

* ``gpu_available()`` / ``gpu_count()``: CUDA GPUs visible to this process;
* ``accelerator_for(use_gpu)``: ``"gpu"`` or ``"cpu"`` for ``Trainer(accelerator=...)`` (``use_gpu=None``: a GPU
  if there is one); asking for a GPU where there is none is a :class:`~helpers.CourseInputError`, not a silent CPU
  run;
* ``device_for_local_rank(local_rank, use_gpu)``: one GPU per process, ``cuda:<local rank>`` (the Horovod recipe);
  more processes on a machine than GPUs is an error that says so;
* ``precision_for(mixed_precision, use_gpu)``: ``Trainer(precision=...)``: ``"32-true"``, or automatic mixed
  precision (``"bf16-mixed"`` where the GPU supports bfloat16, else ``"16-mixed"``; ``"bf16-mixed"`` on CPU);
* ``horovod_gpu_support()``: whether the installed Horovod was built with CUDA and NCCL (``make setup GPU=1``);
* ``check_flag(name, value)``: ``use_gpu``, ``mixed_precision`` and the like must be True or False.
"""

from __future__ import annotations

from typing import Any

from helpers import CourseInputError

__all__ = [
    "PRECISIONS",
    "accelerator_for",
    "check_flag",
    "describe_devices",
    "device_for_local_rank",
    "gpu_available",
    "gpu_count",
    "horovod_gpu_support",
    "precision_for",
]

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")


def gpu_count() -> int:
    """The number of CUDA GPUs this process can use (0 without torch's CUDA build or without a GPU)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:  # a broken driver: treat as no GPU
        return 0


def gpu_available() -> bool:
    """True when at least one CUDA GPU is usable here."""
    return gpu_count() > 0


def check_flag(name: str, value: Any, allow_none: bool = False) -> None:
    """Raise :class:`CourseInputError` unless ``value`` is True or False (or None with ``allow_none``): a flag
    such as ``use_gpu`` given as ``"yes"`` or ``1`` is a mistake, not a truthy value."""
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        extra = ", or None to use a GPU when there is one" if allow_none else ""
        raise CourseInputError(f"{name}={value!r}: pass True or False{extra}.")


def accelerator_for(use_gpu: bool | None, cuda_count: int | None = None) -> str:
    """The Lightning accelerator for ``use_gpu``: ``"gpu"`` or ``"cpu"``.

    ``use_gpu=None`` picks ``"gpu"`` when a GPU is visible. ``use_gpu=True`` without a GPU raises
    :class:`CourseInputError` (a run meant for GPUs should not quietly take hours on the CPU). ``cuda_count``
    overrides the detected number of GPUs (for tests).
    """
    check_flag("use_gpu", use_gpu, allow_none=True)
    count = gpu_count() if cuda_count is None else cuda_count
    if use_gpu is None:
        return "gpu" if count > 0 else "cpu"
    if use_gpu and count == 0:
        raise CourseInputError(
            "use_gpu=True, but this machine has no CUDA GPU that torch can use (torch.cuda.is_available() is "
            "False): use_gpu=False runs on the CPU; on a GPU machine install torch's CUDA build."
        )
    return "gpu" if use_gpu else "cpu"


def device_for_local_rank(local_rank: int, use_gpu: bool, cuda_count: int | None = None):
    """The ``torch.device`` of the process with index ``local_rank`` on its machine: ``cuda:<local_rank>`` on GPU
    (one GPU per process), the CPU otherwise.

    Raises :class:`CourseInputError` when ``local_rank`` has no GPU of its own (more processes on this machine
    than GPUs: e.g. ``HorovodRunner(np=-4)`` on a 2-GPU node). ``cuda_count`` overrides detection (for tests).
    """
    import torch

    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0:
        raise CourseInputError(f"local_rank={local_rank!r}: pass the process's index on its machine, 0, 1, ...")
    check_flag("use_gpu", use_gpu)
    if not use_gpu:
        return torch.device("cpu")
    count = gpu_count() if cuda_count is None else cuda_count
    if local_rank >= count:
        raise CourseInputError(
            f"local rank {local_rank} needs GPU {local_rank}, but this machine has {count} GPU(s): start at most "
            f"{count} process(es) per machine (HorovodRunner(np=-{max(count, 1)}), or one Spark task per GPU)."
        )
    return torch.device("cuda", local_rank)


def _bf16_supported(use_gpu: bool) -> bool:
    import torch

    if not use_gpu:
        return True
    try:
        return bool(torch.cuda.is_bf16_supported())
    except (AssertionError, RuntimeError):
        return False


def precision_for(mixed_precision: bool, use_gpu: bool, bf16: bool | None = None) -> str:
    """``Trainer(precision=...)``: ``"32-true"`` without mixed precision; with it, ``"bf16-mixed"`` where bfloat16
    is supported (the CPU, Ampere and newer GPUs such as A100/H100) and ``"16-mixed"`` (float16 with a gradient
    scaler) on older GPUs such as the T4 or V100. ``bf16`` overrides the detection (for tests)."""
    check_flag("mixed_precision", mixed_precision)
    check_flag("use_gpu", use_gpu)
    if not mixed_precision:
        return "32-true"
    supported = _bf16_supported(use_gpu) if bf16 is None else bf16
    return "bf16-mixed" if supported else "16-mixed"


def horovod_gpu_support() -> dict[str, bool]:
    """What the installed Horovod can do with GPUs: ``{"installed", "cuda", "nccl", "gloo"}``.

    GPU training with Horovod needs ``cuda`` and ``nccl``: build it with ``make setup GPU=1`` on a machine with
    CUDA and NCCL (``scripts/install_horovod.sh`` sets ``HOROVOD_GPU_OPERATIONS=NCCL``).
    """
    try:
        import horovod.torch as hvd
    except ImportError:
        return {"installed": False, "cuda": False, "nccl": False, "gloo": False}
    return {
        "installed": True,
        "cuda": bool(hvd.cuda_built()),
        "nccl": bool(hvd.nccl_built()),
        "gloo": bool(hvd.gloo_built()),
    }


def describe_devices() -> str:
    """One line about this machine's GPUs, e.g. ``2 GPU(s): NVIDIA T4 (15 GiB), ...`` or ``no GPU (CPU only)``."""
    import torch

    count = gpu_count()
    if count == 0:
        return f"no GPU (CPU only; torch {torch.__version__})"
    names = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        names.append(f"{props.name} ({props.total_memory / 1024**3:.0f} GiB)")
    return f"{count} GPU(s): {', '.join(names)}; torch {torch.__version__}, CUDA {torch.version.cuda}"
