"""Lesson 5: early stopping at several device counts, compared from MLflow.

- :mod:`~helpers.analysis.schema`: the epoch modes and what a run records (``course.*`` tags, metrics).
- :mod:`~helpers.analysis.runs`: training at a device count through ``HorovodRunner`` and recording the run.
- :mod:`~helpers.analysis.tables`: the runs table from ``mlflow.search_runs``; speedup, efficiency, medians.
- :mod:`~helpers.analysis.replay`: why each run stopped, early stopping replayed on its ``val_loss`` history.
- :mod:`~helpers.analysis.plots` and :mod:`~helpers.analysis.claims`: the figures and the sentences.

The analysis reads MLflow only, never variables of the training code.
"""

from __future__ import annotations

from helpers.analysis.claims import claim_report, pitfall_report
from helpers.analysis.plots import plot_pitfall, plot_scaling, plot_val_loss
from helpers.analysis.replay import STOP_REASONS, stop_reason, stop_reasons, val_loss_histories
from helpers.analysis.runs import new_sweep_id, plan_sweep, record_run, run_training
from helpers.analysis.schema import EPOCH_MODES, FIXED_STEPS, ONE_PASS, TAG
from helpers.analysis.tables import medians_by_devices, runs_table, speedup_table

__all__ = [
    "EPOCH_MODES",
    "FIXED_STEPS",
    "ONE_PASS",
    "STOP_REASONS",
    "TAG",
    "claim_report",
    "medians_by_devices",
    "new_sweep_id",
    "pitfall_report",
    "plan_sweep",
    "plot_pitfall",
    "plot_scaling",
    "plot_val_loss",
    "record_run",
    "run_training",
    "runs_table",
    "speedup_table",
    "stop_reason",
    "stop_reasons",
    "val_loss_histories",
]
