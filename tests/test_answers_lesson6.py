"""Answer corpus for lesson 6: right answers written differently pass, lazy, hard-coded, subtly wrong and delegated
ones fail.

Every answer goes through its real check (``helpers.course.checks._run``). 6.1, 6.3 and 6.4 run here, in this
process (nothing is launched). 6.2 needs a Ray cluster on Spark workers: its answers run in the Ray part of the
suite's one cluster session (the ``ray_session`` fixture, tests/scripts/ray_session.py), each through the check as
the lesson runs it,
and the 6.2 tests judge the verdicts. Answers that fail in the check's simulated ranks never reach Ray; the others
each run one short Ray Train job.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.course.checks import _run


def verdict(exercise: str, answer) -> str:
    status, message = _run(exercise, answer)
    print(status, message)  # shown by pytest when the verdict is not the expected one
    assert status in ("passed", "failed"), (status, message)
    return status


# ---------------------------------------------------------------------------------------- 6.1 Ray Train's scaling


def scaling_keywords(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    node = worker_nodes[0]
    if use_gpu:
        gpus = int(node["GPU"])
        return ScalingConfig(
            num_workers=gpus * len(worker_nodes), use_gpu=True, resources_per_worker={"CPU": node["CPU"] // gpus}
        )
    return ScalingConfig(num_workers=len(worker_nodes), resources_per_worker={"CPU": node["CPU"]})


def scaling_spelled_out(worker_nodes, use_gpu):
    import math

    import numpy as np
    from ray.train import ScalingConfig

    per_node = int(worker_nodes[0].get("GPU", 0)) if use_gpu else 1
    each = {"CPU": np.int64(math.floor(worker_nodes[0]["CPU"] / per_node))}
    if use_gpu:
        each["GPU"] = 1.0
    workers = sum(per_node for _ in worker_nodes)
    return ScalingConfig(
        num_workers=workers, use_gpu=bool(use_gpu), resources_per_worker=each, placement_strategy="SPREAD"
    )


def scaling_one_worker_per_node(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    node = worker_nodes[0]
    return ScalingConfig(num_workers=len(worker_nodes), use_gpu=use_gpu, resources_per_worker={"CPU": node["CPU"]})


def scaling_all_cpus_each(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    node = worker_nodes[0]
    workers = len(worker_nodes) * (int(node["GPU"]) if use_gpu else 1)
    return ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker={"CPU": node["CPU"]})


def scaling_rounded_share(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    node = worker_nodes[0]
    per_node = int(node["GPU"]) if use_gpu else 1
    each = round(node["CPU"] / per_node)  # 8 CPUs for 3 GPUs: 3 each, 9 in all
    return ScalingConfig(num_workers=len(worker_nodes) * per_node, use_gpu=use_gpu, resources_per_worker={"CPU": each})


def scaling_gpus_when_present(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    node = worker_nodes[0]
    gpus = int(node.get("GPU", 0))  # ignores use_gpu: trains on GPUs whenever the nodes have them
    if gpus:
        return ScalingConfig(
            num_workers=gpus * len(worker_nodes), use_gpu=True, resources_per_worker={"CPU": node["CPU"] // gpus}
        )
    return ScalingConfig(num_workers=len(worker_nodes), resources_per_worker={"CPU": node["CPU"]})


def scaling_default_cpus(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    per_node = int(worker_nodes[0]["GPU"]) if use_gpu else 1
    return ScalingConfig(num_workers=len(worker_nodes) * per_node, use_gpu=use_gpu)  # Ray's default: 1 CPU each


def scaling_lessons_cluster(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=2, use_gpu=use_gpu, resources_per_worker={"CPU": 1})


def scaling_a_dict(worker_nodes, use_gpu):
    return {"num_workers": len(worker_nodes), "use_gpu": use_gpu, "resources_per_worker": {"CPU": 1}}


def scaling_changes_the_cluster(worker_nodes, use_gpu):
    from ray.train import ScalingConfig

    del worker_nodes[1:]  # then "every node" is the first one
    worker_nodes[0]["CPU"] = 1.0
    worker_nodes[0].pop("GPU", None)
    return ScalingConfig(num_workers=1, use_gpu=use_gpu, resources_per_worker={"CPU": 1})


def scaling_delegated(worker_nodes, use_gpu):
    from types import SimpleNamespace

    from helpers.ray_launcher import _trainer

    job = SimpleNamespace(path=Path("unused"))
    node = worker_nodes[0]
    per_node = int(node["GPU"]) if use_gpu else 1
    return _trainer(print, job, len(worker_nodes) * per_node, int(node["CPU"] // per_node), use_gpu).scaling_config


@pytest.mark.parametrize(
    "answer, expected",
    [
        (scaling_keywords, "passed"),
        (scaling_spelled_out, "passed"),
        (scaling_one_worker_per_node, "failed"),
        (scaling_all_cpus_each, "failed"),
        (scaling_rounded_share, "failed"),
        (scaling_gpus_when_present, "failed"),
        (scaling_default_cpus, "failed"),
        (scaling_lessons_cluster, "failed"),
        (scaling_a_dict, "failed"),
        (scaling_changes_the_cluster, "failed"),
        (scaling_delegated, "failed"),
    ],
)
def test_6_1_scaling_config(answer, expected):
    assert verdict("6.1", {"scaling_config": answer}) == expected


def test_6_1_the_hint_says_how_to_share_a_nodes_cpus():
    _, message = _run("6.1", {"scaling_config": scaling_rounded_share})
    assert message.startswith(
        "scaling_config(<3 worker nodes of 8 CPUs and 3 GPUs>, use_gpu=True) gives each worker 3 CPU and 1 GPU, "
        "expected 2 and 1: a node's 8 CPUs shared by its 3 workers is 2 each (rounded down"
    ), message


def test_6_1_an_answer_is_judged_on_the_cluster_as_it_was_given():
    _, message = _run("6.1", {"scaling_config": scaling_changes_the_cluster})
    assert message == (
        "scaling_config(<2 worker nodes of 1 CPUs>, use_gpu=False) has num_workers=1: one worker per worker node is 2"
    ), message


# ---------------------------------------------------------------------------------------- 6.3 ZeRO memory per device


def bytes_if_chain(param_count, stage, world_size, k=12):
    params, grads, states = 2 * param_count, 2 * param_count, k * param_count
    if stage >= 1:
        states /= world_size
    if stage >= 2:
        grads /= world_size
    if stage == 3:
        params /= world_size
    return params + grads + states


def bytes_table(param_count, stage, world_size, k=12):
    import numpy as np

    divisors = {0: (1, 1, 1), 1: (1, 1, world_size), 2: (1, world_size, world_size), 3: (world_size,) * 3}
    return float(np.dot(np.array([2, 2, k]) * param_count, 1 / np.array(divisors[int(stage)], dtype=float)))


def bytes_whole_shards(param_count, stage, world_size, k=12):
    shard = -(-param_count // world_size)  # a device's part, rounded up to whole parameters
    per_kind = [(2, 3), (2, 2), (k, 1)]  # bytes per parameter, the stage that starts splitting it
    return sum(size * (shard if stage >= first else param_count) for size, first in per_kind)


def bytes_stage_off_by_one(param_count, stage, world_size, k=12):
    return bytes_if_chain(param_count, min(stage + 1, 3), world_size, k)


def bytes_k_ignored(param_count, stage, world_size, k=12):
    return bytes_if_chain(param_count, stage, world_size)


def bytes_everything_split(param_count, stage, world_size, k=12):
    total = (4 + k) * param_count
    return total if stage == 0 else total / world_size


def bytes_constant(param_count, stage, world_size, k=12):
    return 16 * param_count


def bytes_delegated(param_count, stage, world_size, k=12):
    from helpers.zero import zero_memory

    return zero_memory(param_count, stage, world_size, optimizer_bytes=k).loc[stage, "total_bytes"]


@pytest.mark.parametrize(
    "answer, expected",
    [
        (bytes_if_chain, "passed"),
        (bytes_table, "passed"),
        (bytes_whole_shards, "passed"),
        (bytes_stage_off_by_one, "failed"),
        (bytes_k_ignored, "failed"),
        (bytes_everything_split, "failed"),
        (bytes_constant, "failed"),
        (bytes_delegated, "failed"),
    ],
)
def test_6_3_zero_bytes(answer, expected):
    assert verdict("6.3", {"zero_bytes": answer}) == expected


def test_6_3_the_reference_is_the_papers_example():
    from helpers.course.checks.lesson6 import paper_bytes

    # Rajbhandari et al. 2020, figure 1: 7.5B parameters, 64 devices, K = 12
    assert [round(paper_bytes(7.5e9, stage, 64) / 1e9, 1) for stage in range(4)] == [120.0, 31.4, 16.6, 1.9]


# ---------------------------------------------------------------------------------------- 6.4 a ZeRO configuration


def config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = {
        "train_batch_size": micro_batch_size * accumulation * world_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "SGD", "params": {"lr": learning_rate, "momentum": 0.9}},
        "zero_optimization": {"stage": stage},
    }
    if stage > 0:
        config["zero_allow_untested_optimizer"] = True
    return config


def config_without_total(stage, micro_batch_size, world_size, accumulation, learning_rate):
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "SGD", "params": {"momentum": 0.9, "lr": learning_rate}},
        "zero_optimization": {"stage": stage, "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
    }


def config_total_and_micro(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate)
    del config["gradient_accumulation_steps"]  # DeepSpeed computes it from the other two
    return config


def config_total_without_accumulation(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate)
    config["train_batch_size"] = micro_batch_size * world_size
    return config


def config_without_the_flag(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate)
    config.pop("zero_allow_untested_optimizer", None)
    return config


def config_lowercase_sgd(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate)
    config["optimizer"]["type"] = "sgd"  # DeepSpeed looks torch's optimizers up by their exact name
    return config


def config_stage_two(stage, micro_batch_size, world_size, accumulation, learning_rate):
    return config_solution(2, micro_batch_size, world_size, accumulation, learning_rate)


def config_adam(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate)
    config["optimizer"] = {"type": "Adam", "params": {"lr": learning_rate}}
    return config


def config_fp16(stage, micro_batch_size, world_size, accumulation, learning_rate):
    return {
        **config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate),
        "fp16": {"enabled": True},
    }


def config_micro_as_total(stage, micro_batch_size, world_size, accumulation, learning_rate):
    config = config_solution(stage, micro_batch_size, world_size, accumulation, learning_rate)
    del config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    config["train_batch_size"] = micro_batch_size
    return config


def config_delegated(stage, micro_batch_size, world_size, accumulation, learning_rate):
    from helpers.zero import zero_config

    return zero_config(
        stage,
        micro_batch_size=micro_batch_size,
        world_size=world_size,
        gradient_accumulation=accumulation,
        learning_rate=learning_rate,
    )


@pytest.mark.parametrize(
    "answer, expected",
    [
        (config_solution, "passed"),
        (config_without_total, "passed"),
        (config_total_and_micro, "passed"),
        (config_total_without_accumulation, "failed"),
        (config_without_the_flag, "failed"),
        (config_lowercase_sgd, "failed"),
        (config_stage_two, "failed"),
        (config_adam, "failed"),
        (config_fp16, "failed"),
        (config_micro_as_total, "failed"),
        (config_delegated, "failed"),
    ],
)
def test_6_4_zero_config(answer, expected):
    assert verdict("6.4", {"zero_config_for": answer}) == expected


def test_6_4_deepspeeds_own_parser_speaks_in_the_hint():
    _, message = _run("6.4", {"zero_config_for": config_total_without_accumulation})
    assert "train_batch_size=" in message and "must equal train_micro_batch_size_per_gpu" in message
    _, message = _run("6.4", {"zero_config_for": config_without_the_flag})
    assert "zero_allow_untested_optimizer" in message


def test_unanswered_exercises_are_not_attempted():
    def stub(*args): ...

    def forgot_to_return(*args):
        args = list(args)

    for exercise, name in {"6.1": "scaling_config", "6.3": "zero_bytes", "6.4": "zero_config_for"}.items():
        assert _run(exercise, {name: stub})[0] == "not attempted", exercise
        assert _run(exercise, {name: forgot_to_return})[0] == "not attempted", exercise
    assert _run("6.2", {"train_loop_per_worker": stub})[0] == "not attempted"


# ----------------------------------------------------------------------------------- 6.2 the Ray Train worker function


def loop_ray_context(config):
    import pytorch_lightning as pl
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    class ReportToRay(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            ray.train.report({name: value.item() for name, value in trainer.callback_metrics.items()})

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    model = LitClassificationModel(
        config["class_count"], learning_rate=config["learning_rate"] * world_size, image_size=config["image_size"]
    )
    data = PetastormDataModule(
        config["train_converter"],
        config["val_converter"],
        config["batch_size"],
        config["image_size"],
        device_id=rank,
        device_count=world_size,
    )
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        accelerator="gpu" if config["use_gpu"] else "cpu",
        devices="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[ReportToRay()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    prepare_trainer(trainer).fit(model, datamodule=data)


def loop_environment_and_own_report(config):
    import pytorch_lightning as pl
    from ray import train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    class ReportEpochs(pl.Callback):
        def on_validation_end(self, trainer, pl_module):  # the epoch's metrics are in, the sanity check's too
            if not trainer.sanity_checking:
                train.report({"val_loss": float(trainer.callback_metrics["val_loss"]), "epoch": trainer.current_epoch})

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        accelerator="cpu",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[ReportEpochs()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
    )
    model = LitClassificationModel(config["class_count"], config["learning_rate"] * world_size)
    trainer.fit(
        model,
        datamodule=PetastormDataModule(
            config["train_converter"],
            config["val_converter"],
            batch_size=config["batch_size"],
            image_size=config["image_size"],
            device_id=rank,
            device_count=world_size,
        ),
    )


def loop_two_workers(config):
    import pytorch_lightning as pl
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    rank = ray.train.get_context().get_world_rank()
    data = PetastormDataModule(
        config["train_converter"], config["val_converter"], config["batch_size"], config["image_size"], rank, 2
    )
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(LitClassificationModel(config["class_count"], 2 * config["learning_rate"]), datamodule=data)


def loop_same_shard(config):
    import pytorch_lightning as pl
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    data = PetastormDataModule(
        config["train_converter"], config["val_converter"], config["batch_size"], config["image_size"]
    )
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(LitClassificationModel(config["class_count"], config["learning_rate"]), datamodule=data)


def loop_no_report(config):
    import pytorch_lightning as pl
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    data = PetastormDataModule(
        config["train_converter"], config["val_converter"], config["batch_size"], config["image_size"], rank, world_size
    )
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    prepare_trainer(trainer).fit(LitClassificationModel(config["class_count"]), datamodule=data)


def loop_default_strategy(config):
    import pytorch_lightning as pl
    import ray.train

    from helpers.datamodule import PetastormDataModule
    from helpers.model import LitClassificationModel

    context = ray.train.get_context()
    data = PetastormDataModule(
        config["train_converter"],
        config["val_converter"],
        config["batch_size"],
        config["image_size"],
        context.get_world_rank(),
        context.get_world_size(),
    )
    trainer = pl.Trainer(max_epochs=config["max_epochs"], accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.fit(LitClassificationModel(config["class_count"]), datamodule=data)


def loop_delegated(config):
    from helpers.worker import TrainSettings, train_process

    settings = TrainSettings(
        batch_size=config["batch_size"], image_size=config["image_size"], max_epochs=config["max_epochs"]
    )
    train_process("ray", config["train_converter"], config["val_converter"], config["class_count"], settings)


LOOPS = {
    "loop_ray_context": (loop_ray_context, "passed"),
    "loop_environment_and_own_report": (loop_environment_and_own_report, "passed"),
    "loop_two_workers": (loop_two_workers, "failed"),
    "loop_same_shard": (loop_same_shard, "failed"),
    "loop_no_report": (loop_no_report, "failed"),
    "loop_default_strategy": (loop_default_strategy, "failed"),
    "loop_delegated": (loop_delegated, "failed"),
}


@pytest.fixture(scope="module")
def ray_verdicts(ray_session) -> dict:
    """Every 6.2 answer's verdict, from the suite's one Ray session (tests/scripts/ray_session.py)."""
    return ray_session["verdicts"]


@pytest.mark.slow
@pytest.mark.parametrize("name", LOOPS)
def test_6_2_ray_training_function(ray_verdicts, name):
    status, message = ray_verdicts[name]
    print(status, message)
    assert status == LOOPS[name][1]


@pytest.mark.slow
def test_6_2_the_hints_name_the_mistake(ray_verdicts):
    assert "reported 0 times to Ray, never a val_loss" in ray_verdicts["loop_no_report"][1]
    assert "reads shard 0 of 1" in ray_verdicts["loop_same_shard"][1]
    assert "shard" in ray_verdicts["loop_two_workers"][1] and "of 2" in ray_verdicts["loop_two_workers"][1]
    assert "train_process" in ray_verdicts["loop_delegated"][1]
