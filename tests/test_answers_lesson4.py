"""Answer corpus for lesson 4: right answers written differently pass, lazy, hard-coded and subtly wrong ones fail.

Every answer goes through its real check (``helpers.course.checks._run``) with a namespace built from fixtures: the
shared local[2] session stands in for the cluster (Horovod and TorchDistributor run as Spark tasks there too), with a
small Petastorm data set for the one real TorchDistributor job of 4.3.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import cloudpickle
import pytest
from pyspark import cloudpickle as spark_cloudpickle

from helpers.course.checks import _run
from helpers.logs import quiet_library_warnings
from helpers.workdir import REPO_ROOT
from tests.processes import no_horovod_env

# the answers below run in torchrun processes that cannot import this test module: ship them by value (Spark and
# TorchDistributor pickle with pyspark's own copy of cloudpickle)
for _pickler in (cloudpickle, spark_cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])


def verdict(exercise: str, answer) -> str:
    status, message = _run(exercise, answer)
    print(status, message)  # shown by pytest when the verdict is not the expected one
    assert status in ("passed", "failed"), (status, message)
    return status


# ------------------------------------------------------------------------------------------------ 4.1 HorovodRunner


def launch_gathered(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    def every_rank():
        import horovod.torch as hvd

        hvd.init()
        return hvd.allgather_object(fn(**kwargs), name="every rank's value")

    return HorovodRunner(np=num_workers).run(every_rank)


def launch_gathered_unnamed(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    def every_rank():
        import horovod.torch as hvd

        hvd.init()
        return hvd.allgather_object(fn(**kwargs))  # named after the value's type: another name on rank 0

    return HorovodRunner(np=num_workers).run(every_rank)


def _call_and_gather(fn, kwargs):
    import horovod.torch as hvd

    hvd.init()
    mine = fn(**kwargs)
    # one root at a time, each broadcast named alike on every rank
    return [hvd.broadcast_object(mine, root_rank=rank, name=f"from {rank}") for rank in range(hvd.size())]


def launch_spelled_out(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner as Runner

    runner = Runner(np=+abs(num_workers), driver_log_verbosity="log_callback_only")
    return tuple(runner.run(_call_and_gather, fn=fn, kwargs=kwargs))


def launch_rank_0_only(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    return HorovodRunner(np=num_workers).run(fn, **kwargs)


def launch_rank_0_repeated(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    return [HorovodRunner(np=num_workers).run(fn, **kwargs)] * num_workers


def launch_on_driver(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    return HorovodRunner(np=-num_workers).run(_call_and_gather, fn=fn, kwargs=kwargs)


def launch_two(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    return HorovodRunner(np=2).run(_call_and_gather, fn=fn, kwargs=kwargs)


def launch_no_kwargs(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    return HorovodRunner(np=num_workers).run(_call_and_gather, fn=fn, kwargs={})


def launch_no_return(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner

    HorovodRunner(np=num_workers).run(_call_and_gather, fn=fn, kwargs=kwargs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer, expected, says",
    [
        (launch_gathered, "passed", "every rank's value came back, in rank order, from 1 and 2"),
        (launch_spelled_out, "passed", "every rank's value came back"),
        (launch_gathered_unnamed, "failed", "pairs collectives up by name"),
        (launch_rank_0_only, "failed", "hands back rank 0's value only"),
        (launch_rank_0_repeated, "failed", "expected ranks 0 to 1 of 2, in rank order"),
        (launch_on_driver, "failed", "on the driver, not in Spark tasks"),
        (launch_two, "failed", "returned 2 values, expected one per process"),
        (launch_no_kwargs, "failed", "tag"),
        (launch_no_return, "not attempted", "launch_on_workers returns nothing yet: add a return"),
    ],
)
def test_4_1_horovod_on_the_workers(spark, answer, expected, says):
    status, message = _run("4.1", {"launch_on_workers": answer, "WORKERS": 2, "spark": spark})
    assert (status, says in message) == (expected, True), message


NOT_CHECKED_HERE = """
from helpers.course.checks import _run
def launch_on_workers(fn, num_workers, **kwargs):
    from helpers.horovod_runner import HorovodRunner
    def every_rank():
        import horovod.torch as hvd
        hvd.init()
        return hvd.allgather_object(fn(**kwargs), name="every rank's value")
    return HorovodRunner(np=num_workers).run(every_rank)
print(_run("4.1", {"launch_on_workers": launch_on_workers, "WORKERS": 2}))
"""


def test_4_1_cannot_be_checked_where_horovod_is_missing_and_says_so_without_blaming_the_answer():
    hidden = no_horovod_env(str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-c", NOT_CHECKED_HERE], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **hidden}, cwd=REPO_ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    status, message = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert status == "error" and message.startswith("This exercise (Horovod on Spark) needs Horovod"), message
    assert "LAUNCHER='torch_distributor'" in message and "\n" not in message


# ----------------------------------------------------------------------------------------- 4.2 TorchDistributor setup


def distributor_plain(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    if gpus_per_worker > 0:
        return TorchDistributor(num_processes=workers * gpus_per_worker, local_mode=False, use_gpu=True)
    return TorchDistributor(num_processes=workers, local_mode=False, use_gpu=False)


def layout_plain(num_processes, local_mode):
    if local_mode:
        return {"devices": num_processes, "num_nodes": 1}
    return {"devices": 1, "num_nodes": num_processes}


def distributor_positional(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    processes = workers * max(gpus_per_worker, 1)
    return TorchDistributor(processes, False, bool(gpus_per_worker))


def layout_numpy(num_processes, local_mode):
    import numpy as np

    nodes = np.int64(1 if local_mode else num_processes)
    return dict(devices=np.int64(num_processes) // nodes, num_nodes=nodes)


def distributor_delegated(workers, gpus_per_worker):
    from helpers.distributor import make_distributor

    return make_distributor(workers * max(gpus_per_worker, 1), gpus_per_worker > 0)


def layout_delegated(num_processes, local_mode):
    from helpers.distributor import ddp_layout

    return ddp_layout(num_processes, local_mode)


def distributor_one_per_worker(workers, gpus_per_worker):
    """Ignores the GPUs a worker has beyond the first."""
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=workers, local_mode=False, use_gpu=gpus_per_worker > 0)


def distributor_sum(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=workers + gpus_per_worker, local_mode=False, use_gpu=gpus_per_worker > 0)


def distributor_gpu_count_only(workers, gpus_per_worker):
    """The GPUs of one worker, or the workers: the cluster's total is never formed."""
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=gpus_per_worker or workers, local_mode=False, use_gpu=gpus_per_worker > 0)


def distributor_cpu_only(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=workers * max(gpus_per_worker, 1), local_mode=False, use_gpu=False)


def distributor_always_gpu(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=workers * max(gpus_per_worker, 1), local_mode=False, use_gpu=True)


def distributor_on_the_driver(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    processes = workers * max(gpus_per_worker, 1)
    return TorchDistributor(num_processes=processes, local_mode=True, use_gpu=gpus_per_worker > 0)


def distributor_two(workers, gpus_per_worker):
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=2, local_mode=False, use_gpu=gpus_per_worker > 0)


def layout_swapped(num_processes, local_mode):
    return layout_plain(num_processes, not local_mode)


def layout_read_only(num_processes, local_mode):
    import types

    nodes = 1 if local_mode else num_processes
    return types.MappingProxyType({"num_nodes": nodes, "devices": num_processes // nodes})


def layout_workers_always(num_processes, local_mode):
    return {"devices": 1, "num_nodes": num_processes}  # local_mode ignored


def layout_with_strategy(num_processes, local_mode):
    return {**layout_plain(num_processes, local_mode), "strategy": "ddp"}  # more than the layout asked for


@pytest.mark.parametrize(
    "make, layout, expected",
    [
        (distributor_plain, layout_plain, "passed"),
        (distributor_positional, layout_numpy, "passed"),
        (distributor_delegated, layout_plain, "failed"),
        (distributor_plain, layout_delegated, "failed"),
        (distributor_one_per_worker, layout_plain, "failed"),
        (distributor_sum, layout_plain, "failed"),
        (distributor_gpu_count_only, layout_plain, "failed"),
        (distributor_cpu_only, layout_plain, "failed"),
        (distributor_always_gpu, layout_plain, "failed"),
        (distributor_on_the_driver, layout_plain, "failed"),
        (distributor_two, layout_plain, "failed"),
        (distributor_plain, layout_swapped, "failed"),
        (distributor_plain, layout_read_only, "passed"),
        (distributor_plain, layout_workers_always, "failed"),
        (distributor_plain, layout_with_strategy, "failed"),
    ],
)
def test_4_2_distributor_and_layout(spark, make, layout, expected):
    assert verdict("4.2", {"make_torch_distributor": make, "trainer_layout": layout}) == expected


def test_4_2_the_hints_name_the_cluster_and_the_rule(spark):
    def said(make) -> str:
        status, message = _run("4.2", {"make_torch_distributor": make, "trainer_layout": layout_plain})
        assert status == "failed"
        return message

    assert said(distributor_sum).endswith(
        "num_processes=2, expected 1 for 1 worker with 1 GPU each: one process per GPU (1 x 1)"
    )
    assert said(distributor_gpu_count_only).endswith(
        "num_processes=4, expected 12 for 3 workers with 4 GPUs each: one process per GPU (3 x 4)"
    )
    assert "give each process its own GPU (use_gpu=True)" in said(distributor_cpu_only)
    assert "there is no GPU to use (use_gpu=False)" in said(distributor_always_gpu)
    assert "local_mode=True: that starts every process on the driver" in said(distributor_on_the_driver)


# ----------------------------------------------------------------------------------------- 4.4 MLflow launcher table

COLUMNS = ("wall_time_s", "val_loss", "val_acc")


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def table_answers(uri: str) -> dict:
    import pandas as pd
    from mlflow.tracking import MlflowClient

    def from_dict(run_ids):
        client = MlflowClient(uri)
        rows = {name: {c: client.get_run(i).data.metrics[c] for c in COLUMNS} for name, i in run_ids.items()}
        return pd.DataFrame.from_dict(rows, orient="index")

    def with_mlflow_search(run_ids):
        import mlflow

        mlflow.set_tracking_uri(uri)
        frames = mlflow.search_runs(
            search_all_experiments=True,
            filter_string=f"attributes.run_id IN ({', '.join(repr(i) for i in run_ids.values())})",
        )
        names = {run_id: name for name, run_id in run_ids.items()}
        frames.index = frames["run_id"].map(names)
        return frames.rename(columns={f"metrics.{c}": c for c in COLUMNS})[list(COLUMNS)]

    def first_values(run_ids):
        client = MlflowClient(uri)
        rows = {name: {c: client.get_metric_history(i, c)[0].value for c in COLUMNS} for name, i in run_ids.items()}
        return pd.DataFrame.from_dict(rows, orient="index")

    def every_metric(run_ids):
        client = MlflowClient(uri)
        return pd.DataFrame.from_dict({n: client.get_run(i).data.metrics for n, i in run_ids.items()}, orient="index")

    def reordered(run_ids):
        client = MlflowClient(uri)
        table = pd.DataFrame({n: client.get_run(i).data.metrics for n, i in run_ids.items()}).T
        return table[list(reversed(COLUMNS))]

    def hard_coded(run_ids):
        return pd.DataFrame({c: [0.5, 0.5] for c in COLUMNS}, index=["horovod", "torch_distributor"])

    def indexed_by_run_id(run_ids):
        client = MlflowClient(uri)
        rows = {i: {c: client.get_run(i).data.metrics[c] for c in COLUMNS} for i in run_ids.values()}
        return pd.DataFrame.from_dict(rows, orient="index")

    def delegated(run_ids):
        from helpers.tracking import metric_history

        rows = {name: {c: metric_history(i, c, uri)[-1][1] for c in COLUMNS} for name, i in run_ids.items()}
        return pd.DataFrame.from_dict(rows, orient="index")

    return {
        "from_dict": from_dict,
        "with_mlflow_search": with_mlflow_search,
        "first_values": first_values,
        "every_metric": every_metric,
        "reordered": reordered,
        "hard_coded": hard_coded,
        "indexed_by_run_id": indexed_by_run_id,
        "delegated": delegated,
    }


@pytest.mark.parametrize(
    "name, expected",
    [
        ("from_dict", "passed"),
        ("with_mlflow_search", "passed"),
        ("reordered", "passed"),
        ("first_values", "failed"),
        ("every_metric", "failed"),
        ("hard_coded", "failed"),
        ("indexed_by_run_id", "failed"),
        ("delegated", "failed"),
    ],
)
def test_4_4_launcher_table(mlflow_uri, name, expected):
    answer = table_answers(mlflow_uri)[name]
    assert verdict("4.4", {"launcher_table": answer, "MLFLOW_TRACKING_URI": mlflow_uri}) == expected


# ------------------------------------------------------------------------------------ 4.3 the TorchDistributor function


def ddp_train_env_layout(train_converter, val_converter, class_count, settings, local_mode):
    import os

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel
    from helpers.training import train

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    model = LitClassificationModel(
        class_count, learning_rate=settings.learning_rate * world_size, image_size=settings.image_size
    )
    data = PetastormDataModule(
        train_converter,
        val_converter,
        settings.batch_size,
        settings.image_size,
        device_id=rank,
        device_count=world_size,
    )
    result = train(
        model,
        data,
        max_epochs=settings.max_epochs,
        accelerator="gpu" if settings.use_gpu else "cpu",
        devices=per_node,
        num_nodes=world_size // per_node,
        strategy="ddp",
        default_dir=settings.default_dir,
        progress_bar=False,
    )
    return result if rank == 0 else None


def ddp_train_own_trainer(train_converter, val_converter, class_count, settings, local_mode):
    import os

    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    env = os.environ
    layout = (
        {"devices": int(env["WORLD_SIZE"]), "num_nodes": 1}
        if local_mode
        else {"devices": 1, "num_nodes": int(env["WORLD_SIZE"])}
    )
    data = PetastormDataModule(
        train_converter,
        val_converter,
        settings.batch_size,
        settings.image_size,
        device_id=int(env["RANK"]),
        device_count=int(env["WORLD_SIZE"]),
    )
    trainer = pl.Trainer(
        max_epochs=settings.max_epochs,
        accelerator="cuda" if settings.use_gpu else "cpu",
        strategy=DDPStrategy(process_group_backend="nccl" if settings.use_gpu else "gloo"),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        **layout,
    )
    model = LitClassificationModel(
        class_count, learning_rate=settings.learning_rate * int(env["WORLD_SIZE"]), image_size=settings.image_size
    )
    trainer.fit(model, datamodule=data)
    if trainer.global_rank == 0:
        return {"val_loss": float(trainer.callback_metrics["val_loss"])}
    return None


def _env_layout_variant(**changes):
    """``ddp_train_env_layout`` with one thing done wrong: ``changes`` replaces what it passes or returns."""

    def answer(train_converter, val_converter, class_count, settings, local_mode):
        import os

        from helpers.datamodule import PetastormDataModule
        from helpers.model import LitClassificationModel
        from helpers.training import train

        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        per_node = int(os.environ["LOCAL_WORLD_SIZE"])
        rate = changes.get("learning_rate", settings.learning_rate * world_size)
        model = LitClassificationModel(class_count, learning_rate=rate, image_size=settings.image_size)
        batch = changes.get("batch_size", settings.batch_size)
        data = PetastormDataModule(
            train_converter, val_converter, batch, settings.image_size, device_id=rank, device_count=world_size
        )
        result = train(
            model,
            data,
            max_epochs=changes.get("max_epochs", settings.max_epochs),
            accelerator="gpu" if settings.use_gpu else "cpu",
            devices=per_node,
            num_nodes=world_size // per_node,
            strategy="ddp",
            default_dir=settings.default_dir,
            progress_bar=False,
        )
        return result if rank == 0 or changes.get("every_rank_returns") else None

    return answer


ddp_train_unscaled_rate = _env_layout_variant(learning_rate=0.01)
ddp_train_own_epochs = _env_layout_variant(max_epochs=1)
ddp_train_own_batch = _env_layout_variant(batch_size=32)
ddp_train_every_rank_returns = _env_layout_variant(every_rank_returns=True)


def ddp_train_delegated(train_converter, val_converter, class_count, settings, local_mode):
    import os

    from helpers.worker import train_process

    return train_process(
        "torch_distributor",
        train_converter,
        val_converter,
        class_count,
        settings,
        num_processes=int(os.environ["WORLD_SIZE"]),
        local_mode=local_mode,
    )


def ddp_train_hard_coded(train_converter, val_converter, class_count, settings, local_mode):
    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel
    from helpers.training import train

    data = PetastormDataModule(
        train_converter, val_converter, settings.batch_size, settings.image_size, device_id=0, device_count=2
    )
    return train(
        LitClassificationModel(class_count, image_size=settings.image_size),
        data,
        max_epochs=1,
        devices=1,
        num_nodes=2,
        strategy="ddp",
        default_dir=settings.default_dir,
    )


def ddp_train_distributed_layout_only(train_converter, val_converter, class_count, settings, local_mode):
    import os

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel
    from helpers.training import train

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    data = PetastormDataModule(
        train_converter,
        val_converter,
        settings.batch_size,
        settings.image_size,
        device_id=rank,
        device_count=world_size,
    )
    return train(
        LitClassificationModel(class_count, image_size=settings.image_size),
        data,
        max_epochs=1,
        devices=1,
        num_nodes=world_size,
        strategy="ddp",
        default_dir=settings.default_dir,
    )


def ddp_train_same_shard(train_converter, val_converter, class_count, settings, local_mode):
    import os

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel
    from helpers.training import train

    world_size = int(os.environ["WORLD_SIZE"])
    layout = {"devices": world_size, "num_nodes": 1} if local_mode else {"devices": 1, "num_nodes": world_size}
    data = PetastormDataModule(train_converter, val_converter, settings.batch_size, settings.image_size)
    return train(
        LitClassificationModel(class_count, image_size=settings.image_size),
        data,
        max_epochs=1,
        strategy="ddp",
        default_dir=settings.default_dir,
        **layout,
    )


@pytest.fixture(scope="module")
def small_data(digits_data):
    """A few hundred digits as Petastorm converters, 2 row groups per process."""
    return digits_data


@pytest.fixture()
def ddp_namespace(spark, small_data):
    from helpers.worker import TrainSettings

    _, train_converter, val_converter, class_names = small_data
    settings = TrainSettings(batch_size=64, image_size=8, max_epochs=3, mlflow_experiment="not-used-by-the-check")
    return {
        "spark": spark,
        "train_converter": train_converter,
        "val_converter": val_converter,
        "class_names": class_names,
        "settings": settings,
        "WORKERS": 2,
        "USE_GPU": False,
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer, expected",
    [
        (ddp_train_env_layout, "passed"),
        (ddp_train_own_trainer, "passed"),
        (ddp_train_delegated, "failed"),
        (ddp_train_hard_coded, "failed"),
        (ddp_train_distributed_layout_only, "failed"),
        (ddp_train_same_shard, "failed"),
        (ddp_train_unscaled_rate, "failed"),
        (ddp_train_own_epochs, "failed"),
        (ddp_train_own_batch, "failed"),
        (ddp_train_every_rank_returns, "failed"),
    ],
)
def test_4_3_training_function(ddp_namespace, answer, expected):
    assert verdict("4.3", {**ddp_namespace, "ddp_train": answer}) == expected


def _real_job(returned: list) -> list:
    """What the real job's ranks give the judge: the right Trainer each, and what each returned."""
    from helpers.course.checks.function_check import Watched

    fit = {"devices": 1, "num_nodes": 2, "world_size": 2, "strategy": "DDPStrategy", "gpu": False}
    return [
        Watched(value, {"fits": [{**fit, "global_rank": rank, "shard": [rank, 2]}]})
        for rank, value in enumerate(returned)
    ]


@pytest.mark.parametrize(
    "returned, says",
    [
        ([None, None], "returned None on rank 0: return train's result"),
        ([True, True], "returned a result on rank(s) [1] too: return it on rank 0 only"),
        ([True, None], None),
    ],
)
def test_4_3_rank_zero_alone_must_return(returned, says):
    """The real job's judge (no job needed): rank 0 returns something, the others nothing."""
    from helpers.course.checks.lesson4 import ddp_training_function

    real = ddp_training_function.parts[1]
    problem = real.judge(((None, None, 10, None), 2, False), _real_job(returned), None)
    assert problem is None if says is None else problem.startswith(says)


# ------------------------------------------------------------------------------------- 4.5 resume after a lost worker


def resume_by_epoch_in_file(trainer, model, datamodule, checkpoint_dir):
    import torch

    best, best_progress = None, (-1, -1)
    for path in Path(checkpoint_dir).glob("*.ckpt"):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:
            continue
        progress = (state["epoch"], state["global_step"])
        if progress > best_progress:
            best, best_progress = str(path), progress
    trainer.fit(model, datamodule=datamodule, ckpt_path=best)
    return trainer


def resume_newest_readable(trainer, model, datamodule, checkpoint_dir):
    import torch

    for path in sorted(Path(checkpoint_dir).glob("*.ckpt"), key=os.path.getmtime, reverse=True):
        try:
            torch.load(path, map_location="cpu", weights_only=False)
        except Exception:
            continue
        return trainer.fit(model, datamodule, ckpt_path=path)
    return trainer.fit(model, datamodule)


def resume_last_only(trainer, model, datamodule, checkpoint_dir):
    last = Path(checkpoint_dir) / "last.ckpt"
    trainer.fit(model, datamodule=datamodule, ckpt_path=str(last) if last.exists() else None)


def resume_alphabetical(trainer, model, datamodule, checkpoint_dir):
    import torch

    readable = []
    for path in sorted(Path(checkpoint_dir).glob("epoch=*.ckpt")):
        try:
            torch.load(path, map_location="cpu", weights_only=False)
            readable.append(path)
        except Exception:
            pass
    trainer.fit(model, datamodule=datamodule, ckpt_path=readable[-1] if readable else None)


def resume_weights_only(trainer, model, datamodule, checkpoint_dir):
    import torch

    last = Path(checkpoint_dir) / "last.ckpt"
    if last.exists():
        model.load_state_dict(torch.load(last, map_location="cpu", weights_only=False)["state_dict"])
    trainer.fit(model, datamodule=datamodule)


def resume_delegated(trainer, model, datamodule, checkpoint_dir):
    from helpers.jobs import last_checkpoint

    trainer.fit(model, datamodule=datamodule, ckpt_path=last_checkpoint(checkpoint_dir))


@pytest.mark.parametrize(
    "answer, expected",
    [
        (resume_by_epoch_in_file, "passed"),
        (resume_newest_readable, "passed"),
        (resume_last_only, "failed"),
        (resume_alphabetical, "failed"),
        (resume_weights_only, "failed"),
        (resume_delegated, "failed"),
    ],
)
def test_4_5_resume(answer, expected):
    assert verdict("4.5", {"resume_training": answer}) == expected


def test_4_5_hints_name_the_folder_and_the_epochs_that_ran():
    assert _run("4.5", {"resume_training": resume_alphabetical})[1] == (
        "resume_training(<Trainer of max_epochs=14>, <model>, <datamodule>, <a complete folder: 12 epochs saved>) "
        "ran epochs [10, 11, 12, 13], expected 12 to 13: pass the newest readable checkpoint as "
        "trainer.fit(..., ckpt_path=...), None when there is none"
    )
    torn = _run("4.5", {"resume_training": resume_last_only})[1]  # the answer's error, with the check's hint
    assert torn.startswith("resume_training(<Trainer of max_epochs=14>, <model>, <datamodule>, <the newest files torn")
    assert torn.endswith("skip the files that cannot be read, fit from the newest")


def test_4_5_a_right_answer_gets_no_warning_about_the_check_s_own_trainer():
    """Neither the check's callbacks nor its reuse of a checkpoint folder may print a Lightning warning under a
    right answer: the learner would read them as their own mistake."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every time, not once per place: a warning shown earlier counts too
        warnings.simplefilter("ignore", DeprecationWarning)  # as Python's defaults do outside __main__
        quiet_library_warnings()  # as the course's kernel does
        assert verdict("4.5", {"resume_training": resume_newest_readable}) == "passed"
    assert [str(w.message) for w in caught] == []


# ---------------------------------------------------------------------------------------- 4.6 (stretch) task slots


def slots_plain(executors, cores, task_cpus, gpus, task_gpus):
    per_executor = cores // task_cpus
    if 0 < task_gpus <= 0.5:
        per_executor = min(per_executor, gpus * math.floor(1 / task_gpus))
    elif task_gpus > 0:
        per_executor = min(per_executor, int(gpus // task_gpus))
    return executors * per_executor


def slots_numpy(executors, cores, task_cpus, gpus, task_gpus):
    import numpy as np

    limits = [np.floor_divide(cores, task_cpus)]
    if task_gpus:
        limits.append(gpus * np.floor(1 / task_gpus) if task_gpus <= 0.5 else np.floor(gpus / task_gpus))
    return np.int64(executors) * np.min(limits).astype(np.int64)


def slots_truncated_shares(executors, cores, task_cpus, gpus, task_gpus):
    by_cores = cores // task_cpus
    if not task_gpus:
        return executors * by_cores
    by_gpus = gpus * int(1 / task_gpus) if task_gpus < 1 else gpus // task_gpus
    return executors * int(min(by_cores, by_gpus))


def slots_gpus_divided(executors, cores, task_cpus, gpus, task_gpus):
    """Divides the GPUs by the task amount, as if shares of two GPUs could make up one task's."""
    per_executor = cores // task_cpus
    if task_gpus > 0:
        per_executor = min(per_executor, int(gpus // task_gpus))
    return executors * per_executor


def slots_rounded_shares(executors, cores, task_cpus, gpus, task_gpus):
    per_executor = cores // task_cpus
    if 0 < task_gpus <= 0.5:
        per_executor = min(per_executor, gpus * round(1 / task_gpus))
    elif task_gpus > 0:
        per_executor = min(per_executor, int(gpus // task_gpus))
    return executors * per_executor


def slots_delegating(executors, cores, task_cpus, gpus, task_gpus):
    from helpers.spark import gpu_task_slots

    per_executor = cores // task_cpus
    return executors * (min(per_executor, gpu_task_slots(gpus, task_gpus)) if task_gpus else per_executor)


def slots_cores_only(executors, cores, task_cpus, gpus, task_gpus):
    return executors * (cores // task_cpus)


def slots_gpus_only(executors, cores, task_cpus, gpus, task_gpus):
    return executors * int(gpus // task_gpus) if task_gpus else executors * cores


def slots_constant(executors, cores, task_cpus, gpus, task_gpus):
    return 2


def slots_rounded_total(executors, cores, task_cpus, gpus, task_gpus):
    total = executors * cores // task_cpus
    return min(total, int(executors * gpus // task_gpus)) if task_gpus else total


@pytest.mark.parametrize(
    "answer, expected",
    [
        (slots_plain, "passed"),
        (slots_numpy, "passed"),
        (slots_truncated_shares, "passed"),
        (slots_gpus_divided, "failed"),
        (slots_rounded_shares, "failed"),
        (slots_delegating, "failed"),
        (slots_cores_only, "failed"),
        (slots_gpus_only, "failed"),
        (slots_constant, "failed"),
        (slots_rounded_total, "failed"),
    ],
)
def test_4_6_task_slots(answer, expected):
    assert verdict("4.6", {"max_processes": answer}) == expected


def test_4_6_cases_tell_spark_s_gpu_shares_from_division_and_rounding():
    from helpers.course.checks.lesson4 import cluster_task_slots
    from helpers.spark import gpu_task_slots

    shares = [(gpus, share) for _, _, _, gpus, share in cluster_task_slots.cases() if 0 < share <= 0.5 and gpus]
    assert any(gpu_task_slots(gpus, share) != int(gpus // share) for gpus, share in shares)
    assert any(gpu_task_slots(gpus, share) != gpus * round(1 / share) for gpus, share in shares)
    assert len(set(cluster_task_slots.cases())) >= 35  # the drawn clusters are not the fixed ones again


def test_unanswered_exercises_are_not_attempted():
    def stub(*args): ...

    for exercise, names in {
        "4.1": ["launch_on_workers"],
        "4.2": ["make_torch_distributor", "trainer_layout"],
        "4.4": ["launcher_table"],
        "4.3": ["ddp_train"],
        "4.5": ["resume_training"],
        "4.6": ["max_processes"],
    }.items():
        status, _ = _run(exercise, {name: stub for name in names})
        assert status == "not attempted", exercise
