"""What the checks that run an answer as ranks of a job share: in this process, ``torchrun``'s environment for a
simulated rank and a record of every ``Trainer.fit`` (stopped before it trains, or not); in a real job, whatever its
launcher, a report that every rank writes to shared storage, and the verdict the reports give when the job fails.

The engine's rank checks share it, whatever launches their ranks (lesson 3: local Horovod; 4.3: TorchDistributor on
the workers; 6.2: Ray Train); 4.5 takes its folders here too.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import cloudpickle

from helpers.course.checks import CheckFailed, Delegated

__all__ = [
    "FitStopped",
    "check_dir",
    "job_failure",
    "rank_report",
    "rank_reports",
    "recorded_fits",
    "report_folder",
    "torchrun_env",
]


def check_dir(name: str) -> Path:
    """A fresh folder for one check under the work directory (shared storage on a real cluster)."""
    from helpers.workdir import work_path

    return work_path("checks", f"{name}-{uuid.uuid4().hex[:8]}")


class FitStopped(Exception):
    """Raised instead of fitting when the check only looks at the Trainer an answer built."""


@contextmanager
def recorded_fits(records: list[dict[str, Any]], stop: bool) -> Iterator[None]:
    """Record the layout of every ``Trainer.fit`` (and the datamodule's shard); fit for real unless ``stop``.

    The hook is ``Trainer._fit_impl``, which ``fit`` calls with positional arguments once the launcher has run:
    ``Trainer.fit`` itself is patched and reverted by MLflow's autolog (``train()`` turns autolog off), which
    would undo a patch there and let a simulated rank wait forever for its peers.
    """
    import pytorch_lightning as pl
    from pytorch_lightning.accelerators import CUDAAccelerator

    original = pl.Trainer._fit_impl

    def fit(trainer, model, train_dataloaders=None, val_dataloaders=None, datamodule=None, *args, **kwargs):
        data = datamodule or train_dataloaders
        records.append(
            {
                "devices": trainer.num_devices,
                "num_nodes": trainer.num_nodes,
                "world_size": trainer.world_size,
                "global_rank": trainer.global_rank,
                "strategy": type(trainer.strategy).__name__,
                "gpu": isinstance(trainer.accelerator, CUDAAccelerator),
                "shard": [getattr(data, "device_id", None), getattr(data, "device_count", None)],
                "max_epochs": trainer.max_epochs,
                "batch_size": getattr(data, "batch_size", None),
                "learning_rate": getattr(model, "learning_rate", None),
            }
        )
        if stop:
            raise FitStopped
        return original(trainer, model, train_dataloaders, val_dataloaders, datamodule, *args, **kwargs)

    pl.Trainer._fit_impl = fit
    try:
        yield
    finally:
        pl.Trainer._fit_impl = original


@contextmanager
def torchrun_env(rank: int, world_size: int, local_mode: bool) -> Iterator[None]:
    """This process's environment as ``torchrun`` sets it for ``rank`` of ``world_size`` (one node with all of them
    locally, one node per process on workers), not a notebook's to Lightning (a torchrun process is not one);
    Lightning's rank-zero state is restored afterwards."""
    from lightning_fabric.utilities import rank_zero as fabric_rank_zero
    from pytorch_lightning.utilities import rank_zero

    from helpers.deepspeed_launcher import job_env

    per_node = world_size if local_mode else 1
    env = {
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": rank % per_node,
        "LOCAL_WORLD_SIZE": per_node,
        "GROUP_RANK": rank // per_node,
        "NODE_RANK": rank // per_node,
        "ROLE_RANK": rank,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29599",
        "TORCHELASTIC_RUN_ID": "check",
    }
    saved_ranks = (rank_zero.rank_zero_only.rank, fabric_rank_zero.rank_zero_only.rank)
    try:
        with (
            job_env(**{key: str(value) for key, value in env.items()}),
            mock.patch("pytorch_lightning.trainer.connectors.accelerator_connector._IS_INTERACTIVE", False),
        ):
            yield
    finally:
        rank_zero.rank_zero_only.rank, fabric_rank_zero.rank_zero_only.rank = saved_ranks


@contextmanager
def report_folder(name: str) -> Iterator[Path]:
    """A fresh folder for the rank reports of one real job of a check, removed when the block ends."""
    record_dir = check_dir(name)
    record_dir.mkdir(parents=True)
    try:
        yield record_dir
    finally:
        shutil.rmtree(record_dir, ignore_errors=True)


@contextmanager
def rank_report(record_dir: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """In a rank of a check's real job: the report this rank fills (``fields``, and its ``rank`` from the launcher's
    environment: ``HOROVOD_RANK``, else ``RANK``), written to ``record_dir/rank-N.pkl`` when the block ends, with the
    error the block raised (re-raised: the job fails).

    Args:
        record_dir: the job's report folder (shared storage on a real cluster).
        fields: the report's own entries and their starting values.
    """
    from helpers.jobs import write_atomically

    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
    report: dict[str, Any] = {"rank": rank, **fields, "error": None, "delegated": False}
    try:
        yield report
    except BaseException as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"[:500]
        report["delegated"] = isinstance(exc, Delegated)
        raise
    finally:
        write_atomically(Path(record_dir, f"rank-{rank}.pkl"), cloudpickle.dumps(report))


def rank_reports(record_dir: Path) -> dict[int, dict[str, Any]]:
    """Every rank's report in a job's report folder, by rank."""
    return {r["rank"]: r for r in (cloudpickle.loads(p.read_bytes()) for p in record_dir.glob("rank-*.pkl"))}


def job_failure(record_dir: Path, job: str, error: Exception) -> CheckFailed:
    """The verdict on a job that failed with ``error``: :class:`Delegated` where a rank's answer called a course
    helper that does the exercise, else the lowest failed rank's error, else the launcher's."""
    failed = [r for _, r in sorted(rank_reports(record_dir).items()) if r["error"]]
    delegated = [r["error"] for r in failed if r["delegated"]]
    if delegated:
        return Delegated(delegated[0].split(": ", 1)[1])
    said = failed[0]["error"] if failed else f"{type(error).__name__}: {str(error)[:400]}"
    return CheckFailed(f"{job} failed: {said}")
