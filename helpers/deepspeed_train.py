"""The training file ``DeepspeedTorchDistributor`` runs: lesson 2's network trained by a DeepSpeed engine under ZeRO.

The distributor starts ``python -m torch.distributed.run ... deepspeed_train.py --job JOB --deepspeed
--deepspeed_config CONFIG`` (see :mod:`helpers.deepspeed_launcher`). :func:`main` loads the job's call from the job
folder (a :class:`helpers.jobs.WorkerCall` around the training function, made on the driver) and runs it with the
config's path; every process leaves its process group cleanly, the job's last collective, and ends without the
interpreter's teardown (see :func:`_exit_without_teardown`).

:func:`train_zero` is the training function: Lightning's DeepSpeed strategy runs on CUDA GPUs only, so on the CPU
it is a plain PyTorch loop around ``deepspeed.initialize``: ``engine(features)``, ``engine.backward(loss)``,
``engine.step()``, over lesson 1's Petastorm shards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "CALL_FILE",
    "build_ops",
    "join_process_group",
    "main",
    "ops_build_dir",
    "train_zero",
    "zero_engine",
]

# DeepSpeed 0.19 calls torch.distributed's collectives under their pre-2.13 names (a FutureWarning on every call)
_DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
CALL_FILE = "call.pkl"  # in the job folder: (WorkerCall, keyword arguments), written by the launcher


def ops_build_dir() -> Path:
    """Where DeepSpeed JIT-builds its C++ ops (the CPU shared-memory allreduce): ``TORCH_EXTENSIONS_DIR`` if set,
    else ``deepspeed-ops`` in this Python environment, where ``make setup`` builds it (:func:`build_ops`), else
    (an environment that cannot be written) ``deepspeed-ops-<uid>`` in the temporary folder; never the repository's
    tracked files or the work directory.

    Returns:
        The folder (one build serves every later job in this environment).
    """
    chosen = os.environ.get("TORCH_EXTENSIONS_DIR")
    if chosen:
        return Path(chosen)
    if os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "deepspeed-ops"
    return Path(tempfile.gettempdir()) / f"deepspeed-ops-{os.getuid()}"


def _prepare_build() -> None:
    """Point torch's extension builder at :func:`ops_build_dir`, with this interpreter's ``ninja`` on ``PATH``."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(ops_build_dir())
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])


def build_ops() -> Path:
    """Build DeepSpeed's CPU communication op in :func:`ops_build_dir` now (about a minute on 2 cores), rather
    than in a lesson's first job (``make setup`` does; a GPU job uses NCCL instead).

    Returns:
        The built library.
    """
    from helpers.zero import load_deepspeed

    _prepare_build()
    load_deepspeed(use_gpu=False)
    from deepspeed.accelerator import get_accelerator

    return Path(get_accelerator().create_op_builder("ShareMemCommBuilder").load().__file__)


def _input_dtype(engine):
    """The dtype the engine's parameters compute in (its inputs must match: the engine casts none)."""
    import torch

    if engine.bfloat16_enabled():
        return torch.bfloat16
    return torch.float16 if engine.fp16_enabled() else torch.float32


def _train_epoch(engine, batches: Iterable[dict], device, dtype) -> float:
    """One epoch of DeepSpeed steps; the mean training loss over every rank's rows."""
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F

    engine.train()
    totals = torch.zeros(2, dtype=torch.float64)
    for batch in batches:
        labels = batch["label_index"].to(device)
        logits = engine(batch["features"].to(device, dtype))
        loss = F.cross_entropy(logits.float(), labels)
        engine.backward(loss)
        engine.step()
        totals += torch.tensor([loss.item() * len(labels), len(labels)], dtype=torch.float64)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def _validate(engine, batches: Iterable[dict], device, dtype) -> tuple[float, float]:
    """Validation loss and accuracy over every rank's whole shard.

    Shards may differ by a batch; under ZeRO stage 3 every forward pass gathers parameters from all ranks, so a rank
    whose shard is done keeps joining the others' forward passes (on its last batch, counted zero times).
    """
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F

    engine.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, rows
    iterator, last = iter(batches), None
    with torch.no_grad():
        while True:
            batch = next(iterator, None)
            more = torch.tensor([batch is not None], dtype=torch.int64)
            dist.all_reduce(more)
            if more.item() == 0:
                break
            counted = batch is not None
            batch = batch if counted else last
            last = batch
            labels = batch["label_index"].to(device)
            logits = engine(batch["features"].to(device, dtype)).float()
            if counted:
                loss = F.cross_entropy(logits, labels, reduction="sum").item()
                correct = (logits.argmax(dim=1) == labels).sum().item()
                totals += torch.tensor([loss, correct, len(labels)], dtype=torch.float64)
    dist.all_reduce(totals)
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


@contextlib.contextmanager
def _mlflow_run(settings, enabled: bool) -> Iterator[Any]:
    """On rank 0 with an experiment: one MLflow run tagged ``launcher=deepspeed``, recorded in the job folder so
    the driver can end it FAILED. Elsewhere: None."""
    if not enabled:
        yield None
        return
    import mlflow

    from helpers.jobs import record_mlflow_run
    from helpers.tracking import setup_mlflow

    experiment_id = setup_mlflow(settings.mlflow_experiment, settings.tracking_uri)
    tags = {"launcher": "deepspeed"}
    with mlflow.start_run(experiment_id=experiment_id, run_name=settings.run_name, tags=tags) as run:
        record_mlflow_run(run.info.run_id, mlflow.get_tracking_uri())
        yield run


def _run_params(engine, settings, world_size: int, class_count: int) -> dict[str, Any]:
    """The MLflow parameters of a run: the ZeRO stage and precision as the engine has them, and the settings."""
    return {
        "zero_stage": engine.zero_optimization_stage(),
        "world_size": world_size,
        "batch_size": settings.batch_size,
        "learning_rate": settings.learning_rate,
        "effective_learning_rate": engine.get_lr()[0],
        "precision": str(_input_dtype(engine)).removeprefix("torch."),
        "backbone": settings.backbone,
        "image_size": settings.image_size,
        "class_count": class_count,
        **settings.extra_params,
    }


def join_process_group(use_gpu: bool):
    """Import DeepSpeed and set up this process's process group if it has none yet (Gloo on the CPU, NCCL between
    GPUs; the stall bound as its timeout, so that a collective waiting longer raises: a stall, not a hang).

    Args:
        use_gpu: whether this process trains on a CUDA GPU.

    Returns:
        The ``deepspeed`` module.
    """
    from helpers.distributor import process_group_backend
    from helpers.jobs import stall_timeout_s
    from helpers.zero import load_deepspeed

    _prepare_build()
    deepspeed = load_deepspeed(use_gpu)
    deepspeed.init_distributed(
        dist_backend=process_group_backend(use_gpu), timeout=timedelta(seconds=stall_timeout_s())
    )
    return deepspeed


def zero_engine(network, deepspeed_config: str | dict, use_gpu: bool):
    """``deepspeed.initialize`` on ``network`` (trainable parameters only), in this process's process group
    (:func:`join_process_group`).

    Args:
        network: the ``torch.nn.Module`` to train.
        deepspeed_config: the DeepSpeed config, its file's path or a dict.
        use_gpu: whether this process trains on a CUDA GPU.

    Returns:
        DeepSpeed's engine: ``engine(inputs)``, ``engine.backward(loss)``, ``engine.step()``.
    """
    deepspeed = join_process_group(use_gpu)
    trainable = [p for p in network.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=network, model_parameters=trainable, config=deepspeed_config)
    return engine


def train_zero(train_converter, val_converter, class_count: int, settings, deepspeed_config: str):
    """Train lesson 2's network with a DeepSpeed engine in this process (one rank of a ``torchrun`` job).

    Args:
        train_converter, val_converter: lesson 1's Petastorm converters; this rank reads shard ``RANK`` of each.
        class_count: the number of classes.
        settings: a :class:`helpers.worker.TrainSettings`; its ``learning_rate`` is already in the config.
        deepspeed_config: the DeepSpeed config file (``--deepspeed_config``).

    Returns:
        A :class:`helpers.training.TrainResult` on global rank 0 (``history``: per-epoch ``train_loss``,
        ``val_loss``, ``val_acc``), None on the other ranks.
    """
    import mlflow
    import torch

    from helpers.datamodule import PetastormDataModule
    from helpers.model import make_network
    from helpers.phases import RankClock
    from helpers.training import TrainResult
    from helpers.workdir import ENV_VAR

    clock = RankClock()  # the training function is called now (helpers.phases)
    os.environ[ENV_VAR] = settings.work_dir
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if settings.use_gpu else torch.device("cpu")
    torch.manual_seed(settings.seed)  # the same initial weights on every rank, whatever the stage
    network = make_network(class_count, settings.backbone, settings.pretrained)
    # one reader thread: the same settings read the same first epoch's batches in the same order (later passes of the
    # endless reader depend on timing: Petastorm's ventilator reshuffles while its queue is full), so stages compare
    # step by step there
    data = PetastormDataModule(
        train_converter,
        val_converter,
        settings.batch_size,
        settings.image_size,
        device_id=rank,
        device_count=world_size,
        workers_count=1,
    )
    history: list[dict[str, float]] = []
    # the run opens first, so that a job failing in deepspeed.initialize is recorded (and ended FAILED) too
    with _mlflow_run(settings, rank == 0 and settings.mlflow_experiment is not None) as run:
        engine = zero_engine(network, deepspeed_config, settings.use_gpu)
        clock.connected()  # deepspeed.initialize returns once every rank has the same parameters
        dtype = _input_dtype(engine)
        if run is not None:
            mlflow.log_params(_run_params(engine, settings, world_size, class_count))
            mlflow.log_artifact(deepspeed_config)
        started = time.perf_counter()
        train_batches, val_batches = data.train_dataloader(), data.val_dataloader()
        try:
            for epoch in range(settings.max_epochs):
                train_loss = _train_epoch(engine, train_batches, device, dtype)
                val_loss, val_acc = _validate(engine, val_batches, device, dtype)
                history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss, "val_acc": val_acc})
                if run is not None:
                    mlflow.log_metrics({"train_loss": train_loss, "val_loss": val_loss, "val_acc": val_acc}, epoch)
        finally:
            data.teardown("fit")
        wall_time_s = time.perf_counter() - started
        clock.fit_done()
        if run is not None:
            mlflow.log_metrics({"wall_time_s": wall_time_s, **clock.metrics()})
    if rank != 0:
        return None
    return TrainResult(
        epochs_run=len(history),
        best_val_loss=min(row["val_loss"] for row in history),
        last_val_loss=history[-1]["val_loss"],
        val_acc=history[-1]["val_acc"],
        wall_time_s=wall_time_s,
        best_checkpoint=None,
        last_checkpoint=None,
        stopped_reason="max_epochs",
        mlflow_run_id=run.info.run_id if run is not None else None,
        history=history,
    )


def _leave_process_group() -> None:
    """End this process's part of the job cleanly: wait for every rank, then destroy the process group (left to
    the interpreter's exit, the communication threads are killed mid-flight: "terminate called without an active
    exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _exit_without_teardown() -> None:
    """End the process now that its work is done and recorded, without the interpreter's teardown: there DeepSpeed's
    and torch's C++ objects are destroyed in no fixed order, and under load about one ZeRO stage 3 job in ten had a
    rank abort there ("terminate called without an active exception", no Python frame left on the main thread),
    which torchrun reports as a failed job although every rank had finished (as ``multiprocessing``'s children do,
    the process ends with ``os._exit``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the job's call in this process (what ``python deepspeed_train.py --job JOB ...`` does).

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``): ``--job`` (the job folder),
            ``--deepspeed`` and ``--deepspeed_config PATH`` (added by ``DeepspeedTorchDistributor``); or
            ``--build-ops`` alone (:func:`build_ops`).
    """
    import cloudpickle

    # what every rank would print, dozens of times a run: deprecations for the libraries' authors, not the learner
    warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
    warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVES, category=FutureWarning)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    task = parser.add_mutually_exclusive_group(required=True)
    task.add_argument("--job", help="the job folder (helpers.jobs.JobFolder)")
    task.add_argument("--build-ops", action="store_true", help="build DeepSpeed's CPU op and exit (make setup)")
    parser.add_argument("--deepspeed", action="store_true", help="set by DeepspeedTorchDistributor")
    parser.add_argument("--deepspeed_config", default=None, help="the DeepSpeed config file")
    args = parser.parse_args(argv)
    if args.build_ops:
        print(f"DeepSpeed's CPU communication op: {build_ops()}")
        return
    call, kwargs = cloudpickle.loads((Path(args.job) / CALL_FILE).read_bytes())
    call(deepspeed_config=args.deepspeed_config, **kwargs)
    _leave_process_group()
    _exit_without_teardown()


if __name__ == "__main__":
    # run as a file: Python put helpers/ first on sys.path, where its modules would shadow top-level ones
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    main()
