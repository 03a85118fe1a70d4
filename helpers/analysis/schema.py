"""What lesson 5 records on an MLflow run and reads back: the epoch modes, the ``course.*`` tags, the metrics.

The writer (:mod:`helpers.analysis.runs`) and the readers (:mod:`helpers.analysis.tables`, the plots and the
reports) share these names, so a tag renamed here is renamed everywhere.
"""

from __future__ import annotations

from helpers.datamodule import EPOCH_MODES, FIXED_STEPS, ONE_PASS

__all__ = ["EPOCH_MODES", "FIXED_STEPS", "METRICS", "ONE_PASS", "TAG", "TAGS"]

TAG = "course."  # prefix of the tags lesson 5 sets on a run
TAGS = {  # tag suffix -> (table column, type)
    "lesson": ("lesson", str),
    "sweep": ("sweep", str),
    "devices": ("devices", int),
    "launcher": ("launcher", str),
    "placement": ("placement", str),
    "epoch_mode": ("epoch_mode", str),
    "batch_size": ("batch_size", int),
    "global_batch_size": ("global_batch_size", int),
    "steps_per_epoch": ("steps_per_epoch", int),
    "train_rows": ("train_rows", int),
    "min_delta": ("min_delta", float),
    "patience": ("patience", int),
    "stopping_threshold": ("stopping_threshold", float),
    "max_epochs": ("max_epochs", int),
    "seed": ("seed", int),
    "stopped_reason": ("logged_stop_reason", str),
}
METRICS = ("wall_time_s", "job_time_s", "epochs_run", "best_val_loss", "last_val_loss", "val_acc")
