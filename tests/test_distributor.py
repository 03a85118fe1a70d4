"""TorchDistributor with Lightning DDP (``helpers.distributor``): layouts, preflight errors, error summaries, and a
real 2-process training in local mode (``torchrun`` on this machine, Gloo) on the shared local session.

Distributed mode on the workers of a real cluster is exercised by ``test_multi_node_faults.py`` (and lesson 4's
notebook); local mode needs no cluster, so this file stays quick. Its barrier tasks on the local session show that a
sealed call crosses them unopened.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cloudpickle
import pytest
from mlflow.tracking import MlflowClient
from pyspark import cloudpickle as spark_cloudpickle

from helpers import CourseInputError
from helpers.distributor import (
    DistributorError,
    _summarise,
    ddp_layout,
    failure_reason,
    make_distributor,
    process_group_backend,
    run_sealed,
)
from helpers.jobs import JobFolder
from helpers.phases import job_clock, log_job_clock, phases
from helpers.spark import gpu_task_slots, task_slots
from helpers.tracking import tracking_uri
from helpers.worker import TrainSettings, train_with_distributor

ACCURACY_FLOOR = 0.8

# the jobs below run functions of this module in processes that cannot import it: ship them by value (TorchDistributor
# pickles with pyspark's own copy of cloudpickle, a sealed call with cloudpickle)
for _pickler in (cloudpickle, spark_cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.parametrize(
    "gpus, task_gpus, slots",
    [(1, 1.0, 1), (4, 1.0, 4), (4, 2.0, 2), (3, 2.0, 1), (1, 0.5, 2), (3, 0.3, 9), (3, 0.4, 6), (2, 0.2222, 8)],
)
def test_gpu_shares_are_counted_per_gpu_as_spark_counts_them(gpus, task_gpus, slots):
    """Spark 3.5's ``ResourceUtils``: floor(1 / amount) tasks per GPU up to 0.5 (its docs' example: 0.2222 gives
    4 per GPU, not 4.5), whole amounts per task above; ``gpus // task_gpus`` would say 10 for (3, 0.3), 7 for
    (3, 0.4)."""
    assert gpu_task_slots(gpus, task_gpus) == slots


def test_layout_is_one_device_per_node_on_workers_and_one_node_locally():
    assert ddp_layout(2, local_mode=False) == {"devices": 1, "num_nodes": 2}
    assert ddp_layout(4, local_mode=True) == {"devices": 4, "num_nodes": 1}
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(CourseInputError):
            ddp_layout(bad, local_mode=False)


def test_backend_is_nccl_on_gpu_and_gloo_on_cpu():
    assert process_group_backend(True) == "nccl"
    assert process_group_backend(False) == "gloo"


def test_settings_are_fixed_on_the_driver_and_copied_with_changes(work_dir):
    settings = TrainSettings(max_epochs=2)
    assert settings.work_dir == str(work_dir)
    resumed = settings.replace(ckpt_restore="x/last.ckpt")
    assert (resumed.ckpt_restore, resumed.max_epochs, settings.ckpt_restore) == ("x/last.ckpt", 2, None)


def test_settings_default_to_the_cpu_in_full_precision_and_refuse_flags_that_are_not_bools():
    settings = TrainSettings()
    assert (settings.use_gpu, settings.mixed_precision) == (False, False)
    mixed = settings.replace(mixed_precision=True)
    assert (mixed.mixed_precision, mixed.use_gpu, mixed.work_dir) == (True, False, settings.work_dir)
    with pytest.raises(CourseInputError, match=r"^mixed_precision='yes': pass True or False\.$"):
        TrainSettings(mixed_precision="yes")
    with pytest.raises(CourseInputError, match=r"^use_gpu=1: pass True or False\.$"):
        settings.replace(use_gpu=1)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Precision bf16-mixed is not supported by the model summary")
def test_mixed_precision_reaches_the_trainer_of_a_real_horovod_run(work_dir, spark, digits_dir: Path):
    """``train_hvd`` in this process (Horovod with one rank): on the CPU mixed precision is bfloat16."""
    import horovod.torch as hvd

    from helpers.devices import precision_for
    from helpers.loaders import prepare_data
    from helpers.worker import train_hvd

    assert precision_for(True, use_gpu=False) == "bf16-mixed"
    _, train_converter, val_converter, class_names = prepare_data(digits_dir, num_devices=1, spark=spark)
    uri = f"sqlite:///{work_dir / 'mlflow.db'}"
    settings = TrainSettings(
        batch_size=64,
        image_size=8,
        max_epochs=1,
        mixed_precision=True,
        mlflow_experiment="mixed-precision",
        tracking_uri=uri,
    )
    try:
        result = train_hvd(train_converter, val_converter, len(class_names), settings)
    finally:
        hvd.shutdown()
    assert result.epochs_run == 1 and result.val_acc is not None and result.best_val_loss < 10
    params = MlflowClient(uri).get_run(result.mlflow_run_id).data.params
    assert (params["precision"], params["accelerator"], params["strategy"]) == ("bf16-mixed", "cpu", "HorovodStrategy")


def test_more_processes_than_task_slots_is_refused_before_starting(spark):
    slots = task_slots(spark)
    assert slots == 2  # the shared local[2] session
    with pytest.raises(CourseInputError, match=r"num_processes=3.*2 task slots"):
        make_distributor(3, local_mode=False, spark=spark)
    assert make_distributor(2, local_mode=False, spark=spark).num_processes == 2


def test_gpus_on_a_cluster_need_one_gpu_per_task(spark):
    with pytest.raises(CourseInputError, match="spark.task.resource.gpu.amount=1"):
        make_distributor(2, use_gpu=True, local_mode=False, spark=spark)


def test_error_summary_is_the_training_process_s_last_python_error():
    torchrun_output = (
        "Command ['python', '-m', 'pyspark.ml.torch.torch_run_process_wrapper'] failed with return code 1. The last "
        "100 lines of the task output are included below: Traceback (most recent call last):\n"
        '  File "train.py", line 8, in <module>\n'
        "ValueError: simulated bad batch\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    assert _summarise(RuntimeError(torchrun_output)) == "ValueError: simulated bad batch"
    assert _summarise(RuntimeError("x failed with return code -9. The task output is included below: ")) == (
        "torchrun exited with code -9"
    )


STALLED_RANK = (
    "Traceback (most recent call last):\n"
    '  File "/work/helpers/jobs.py", line 554, in __call__\n'
    "    return self.fn(*args, **kwargs)\n"
    '  File "{file}", line 98, in ddp_steps\n'
    "{code}"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
    "    return func(*args, **kwargs)\n"
    "RuntimeError: [gloo] Timed out waiting 5000ms for recv operation to complete\n"
)


@pytest.mark.parametrize(
    ("file", "code", "named"),
    [
        ("/home/me/lesson.py", "    dist.all_reduce(torch.ones(4))\n", "0 (at `dist.all_reduce(torch.ones(4))`)"),
        # a frame without its source line (a function sent by value, whose file is not on this host): the rank, and
        # never the next frame's "File ..." line as its code
        ("<dynamic-code>", "", "0 (at `return self.fn(*args, **kwargs)`)"),
    ],
)
def test_a_stall_names_the_line_of_the_rank_s_own_code_where_there_is_one(tmp_path, file, code, named):
    job = JobFolder(tmp_path)
    job.record_failure(0, RuntimeError("[gloo] Timed out waiting 5000ms for recv operation to complete"))
    record = tmp_path / "failure-rank-0.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "text": STALLED_RANK.format(file=file, code=code)}))
    reason = failure_reason(RuntimeError("torchrun failed"), job, num_processes=2)
    assert reason.startswith(f"a collective stalled: rank(s) {named} waited"), reason


@pytest.mark.slow
def test_local_mode_ddp_trains_to_the_floor_with_one_mlflow_run(work_dir, spark, digits_data):
    _, train_converter, val_converter, class_names = digits_data
    settings = TrainSettings(
        batch_size=32, image_size=16, learning_rate=0.02, max_epochs=2, mlflow_experiment="ddp-local"
    )
    with job_clock() as clock:
        result = train_with_distributor(
            train_converter, val_converter, len(class_names), settings, num_processes=2, local_mode=True, spark=spark
        )
    assert result.val_acc >= ACCURACY_FLOOR
    assert result.epochs_run == 2 and [row["epoch"] for row in result.history] == [0, 1]
    assert Path(result.last_checkpoint).parent == work_dir / "checkpoints" / Path(result.last_checkpoint).parent.name
    client = MlflowClient(tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("ddp-local").experiment_id])
    assert len(runs) == 1  # rank 0 only
    params = runs[0].data.params
    assert (params["world_size"], params["devices"], params["num_nodes"]) == ("2", "2", "1")
    assert (params["strategy"], params["launcher"], params["local_mode"]) == (
        "DDPStrategy",
        "torch_distributor",
        "True",
    )
    # DDP averages gradients like Horovod: the learning rate is scaled by the world size
    assert float(params["effective_learning_rate"]) == pytest.approx(2 * 0.02)
    assert runs[0].info.status == "FINISHED"
    # rank 0's clock readings are in the run; with the driver's they split the job into four phases
    log_job_clock(runs[0].info.run_id, clock, tracking_uri())
    split = phases(client.get_run(runs[0].info.run_id).data.metrics)
    assert (split > 0).all(), split
    assert split.sum() == pytest.approx(clock.ended_at - clock.started_at)
    assert split["fit_s"] <= result.wall_time_s + 0.05  # the fit call also holds the process group's set-up


@pytest.mark.slow
def test_a_failing_process_raises_a_distributor_error_with_its_python_error(work_dir, spark):
    with pytest.raises(DistributorError, match="failed after .* s: .*class_count") as caught:
        # class_count=0 makes every process raise in the model's constructor
        train_with_distributor(None, None, 0, TrainSettings(), num_processes=2, local_mode=True, spark=spark)
    assert caught.value.last_checkpoint is None
    assert "No checkpoint was written yet" in str(caught.value)


def _rebuilt_outside_a_spark_task(text: str) -> NotInASparkTask:
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        raise RuntimeError("a Spark task unpickled what only the training processes need")
    return NotInASparkTask(text)


class NotInASparkTask:
    """A value that refuses to be unpickled in a Spark task, as a Lightning module does in effect (its import costs a
    task about 5 CPU-s); a training process (started by torchrun) and the driver unpickle it."""

    def __init__(self, text: str):
        self.text = text

    def __reduce__(self):
        return _rebuilt_outside_a_spark_task, (self.text,)


def _echo(value: NotInASparkTask) -> NotInASparkTask:
    return NotInASparkTask(f"{value.text} and back")


@pytest.mark.slow
def test_a_sealed_call_and_its_result_cross_the_spark_tasks_unopened(spark):
    distributor = make_distributor(2, local_mode=False, spark=spark)
    assert run_sealed(distributor, _echo, NotInASparkTask("there")).text == "there and back"
    # the premise: unsealed, each barrier task unpickles the call (and the job fails here)
    with pytest.raises(Exception, match="a Spark task unpickled"):
        distributor.run(_echo, NotInASparkTask("there"))
