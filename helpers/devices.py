"""Which device a training process uses (the CPU or one GPU), and the Lightning accelerator and precision for it.

Free of side effects, so that helpers and notebooks decide the same way everywhere; ``cuda_count`` and ``bf16``
let the tests take the GPU branches on a CPU-only machine.
"""

from __future__ import annotations

import importlib.util

from helpers import CourseInputError
from helpers.validation import check_flag, whole_number

__all__ = [
    "accelerator_for",
    "assigned_gpu",
    "describe_devices",
    "device_for_local_rank",
    "gpu_count",
    "horovod_gpu_support",
    "horovod_installed",
    "precision_for",
    "require_horovod",
]


def gpu_count() -> int:
    """The number of CUDA GPUs this process can use.

    Returns:
        0 without torch's CUDA build, without a GPU, or with a driver that fails to answer.
    """
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:  # a broken driver: treat as no GPU
        return 0


def accelerator_for(use_gpu: bool | None, cuda_count: int | None = None) -> str:
    """The Lightning accelerator for ``use_gpu``, for ``Trainer(accelerator=...)``.

    Args:
        use_gpu: True for a GPU, False for the CPU, None for a GPU when one is visible.
        cuda_count: the number of GPUs to assume instead of detecting them (for tests).

    Returns:
        ``"gpu"`` or ``"cpu"``.

    Raises:
        CourseInputError: ``use_gpu`` is not a flag, or is True on a machine without a GPU (a run meant for GPUs
            should not quietly take hours on the CPU).
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
    """The ``torch.device`` of the process with index ``local_rank`` on its machine (one GPU per process).

    Args:
        local_rank: the process's index on its machine, 0, 1, ...
        use_gpu: True for ``cuda:<local_rank>``, False for the CPU.
        cuda_count: the number of GPUs to assume instead of detecting them (for tests).

    Returns:
        ``torch.device("cuda", local_rank)`` or ``torch.device("cpu")``.

    Raises:
        CourseInputError: a bad argument, or ``local_rank`` has no GPU of its own (more processes on this machine
            than GPUs, e.g. ``HorovodRunner(np=-4)`` on a 2-GPU node).
    """
    import torch

    whole_number("local_rank", local_rank, minimum=0, hint="The process's index on its machine.")
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


def assigned_gpu(local_rank: int) -> int:
    """The GPU index of this process: the one Spark gave its task, else its index on the machine.

    Under Horovod on Spark with GPU scheduling (``spark.task.resource.gpu.amount``), Spark assigns every task a GPU
    and Horovod hands that assignment to the process (``horovod.spark.task.get_available_devices()``): another
    application's tasks may hold the GPUs numbered like our local ranks. TorchDistributor instead restricts
    ``CUDA_VISIBLE_DEVICES`` to the task's GPUs, so there ``local_rank`` (0) is right.

    Args:
        local_rank: the process's index on its machine, used when Spark assigned nothing.

    Returns:
        The CUDA device index to use.
    """
    try:
        from horovod.spark.task import get_available_devices
    except ImportError:
        return local_rank
    addresses = get_available_devices()
    return int(addresses[0]) if addresses else local_rank


def _bf16_supported(use_gpu: bool) -> bool:
    import torch

    if not use_gpu:
        return True
    try:
        return bool(torch.cuda.is_bf16_supported())
    except (AssertionError, RuntimeError):  # torch without CUDA asserts; a broken driver raises
        return False


def precision_for(mixed_precision: bool, use_gpu: bool, bf16: bool | None = None) -> str:
    """``Trainer(precision=...)`` for a run with or without automatic mixed precision.

    Args:
        mixed_precision: whether to train with 16-bit automatic mixed precision.
        use_gpu: whether the run is on a GPU.
        bf16: whether bfloat16 is supported, instead of detecting it (for tests).

    Returns:
        ``"32-true"`` without mixed precision; with it, ``"bf16-mixed"`` where bfloat16 is supported (the CPU,
        Ampere and newer GPUs such as A100/H100), else ``"16-mixed"`` (float16 with a gradient scaler, on older
        GPUs such as the T4 or V100).

    Raises:
        CourseInputError: ``mixed_precision`` or ``use_gpu`` is not True or False.
    """
    check_flag("mixed_precision", mixed_precision)
    check_flag("use_gpu", use_gpu)
    if not mixed_precision:
        return "32-true"
    supported = _bf16_supported(use_gpu) if bf16 is None else bf16
    return "bf16-mixed" if supported else "16-mixed"


def horovod_gpu_support() -> dict[str, bool]:
    """What the installed Horovod can do with GPUs.

    GPU training with Horovod needs ``cuda`` and ``nccl``: build it with ``make setup GPU=1`` on a machine with
    CUDA and NCCL (``scripts/install_horovod.sh`` sets ``HOROVOD_GPU_OPERATIONS=NCCL``).

    Returns:
        ``{"installed", "cuda", "nccl", "gloo"}``, each True or False.
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


def horovod_installed() -> bool:
    """Whether Horovod's PyTorch binding can be imported here, found without importing it.

    Returns:
        False where ``horovod`` is missing or cannot be imported (Databricks Runtime 16.0 ML and later).
    """
    try:
        return importlib.util.find_spec("horovod.torch") is not None
    except ImportError:  # the package itself fails to import
        return False


def require_horovod(what: str) -> None:
    """Refuse to go on without Horovod, in one line that says what to do instead.

    Args:
        what: what needs Horovod, for the message (``"Lesson 3"``).

    Raises:
        CourseInputError: Horovod (with its PyTorch binding) cannot be imported here.
    """
    if not horovod_installed():
        raise CourseInputError(
            f"{what} needs Horovod, which is not installed here (Databricks Runtime 16.0 ML and later ship none; "
            "15.4 LTS ML is the last): run `make setup` on your machine or use 15.4 LTS ML, or go on with lesson 4 "
            "and LAUNCHER='torch_distributor'."
        )


def describe_devices() -> str:
    """One line about this machine's GPUs.

    Returns:
        e.g. ``2 GPU(s): NVIDIA T4 (15 GiB), ...; torch 2.x, CUDA 12.x`` or ``no GPU (CPU only; torch 2.x)``.
    """
    import torch

    count = gpu_count()
    if count == 0:
        return f"no GPU (CPU only; torch {torch.__version__})"
    names = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        names.append(f"{props.name} ({props.total_memory / 1024**3:.0f} GiB)")
    return f"{count} GPU(s): {', '.join(names)}; torch {torch.__version__}, CUDA {torch.version.cuda}"
