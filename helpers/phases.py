"""Where a training job's time goes: start-up, rendezvous, fit and clean-up, measured, not guessed.

Two clocks are read. Global rank 0's training (``helpers.training.train``, ``helpers.deepspeed_train``) reads the
wall clock when its training function is called, when every rank is connected (the process group is up and a
first barrier passed) and when the fit is done, and logs the three times (:data:`RANK_CLOCKS`) in its MLflow run.
The driver reads it when it calls the launcher and when the launcher returns (:func:`job_clock`) and logs those
too (:func:`log_job_clock`). :func:`phases` turns the five times into four durations:

- **start-up**: launcher called -> rank 0's training function runs (the Spark job, task or actor start, the
  processes and their imports);
- **rendezvous**: -> all ranks connected (the model, the data loaders' set-up, the process group, a barrier);
- **fit**: -> the fit is done (the epochs with their validation and checkpoints);
- **clean-up**: -> the launcher returns (the model logged and registered in MLflow, the processes ending, the
  launcher's own tear-down).

The driver's and rank 0's clocks are one clock on one machine; on a cluster they are the hosts' clocks, which NTP
keeps within milliseconds of each other.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pandas as pd

from helpers.tracking import resolve_uri

__all__ = ["JOB_CLOCKS", "PHASES", "RANK_CLOCKS", "JobClock", "RankClock", "job_clock", "log_job_clock", "phases"]

RANK_CLOCKS = ("train_called_at", "ranks_connected_at", "fit_done_at")  # rank 0's, in its MLflow run
JOB_CLOCKS = ("job_started_at", "job_ended_at")  # the driver's, around the launcher
PHASES = ("start_up_s", "rendezvous_s", "fit_s", "clean_up_s")


@dataclass
class RankClock:
    """Rank 0's clock readings: made when the training function is called; ``connected`` and ``fit_done`` later."""

    called_at: float = field(default_factory=time.time)
    connected_at: float | None = None
    fit_done_at: float | None = None

    def connected(self) -> None:
        """Every rank is connected (read the clock now)."""
        self.connected_at = time.time()

    def fit_done(self) -> None:
        """The fit is done (read the clock now)."""
        self.fit_done_at = time.time()

    def metrics(self) -> dict[str, float]:
        """The readings as MLflow metrics (:data:`RANK_CLOCKS`); a reading not taken is left out."""
        readings = (self.called_at, self.connected_at, self.fit_done_at)
        return {name: at for name, at in zip(RANK_CLOCKS, readings) if at is not None}


@dataclass
class JobClock:
    """The driver's clock readings around one launcher call."""

    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None


@contextlib.contextmanager
def job_clock() -> Iterator[JobClock]:
    """Read the clock when the block starts and when it ends (also by an exception)."""
    clock = JobClock()
    try:
        yield clock
    finally:
        clock.ended_at = time.time()


def log_job_clock(run_id: str, clock: JobClock, tracking_uri: str | None = None) -> None:
    """Add the driver's readings (:data:`JOB_CLOCKS`) to the job's MLflow run ``run_id`` in ``tracking_uri``
    (default: the store ``setup_mlflow`` set in this process, else the course's local store)."""
    from mlflow.tracking import MlflowClient  # imported here: a training process imports this module to read its clock

    client = MlflowClient(resolve_uri(tracking_uri))
    for name, at in zip(JOB_CLOCKS, (clock.started_at, clock.ended_at)):
        client.log_metric(run_id, name, at)


def phases(metrics: Mapping[str, float]) -> pd.Series:
    """A run's four phases in seconds (:data:`PHASES`), from its metrics; NaN where a reading is missing.

    Args:
        metrics: a run's metrics (``MlflowClient().get_run(id).data.metrics``, or a row of ``mlflow.search_runs``
            with the ``metrics.`` prefix removed).

    Returns:
        ``start_up_s``, ``rendezvous_s``, ``fit_s``, ``clean_up_s``.
    """
    names = (JOB_CLOCKS[0], *RANK_CLOCKS, JOB_CLOCKS[1])
    times = [float(metrics.get(name, float("nan"))) for name in names]
    return pd.Series([later - earlier for earlier, later in zip(times, times[1:])], index=list(PHASES))
