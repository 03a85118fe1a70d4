"""Lesson 3 end to end: ``train_hvd`` on 2 local Horovod processes (Gloo), Petastorm shards, MLflow on rank 0.

The training function below is what a lesson-3 notebook cell holds: ``hvd.init()``, a DataModule reading this
rank's shard, ``train(..., strategy=HorovodStrategy(), mlflow_experiment=...)``; ``HorovodRunner(np=-2)`` runs it.
Each test gets its own work directory (checkpoints, the SQLite MLflow store, the runner's reports), which the
worker processes inherit through ``COURSE_WORK_DIR``; the Petastorm data is prepared once per session.

The failure tests make one rank fail on purpose mid-training (rank 1 raises; rank 0, the one that owns the MLflow
run, is SIGKILLed) and check what a student would see: an error naming that rank soon after the failure (timed from
the moment of failure, not from the start of the job, which includes imports), and an MLflow run that ended FAILED
instead of staying RUNNING forever. In both cases rank 0 dies before ``train()`` can end its run (Horovod stops the
surviving ranks with SIGTERM, which Lightning only notes during ``fit``, then SIGKILL 5 s later), so it is
``HorovodRunner`` in the driver that ends the run.
"""

from __future__ import annotations

import sys
import time
import uuid

import cloudpickle
import pytest
from mlflow.tracking import MlflowClient

from helpers.horovod_runner import HorovodRunner, HorovodWorkerError
from helpers.tracking import tracking_uri
from helpers.workdir import work_path

# The workers cannot import this test module (tests/ is not on their path): send its functions by value, as
# functions defined in a notebook cell are sent.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("work_dir"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
]

IMAGE_SIZE = 16
BATCH_SIZE = 32
LEARNING_RATE = 0.02
MAX_EPOCHS = 3
FAILING_EPOCH = 1
FAILED_AT = "failed_at.txt"  # written by the failing rank just before it fails: the start of the clock
DETECTION_LIMIT_S = 60  # from the failure to HorovodWorkerError in the driver
RANK_ZERO_BUSY_S = 40  # rank 0's busy epoch end in the "raise" test: longer than Horovod's 5 s grace period


@pytest.fixture
def experiment(request: pytest.FixtureRequest) -> str:
    """A unique MLflow experiment name for this test."""
    return f"lesson3-{request.node.name}-{uuid.uuid4().hex[:6]}"


def build_model(class_count: int, fail: str | None):
    """The lesson's model, or one that fails on purpose in epoch 1 (``FAILING_EPOCH``):

    * ``"raise"``: rank 1 raises in the epoch-end hook, while rank 0 is still busy with its own epoch end (it
      sleeps, standing in for slow rank-0-only work such as writing a checkpoint to remote storage). Horovod then
      terminates rank 0 before ``train()`` can end its MLflow run: only the driver can mark that run FAILED.
    * ``"kill"``: rank 0, the rank that owns the MLflow run, is SIGKILLed in the middle of the epoch (as the
      out-of-memory killer would do): it cannot end its run at all.
    """
    import os
    import signal

    from helpers.model import LitClassificationModel

    def mark_failure() -> None:
        work_path(FAILED_AT).write_text(repr(time.time()))

    class FailingModel(LitClassificationModel):
        def on_train_batch_start(self, batch, batch_idx):
            if fail == "kill" and self.global_rank == 0 and self.current_epoch == FAILING_EPOCH and batch_idx == 2:
                mark_failure()
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_epoch_end(self):
            if fail == "raise" and self.current_epoch == FAILING_EPOCH:
                if self.global_rank == 1:
                    mark_failure()
                    raise RuntimeError("deliberate failure on rank 1 at the end of epoch 1")
                time.sleep(RANK_ZERO_BUSY_S)  # Horovod terminates this rank long before the sleep ends

    model_class = FailingModel if fail else LitClassificationModel
    return model_class(class_count, learning_rate=LEARNING_RATE, image_size=IMAGE_SIZE)


def train_hvd(train_converter, val_converter, class_count: int, experiment: str, fail: str | None = None):
    """Lesson 3's training function: runs in every Horovod process; rank 0's TrainResult comes back."""
    import horovod.torch as hvd
    import pytorch_lightning as pl

    from helpers.datamodule import PetastormDataModule
    from helpers.horovod_strategy import HorovodStrategy
    from helpers.training import train

    hvd.init()
    pl.seed_everything(hvd.rank(), verbose=False)  # different on each rank: the initial broadcast must align them
    datamodule = PetastormDataModule(
        train_converter,
        val_converter,
        batch_size=BATCH_SIZE,
        image_size=IMAGE_SIZE,
        device_id=hvd.rank(),
        device_count=hvd.size(),
        workers_count=1,
    )
    return train(
        build_model(class_count, fail),
        datamodule,
        max_epochs=MAX_EPOCHS,
        strategy=HorovodStrategy(),
        mlflow_experiment=experiment,
        early_stopping=False,
        progress_bar=False,
    )


def all_runs() -> list:
    """Every run in the test's MLflow store, in any experiment."""
    client = MlflowClient(tracking_uri())
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


def run_and_fail(digits_data, experiment: str, fail: str) -> tuple[HorovodWorkerError, float]:
    """Run a job in which one rank fails; return the error and the seconds from the failure to the driver's error."""
    with pytest.raises(HorovodWorkerError) as caught:
        HorovodRunner(np=-2).run(
            train_hvd,
            train_converter=digits_data.train_converter,
            val_converter=digits_data.val_converter,
            class_count=len(digits_data.class_names),
            experiment=experiment,
            fail=fail,
        )
    detected = time.time()
    stamp = work_path(FAILED_AT)
    assert stamp.exists(), f"the {fail!r} failure point was never reached: the job failed for another reason"
    return caught.value, detected - float(stamp.read_text())


def test_two_processes_learn_with_one_mlflow_run_and_one_set_of_checkpoints(digits_data, experiment, work_dir):
    started = time.monotonic()
    result = HorovodRunner(np=-2).run(
        train_hvd,
        train_converter=digits_data.train_converter,
        val_converter=digits_data.val_converter,
        class_count=len(digits_data.class_names),
        experiment=experiment,
    )
    print(
        f"2-process job: {time.monotonic() - started:.1f} s (training {result.wall_time_s:.1f} s); "
        f"val_acc {result.val_acc:.3f}; history {result.history}"
    )

    # learning happened
    assert result.epochs_run == MAX_EPOCHS
    assert [row["epoch"] for row in result.history] == list(range(MAX_EPOCHS))
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    assert result.val_acc >= 0.8

    # exactly one MLflow run (rank 0's), finished, with the world size and the scaled learning rate
    runs = all_runs()
    assert len(runs) == 1, f"expected one run, found {len(runs)}: {[r.info.run_name for r in runs]}"
    run = runs[0]
    client = MlflowClient(tracking_uri())
    assert client.get_experiment(run.info.experiment_id).name == experiment
    assert run.info.run_id == result.mlflow_run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2"
    assert run.data.params["strategy"] == "HorovodStrategy"
    assert float(run.data.params["learning_rate"]) == pytest.approx(LEARNING_RATE)
    assert float(run.data.params["effective_learning_rate"]) == pytest.approx(2 * LEARNING_RATE)
    val_loss_steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")]
    assert sorted(val_loss_steps) == list(range(MAX_EPOCHS)), "one val_loss per epoch, logged by one rank"
    assert result.registered_model_version == "1"

    # checkpoints written once, by rank 0, into one folder (each rank names its own folder before the broadcast)
    folders = [p for p in (work_dir / "checkpoints").iterdir()]
    assert len(folders) == 1, f"checkpoint folders from more than one rank: {folders}"
    files = sorted(p.name for p in folders[0].iterdir())
    best = [name for name in files if name.startswith("best-")]
    assert len(best) == 1 and files == sorted(["last.ckpt", *best]), files
    assert result.last_checkpoint == str(folders[0] / "last.ckpt")
    assert result.best_checkpoint == str(folders[0] / best[0])


def test_a_worker_exception_names_the_rank_and_fails_the_mlflow_run(digits_data, experiment):
    error, latency = run_and_fail(digits_data, experiment, "raise")
    print(f"the driver raised {latency:.1f} s after rank 1 failed")
    assert error.rank == 1
    message = str(error)
    assert "rank 1 of 2" in message
    assert "RuntimeError: deliberate failure on rank 1 at the end of epoch 1" in message
    assert "Traceback (most recent call last)" in message and "on_train_epoch_end" in message
    assert latency < DETECTION_LIMIT_S

    runs = all_runs()
    assert len(runs) == 1, f"expected one run, found {len(runs)}"
    assert runs[0].info.status == "FAILED", f"the run was left {runs[0].info.status}"
    assert runs[0].info.end_time is not None


def test_a_killed_rank_zero_fails_the_job_quickly_and_its_mlflow_run(digits_data, experiment):
    error, latency = run_and_fail(digits_data, experiment, "kill")
    print(f"the driver raised {latency:.1f} s after rank 0 was killed")
    assert error.rank == 0
    assert "rank 0 of 2 died without a Python error" in str(error) and "SIGKILL" in str(error)
    assert latency < DETECTION_LIMIT_S

    runs = all_runs()
    assert len(runs) == 1, f"expected one run, found {len(runs)}"
    assert runs[0].info.status == "FAILED", f"the run was left {runs[0].info.status}"
    assert runs[0].info.end_time is not None
