"""``HorovodStrategy``: data-parallel training over Horovod for PyTorch Lightning 2.x, which dropped its own.

It runs inside every process that ``HorovodRunner`` (or ``horovodrun``) starts; each process builds its own Trainer
with one device, ``pl.Trainer(strategy=HorovodStrategy(), accelerator="cpu", devices=1)`` (or ``"gpu"``), and
``strategy="horovod"`` works too once this module is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.distributed import ReduceOp
from pytorch_lightning.core.optimizer import LightningOptimizer
from pytorch_lightning.strategies import ParallelStrategy, StrategyRegistry
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.rank_zero import rank_zero_only
from torch import Tensor
from torch.optim import Optimizer

from helpers.devices import assigned_gpu
from helpers.validation import check_flag, one_of

__all__ = ["HorovodStrategy"]

_SCALED_MARK = "_course_horovod_lr_scaled"


def _hvd() -> Any:
    """The ``horovod.torch`` module (imported on first use, so this module imports without Horovod)."""
    import horovod.torch as hvd

    return hvd


def _env_int(name: str, default: int) -> int:
    """An integer Horovod launch variable, for use before ``hvd.init()``."""
    return int(os.environ.get(name, default))


def _horovod_op(reduce_op: ReduceOp | str | None) -> Any:
    """Map Lightning's reduce op (``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or a ``ReduceOp``) to Horovod's."""
    hvd = _hvd()
    name = "mean" if reduce_op is None else reduce_op if isinstance(reduce_op, str) else reduce_op.name
    ops = {"mean": hvd.Average, "avg": hvd.Average, "sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min}
    return ops[one_of("reduce_op", name.lower(), ops)]


def _raw(optimizer: Optimizer) -> Optimizer:
    """The optimizer inside a ``LightningOptimizer`` (or the optimizer itself)."""
    return optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def _is_distributed(optimizer: Optimizer) -> bool:
    """True for an optimizer already wrapped by ``hvd.DistributedOptimizer``."""
    return hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize")


class HorovodStrategy(ParallelStrategy):
    """Lightning strategy for data-parallel training over Horovod (Gloo on CPU, NCCL or Gloo on GPU).

    It applies the Horovod recipe: ``hvd.init()`` in ``setup_environment``, one GPU per process (``cuda:<local
    rank>``); every optimizer's learning rate multiplied by ``hvd.size()`` once (``base_lrs`` and ``scaled_lrs``
    keep both: do not scale it yourself as well); the optimizers wrapped in ``hvd.DistributedOptimizer``
    (``backward_passes_per_step`` = ``accumulate_grad_batches``) and the parameters and optimizer state broadcast
    from rank 0; ``reduce`` (``self.log(..., sync_dist=True)``), ``all_gather``, ``broadcast`` and ``barrier``
    through Horovod; checkpoints and loggers on rank 0 only.

    Lightning runs the backward pass inside ``optimizer.step(closure)``, after the point where Horovod's own step
    would synchronize the gradients. So the strategy waits for the averaged gradients right after each backward
    pass (``optimizer.synchronize()``) and steps inside ``skip_synchronize()``: gradient clipping then clips the
    averaged gradients, the same on every rank. While Lightning accumulates gradients nothing is synchronized.

    Limitations: ``group`` arguments are ignored (one global group); an LR scheduler keeps the unwrapped optimizer,
    which shares its parameter groups, so schedules apply, but torch may warn once that ``lr_scheduler.step()``
    came before ``optimizer.step()``.

    Args:
        scale_lr: multiply the learning rates by the world size; False keeps them as configured, right when the
            *global* batch is kept fixed (per-process batch = global batch / processes).
        accelerator: Lightning's accelerator (the Trainer sets it).
        **kwargs: ``ParallelStrategy``'s (``parallel_devices``, ``checkpoint_io``, ``precision_plugin``).

    Raises:
        CourseInputError: ``scale_lr`` is not True or False.
    """

    strategy_name = "horovod"

    def __init__(
        self, scale_lr: bool = True, accelerator: pl.accelerators.Accelerator | None = None, **kwargs: Any
    ) -> None:
        check_flag("scale_lr", scale_lr)
        super().__init__(accelerator=accelerator, **kwargs)
        self.scale_lr = scale_lr
        self.base_lrs: list[list[float]] = []
        self.scaled_lrs: list[list[float]] = []
        self._sync_blocked = False

    # --- ranks and devices -------------------------------------------------------------------------------------

    @property
    def global_rank(self) -> int:
        """``hvd.rank()`` (from Horovod's launch variables before ``hvd.init()``)."""
        hvd = _hvd()
        return hvd.rank() if hvd.is_initialized() else _env_int("HOROVOD_RANK", 0)

    @property
    def local_rank(self) -> int:
        """``hvd.local_rank()``: the process's index on its machine, and its GPU."""
        hvd = _hvd()
        return hvd.local_rank() if hvd.is_initialized() else _env_int("HOROVOD_LOCAL_RANK", 0)

    @property
    def node_rank(self) -> int:
        """``hvd.cross_rank()``: the machine's index."""
        hvd = _hvd()
        return hvd.cross_rank() if hvd.is_initialized() else _env_int("HOROVOD_CROSS_RANK", 0)

    @property
    def world_size(self) -> int:
        """``hvd.size()``: the number of processes."""
        hvd = _hvd()
        return hvd.size() if hvd.is_initialized() else _env_int("HOROVOD_SIZE", 1)

    @property
    def root_device(self) -> torch.device:
        """On GPU the one GPU of this process (``cuda:<local rank>``, or the GPU Spark assigned to its task, see
        :func:`helpers.devices.assigned_gpu`), else the accelerator's device (the CPU)."""
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", assigned_gpu(self.local_rank))
        return devices[0]

    @property
    def is_distributed(self) -> bool:
        """Tells Lightning to sync ``self.log(..., sync_dist=True)`` through ``reduce`` (it asks custom strategies)."""
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Shard map-style datasets over all Horovod processes."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        """Start Horovod, pin this process's GPU, and make rank-zero-only logging use Horovod's rank."""
        _hvd().init()
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        rank_zero_only.rank = self.global_rank
        super().setup_environment()

    # --- model and optimizers ----------------------------------------------------------------------------------

    def model_to_device(self) -> None:
        """Move the model to this process's device."""
        assert self.model is not None
        self.model.to(self.root_device)

    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        """Create the optimizers and schedulers, then scale their learning rates by the world size."""
        super().setup_optimizers(trainer)
        self._scale_learning_rates()

    def _scale_learning_rates(self) -> None:
        """Multiply each parameter group's lr (and its schedulers' base lrs) by ``world_size``, once per optimizer."""
        size = self.world_size if self.scale_lr else 1
        self.base_lrs, self.scaled_lrs = [], []
        for optimizer in self.optimizers:
            already = getattr(optimizer, _SCALED_MARK, False)
            self.base_lrs.append([group["lr"] / (size if already else 1) for group in optimizer.param_groups])
            if not already:
                for group in optimizer.param_groups:
                    group["lr"] *= size
                    if "initial_lr" in group:
                        group["initial_lr"] *= size
                setattr(optimizer, _SCALED_MARK, True)
                for config in self.lr_scheduler_configs:
                    scheduler = config.scheduler
                    if scheduler.optimizer is optimizer and hasattr(scheduler, "base_lrs"):
                        scheduler.base_lrs = [lr * size for lr in scheduler.base_lrs]
                        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
            self.scaled_lrs.append([group["lr"] for group in optimizer.param_groups])

    def setup(self, trainer: pl.Trainer) -> None:
        """Set up as usual, then (when fitting) wrap the optimizers and broadcast the initial state from rank 0."""
        super().setup(trainer)
        hvd = _hvd()
        assert self.model is not None
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self.optimizers = [self._distributed(opt, trainer.accumulate_grad_batches) for opt in self.optimizers]
        for lightning_optimizer, optimizer in zip(self._lightning_optimizers, self.optimizers):
            # Horovod's optimizer class calls super(self.__class__, self), which recurses forever when Lightning's
            # wrapper class (what self.optimizers() returns in manual optimization) subclasses it: send these
            # calls straight to the Horovod optimizer.
            for method in ("zero_grad", "load_state_dict"):
                setattr(lightning_optimizer, method, getattr(optimizer, method))
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def _distributed(self, optimizer: Optimizer, passes: int) -> Optimizer:
        """Wrap ``optimizer`` in ``hvd.DistributedOptimizer``, naming exactly the parameters it optimizes."""
        if _is_distributed(optimizer):
            return optimizer
        assert self.lightning_module is not None
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(name, p) for name, p in self.lightning_module.named_parameters() if id(p) in owned]
        return _hvd().DistributedOptimizer(optimizer, named_parameters=named, backward_passes_per_step=passes)

    # --- gradient synchronization ------------------------------------------------------------------------------

    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        """Backward pass, then wait for the averaged gradients (unless Lightning is accumulating)."""
        closure_loss = super().backward(closure_loss, optimizer, *args, **kwargs)
        if not self._sync_blocked:
            for opt in [optimizer] if optimizer is not None else self.optimizers:
                if _is_distributed(_raw(opt)):
                    _raw(opt).synchronize()
        return closure_loss

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: pl.LightningModule | torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Step without Horovod's own synchronization: ``backward`` already averaged the gradients."""
        raw = _raw(optimizer)
        skip = raw.skip_synchronize() if _is_distributed(raw) else nullcontext()
        with skip:
            return super().optimizer_step(optimizer, closure, model, **kwargs)

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """While Lightning accumulates gradients, do not synchronize after backward."""
        self._sync_blocked = True
        try:
            yield
        finally:
            self._sync_blocked = False

    # --- collectives -------------------------------------------------------------------------------------------

    def reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean") -> Any:
        """Allreduce a tensor over all processes (mean, sum, max or min); other values are returned unchanged."""
        if not isinstance(tensor, Tensor):
            return tensor
        op = _horovod_op(reduce_op)
        if op == _hvd().Average and not tensor.is_floating_point():
            tensor = tensor.float()
        return _hvd().allreduce(tensor, op=op)

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Stack every process's ``tensor`` into shape ``(world_size, *tensor.shape)``."""
        context = nullcontext() if sync_grads else torch.no_grad()
        with context:
            return _hvd().allgather(tensor.unsqueeze(0))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Send any picklable object from rank ``src`` to all processes."""
        return _hvd().broadcast_object(obj, root_rank=src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process gets here (a no-op before Horovod starts)."""
        hvd = _hvd()
        if hvd.is_initialized():
            hvd.barrier()


if "horovod" not in StrategyRegistry:
    StrategyRegistry.register("horovod", HorovodStrategy, description="Data-parallel training over Horovod")
