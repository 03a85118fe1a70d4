"""Checks for lesson 6: Ray Train on a Ray cluster on Spark, and DeepSpeed's ZeRO.

6.1, 6.3 and 6.4 run the answer on inputs generated here with a fixed seed and compare with references computed
here, independently of the course's helpers: Ray's own ``ScalingConfig`` arithmetic (6.1), the ZeRO paper's formulas
(6.3), DeepSpeed's own config parser and the batch arithmetic (6.4). 6.2 calls the training function here as ranks of
a simulated Ray Train job of another size (stopped when it fits), then runs it for one epoch with Ray Train on the
notebook's Ray cluster and reads what every worker did. An answer that calls the helper doing the exercise fails
(``own_work``).
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np

from helpers.course.checks import (
    close,
    quiet_lightning,
    register,
    require,
    whole_number,
)
from helpers.course.checks.function_check import NUMBER, Case, FunctionCheck, FunctionChecks, Returns, Seen, Watched
from helpers.course.checks.ranks import recorded_fits, torchrun_env

__all__ = [
    "LOOP_CONFIG_KEYS",
    "effective_batch",
    "expected_scaling",
    "paper_bytes",
    "ray_scaling_config",
    "ray_training_function",
    "zero_memory_per_device",
]

#: what ``train_loop_per_worker(config)`` finds in ``config`` (exercise 6.2)
LOOP_CONFIG_KEYS = (
    "train_converter",
    "val_converter",
    "class_count",
    "batch_size",
    "image_size",
    "learning_rate",
    "max_epochs",
    "use_gpu",
)


# ---------------------------------------------------------------------------------------------------------- 6.1


def _nodes(count: int, cpus: int, gpus: int) -> list[dict[str, Any]]:
    """``count`` alike worker nodes as ``ray.nodes()`` gives their resources: ``CPU``, ``GPU`` on GPU nodes, and
    others (``memory``, the node's own ``node:<address>``) an answer must leave alone."""
    extra = {"GPU": float(gpus)} if gpus else {}
    return [{"CPU": float(cpus), **extra, "memory": 2.0**33, f"node:10.0.0.{n + 2}": 1.0} for n in range(count)]


def _draw_cluster(rng: random.Random) -> tuple[list[dict[str, Any]], bool]:
    """A cluster of 1-6 GPU nodes whose CPUs may not divide evenly among the GPUs, trained on the GPUs or not."""
    gpus = rng.choice([1, 2, 4, 8])
    return _nodes(rng.randint(1, 6), gpus * rng.choice([1, 2, 3, 4]) + rng.randint(0, 1), gpus), rng.random() < 0.67


def expected_scaling(worker_nodes: list[dict[str, Any]], use_gpu: bool) -> tuple[int, int, int]:
    """``(num_workers, cpus_per_worker, gpus_per_worker)`` that use a cluster of alike ``worker_nodes``: one worker
    per GPU, each with its whole share of the node's CPUs; without GPUs one worker per node, with all its CPUs."""
    node = worker_nodes[0]
    if use_gpu:
        gpus = int(node["GPU"])
        return len(worker_nodes) * gpus, int(node["CPU"] // gpus), 1
    return len(worker_nodes), int(node["CPU"]), 0


#: the course's helpers that would build the scaling configuration or launch the job for the learner
_RAY_LAUNCHER = ("helpers.ray_launcher:run_with_ray", "helpers.ray_launcher:_trainer")


def _describe(case: tuple[list[dict[str, Any]], bool]) -> str:
    """``<3 worker nodes of 8 CPUs and 3 GPUs>, use_gpu=True``: how a hint shows 6.1's call."""
    worker_nodes, use_gpu = case
    node = worker_nodes[0]
    gpus = f" and {node['GPU']:g} GPUs" if node.get("GPU") else ""
    return f"<{len(worker_nodes)} worker nodes of {node['CPU']:g} CPUs{gpus}>, use_gpu={use_gpu}"


def _scaling_problem(case: tuple[list[dict[str, Any]], bool], config: Any, _given: tuple) -> str | None:
    """What is wrong with the ``ScalingConfig`` returned for the cluster ``case``, or None: Ray's own properties
    say what it asks for."""
    from ray.air.config import ScalingConfig  # Ray Train V2's ScalingConfig is a subclass

    worker_nodes, use_gpu = case
    if not isinstance(config, ScalingConfig):
        return f"returned {config!r}: return a ray.train.ScalingConfig(...)"
    workers, cpus, gpus = expected_scaling(worker_nodes, use_gpu)
    if bool(config.use_gpu) != use_gpu:
        return f"has use_gpu={config.use_gpu!r}: pass use_gpu through (it gives each worker a GPU)"
    if config.num_workers != workers:
        rule = "one worker per GPU of every node" if use_gpu else "one worker per worker node"
        return f"has num_workers={config.num_workers!r}: {rule} is {workers}"
    got = (config.num_cpus_per_worker, config.num_gpus_per_worker)
    if got != (cpus, gpus):
        share = (
            f"a node's {worker_nodes[0]['CPU']:g} CPUs shared by its {workers // len(worker_nodes)} workers is {cpus} "
            "each (rounded down: a worker's CPUs are whole)"
            if use_gpu
            else f"each worker holds all {cpus} CPUs of its node"
        )
        return (
            f"gives each worker {got[0]:g} CPU and {got[1]:g} GPU, expected {cpus} and {gpus}: {share}; "
            'set resources_per_worker={"CPU": ...}'
        )
    return None


#: ``scaling_config(worker_nodes, use_gpu)``: Ray Train's ``ScalingConfig`` that uses every worker node of a Ray
#: cluster on Spark (one worker per GPU, or per node without GPUs, each with its share of the node's CPUs), on the
#: lesson's 2 one-CPU nodes, a GPU cluster whose CPUs do not divide evenly, one trained on its CPUs alone, and 6
#: drawn clusters; calling the course's Ray launcher is delegating
ray_scaling_config = register("6.1")(
    FunctionCheck(
        "6.1",
        answer="scaling_config",
        fixed=[(_nodes(2, 1, 0), False), (_nodes(3, 8, 3), True), (_nodes(2, 16, 4), False)],
        draw=_draw_cluster,
        draws=6,
        judge=_scaling_problem,
        show=_describe,
        forbid=_RAY_LAUNCHER,
        hint='one worker per GPU (or per node), resources_per_worker={"CPU": its share of the node\'s CPUs}',
        passed="{n} Ray clusters, each used whole: one worker per GPU (or node), each with its share of the CPUs",
    )
)


# ---------------------------------------------------------------------------------------------------------- 6.2

#: The course's helpers that would do exercise 6.2 for the learner.
_LOOP_HELPERS = (
    "helpers.worker:train_process",
    "helpers.worker:_rank_and_strategy",
    "helpers.worker:train_with_ray",
    *_RAY_LAUNCHER,
)


@contextmanager
def _ray_session(rank: int, world_size: int) -> Iterator[None]:
    """This process as worker ``rank`` of a Ray Train (V2) job of ``world_size`` workers, one per node (what Ray's
    ``get_context()`` and its Lightning utilities read); it never gets as far as reporting."""
    from ray.train.v2._internal.execution import context

    fake = SimpleNamespace(
        get_world_rank=lambda: rank,
        get_world_size=lambda: world_size,
        get_local_rank=lambda: 0,
        get_local_world_size=lambda: 1,
        get_node_rank=lambda: rank,
        get_experiment_name=lambda: "check-6.2",
        get_checkpoint=lambda: None,
        report=lambda metrics, checkpoint=None, checkpoint_dir_name=None: None,
    )
    saved = context._train_context
    context.set_train_context(fake)
    try:
        yield
    finally:
        context.set_train_context(saved)


def _ray_fit_problem(fits: list[dict[str, Any]], rank: int, world_size: int, use_gpu: bool) -> str | None:
    """What is wrong with the first Trainer of ``rank``, or None: the job's world size and this rank, DDP, this
    rank's shard, the accelerator."""
    if not fits:
        return "never fits a Trainer: call trainer.fit(model, datamodule=...)"
    fit = fits[0]
    if (fit["world_size"], fit["global_rank"]) != (world_size, rank):
        return (
            f"builds a Trainer that sees world size {fit['world_size']} and rank {fit['global_rank']}: use "
            "strategy=RayDDPStrategy() with plugins=[RayLightningEnvironment()], which take both from Ray's context"
        )
    if "DDP" not in fit["strategy"]:
        return f"builds a Trainer with the strategy {fit['strategy']}: use RayDDPStrategy()"
    if fit["shard"] != [rank, world_size]:
        return (
            f"gives the Trainer a datamodule that reads shard {fit['shard'][0]} of {fit['shard'][1]}: use "
            "device_id=rank and device_count=world_size from ray.train.get_context()"
        )
    if fit["gpu"] != use_gpu:
        return (
            f"trains on the {'GPU' if fit['gpu'] else 'CPU'} but config['use_gpu'] is {use_gpu}: "
            "accelerator='gpu' if config['use_gpu'] else 'cpu'"
        )
    return None


def _loop_config(namespace: Mapping[str, Any], use_gpu: bool) -> dict[str, Any]:
    """The loop's configuration for one short training by the check (see :data:`LOOP_CONFIG_KEYS`): the notebook's
    converters and classes, small images, one epoch."""
    train_converter, val_converter, class_names = require(namespace, "train_converter", "val_converter", "class_names")
    return {
        "train_converter": train_converter,
        "val_converter": val_converter,
        "class_count": len(class_names),
        "batch_size": 16,
        "image_size": 8,
        "learning_rate": 0.01,
        "max_epochs": 1,
        "use_gpu": use_gpu,
    }


def _simulated_workers(namespace: Mapping[str, Any]) -> list[Case]:
    """The calls made in this process, ``(config, world_size, rank)``: the first and last worker of a job of
    another size than the lesson's."""
    world_size = random.Random(62).randint(3, 4)
    return [Case((_loop_config(namespace, use_gpu=False), world_size, rank)) for rank in (0, world_size - 1)]


@contextmanager
def _simulated_worker(case: tuple, _given: tuple) -> Iterator[Seen]:
    """This process as a worker of a Ray Train job (the case's), its Trainers recorded and stopped at ``fit``; the
    environment Lightning's launchers export "for the other ranks" (``MASTER_ADDR``, ``NODE_RANK``...) undone."""
    _config, world_size, rank = case
    seen = Seen(fits=[])
    with torchrun_env(rank, world_size, local_mode=False), _ray_session(rank, world_size):
        saved = dict(os.environ)
        try:
            with recorded_fits(seen["fits"], stop=True), quiet_lightning():
                yield seen
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _simulated_problem(case: tuple, got: Watched, _given: tuple) -> str | None:
    _config, world_size, rank = case
    problem = _ray_fit_problem(got.seen["fits"], rank, world_size, use_gpu=False)
    return problem and f"as rank {rank} of {world_size} Ray Train workers {problem}"


def _ray_job(namespace: Mapping[str, Any]) -> list[Case]:
    """The call made in the real job, ``(config, workers)``: on the notebook's ``WORKERS`` Ray Train workers (on
    GPUs where ``USE_GPU``), on the Ray cluster it started."""
    config = _loop_config(namespace, use_gpu=bool(namespace.get("USE_GPU", False)))
    return [Case((config, whole_number(namespace.get("WORKERS", 2), "WORKERS")))]


def _on_ray(processes: int, job, kwargs: dict[str, Any]) -> None:
    """Run ``job(**kwargs)`` in ``processes`` Ray Train workers on the connected Ray cluster (on GPUs where the
    case's config says so)."""
    from helpers.ray_launcher import run_with_ray

    run_with_ray(job, processes, use_gpu=kwargs["cases"][0][0]["use_gpu"], **kwargs)


def _number(value: Any) -> float | None:
    """A reported metric as a float (tensors included), None if it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@contextmanager
def _reports_recorded(_case: tuple, _given: tuple) -> Iterator[Seen]:
    """In a worker of the real job: its Trainers recorded and fitted, and what it reports to Ray recorded and
    passed on."""
    from ray.train.v2._internal.execution.context import get_train_context

    live = get_train_context()
    forward = live.report
    seen = Seen(fits=[], reports=[])

    def recorded(metrics, checkpoint=None, checkpoint_dir_name=None):
        seen["reports"].append({key: _number(value) for key, value in metrics.items()})
        return forward(metrics, checkpoint=checkpoint, checkpoint_dir_name=checkpoint_dir_name)

    live.report = recorded
    try:
        with recorded_fits(seen["fits"], stop=False):
            yield seen
    finally:
        live.report = forward


def _ray_problem(case: tuple, per_rank: list[Watched], _given: tuple) -> str | None:
    """Every worker of the real job fitted the right Trainer and reported a finite ``val_loss`` to Ray."""
    config, workers = case
    for rank, got in enumerate(per_rank):
        where = f"as rank {rank} of {workers} Ray Train workers"
        problem = _ray_fit_problem(got.seen["fits"], rank, workers, config["use_gpu"])
        if problem:
            return f"{where} {problem}"
        losses = [report.get("val_loss") for report in got.seen["reports"]]
        if not any(loss is not None and math.isfinite(loss) for loss in losses):
            return (
                f"{where} reported {len(losses)} times to Ray, never a val_loss: call ray.train.report with "
                "trainer.callback_metrics on every worker, from a callback's on_train_epoch_end"
            )
    return None


_LOOP_DECLARED = dict(
    answer="train_loop_per_worker",
    fixed=(),
    forbid=_LOOP_HELPERS,
    arguments=lambda case: (dict(case[0]),),
    show=lambda _case: "config",
    effect_only=True,
    passed="",
)

#: ``train_loop_per_worker(config)``: what every Ray Train worker runs (rank and world size from Ray's context, this
#: rank's shard, lesson 2's model, Lightning under Ray's DDP strategy, metrics reported to Ray). Called here as two
#: workers of a simulated job of 3 or 4 (stopped at ``fit``), then run for one epoch on small images with Ray Train
#: on the notebook's Ray cluster (its ``WORKERS`` workers), where every worker records its Trainer and its reports.
ray_training_function = register("6.2")(
    FunctionChecks(
        (
            FunctionCheck(
                "6.2",
                **_LOOP_DECLARED,
                from_namespace=_simulated_workers,
                around=_simulated_worker,
                judge=_simulated_problem,
                hint="read the rank and world size from ray.train.get_context() and train under RayDDPStrategy",
                passed_namespace=lambda own: f"the right rank, world size and shard as ranks of {own[0].args[1]} "
                "workers",
            ),
            FunctionCheck(
                "6.2",
                **_LOOP_DECLARED,
                from_namespace=_ray_job,
                processes=lambda cases: cases[0][1],
                launch=_on_ray,
                around=_reports_recorded,
                judge=_ray_problem,
                hint=(
                    "train_loop_per_worker runs in every Ray Train worker: use only config and what it imports there "
                    "(not the notebook's globals), and report to Ray from every worker"
                ),
                passed_namespace=lambda own: f"{own[0].args[1]} Ray Train workers trained and reported val_loss to Ray",
            ),
        )
    )
)


# ---------------------------------------------------------------------------------------------------------- 6.3


def paper_bytes(param_count: float, stage: int, world_size: int, k: float = 12) -> float:
    """Model-state bytes per device in the ZeRO paper's notation (Rajbhandari et al. 2020, figure 1).

    With Ψ parameters, ``N_d`` devices and ``K`` bytes of optimizer state per parameter (12 for mixed-precision
    Adam), data parallelism keeps ``(2 + 2 + K) Ψ`` on every device; ``P_os`` keeps ``4Ψ + KΨ/N_d``, ``P_os+g``
    keeps ``2Ψ + (2 + K)Ψ/N_d`` and ``P_os+g+p`` keeps ``(2 + 2 + K)Ψ/N_d``.

    Args:
        param_count: Ψ.
        stage: 0 (plain data parallelism) to 3.
        world_size: N_d.
        k: K.

    Returns:
        The bytes of parameters, gradients and optimizer state one device holds.

    Raises:
        KeyError: a stage other than 0-3.
    """
    psi, nd = param_count, world_size
    return {
        0: (2 + 2 + k) * psi,
        1: 4 * psi + k * psi / nd,
        2: 2 * psi + (2 + k) * psi / nd,
        3: (2 + 2 + k) * psi / nd,
    }[stage]


def _draw_memory(rng: random.Random) -> tuple[int, ...]:
    """A model and a cluster: up to a trillion parameters, 1024 devices, K of 12 (the answer's default), 8 or 4."""
    case = (rng.randint(10**5, 10**12), rng.randrange(4), rng.choice([2, 3, 4, 8, 16, 24, 64, 100, 1024]))
    k = rng.choice([None, 12, 8, 4])
    return case if k is None else (*case, k)


def _same_bytes(got: Any, expected: float) -> bool:
    """``got`` is ``expected`` bytes, give or take what rounding a shard's size up or down can change (one
    parameter's 16 bytes at most)."""
    return close(got, expected) or abs(float(got) - expected) <= 16


_PAPER_GB = ", ".join(f"{paper_bytes(7.5e9, stage, 64) / 1e9:.3g}" for stage in range(4))

#: ``zero_bytes(param_count, stage, world_size, k=12)``: the model-state bytes one device holds under ZeRO ``stage``,
#: compared with the ZeRO paper's formulas (:func:`paper_bytes`) on the paper's 7.5B-parameter model on 64 devices at
#: every stage, one device, numpy integers and 24 drawn cases (three cases in four without ``k``: its default);
#: calling ``helpers.zero.zero_memory`` or ``zero_fits`` is delegating
zero_memory_per_device = register("6.3")(
    FunctionCheck(
        "6.3",
        answer="zero_bytes",
        fixed=[(7_500_000_000, stage, 64) for stage in range(4)]
        + [(1_000_000, stage, 1) for stage in range(4)]
        + [(np.int64(123_456_789), np.int64(stage), np.int64(24), 8) for stage in (1, 3)],
        draw=_draw_memory,
        draws=24,
        reference=paper_bytes,
        returns=Returns("a number of bytes", NUMBER.is_kind, _same_bytes),
        keywords=True,
        forbid=("helpers.zero:zero_memory", "helpers.zero:zero_fits"),
        hint="every device keeps 2 bytes of parameters, 2 of gradients and k of optimizer state per parameter, and "
        "stage s divides the optimizer state (s >= 1), the gradients (s >= 2) and the parameters (s = 3) by "
        "world_size",
        passed=f"the paper's arithmetic on {{n}} cases: 7.5B parameters on 64 devices hold {_PAPER_GB} GB per device",
    )
)


# ---------------------------------------------------------------------------------------------------------- 6.4


def effective_batch(config: dict[str, Any], world_size: int) -> tuple[float, float, float]:
    """``(train_batch_size, micro_batch, accumulation)`` a DeepSpeed config means on ``world_size`` processes.

    DeepSpeed needs two of the three batch keys and computes the third from
    ``train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size``; with only one
    of them, accumulation is 1.

    Args:
        config: the DeepSpeed config.
        world_size: the processes training together.

    Returns:
        The three numbers, as DeepSpeed resolves them (not checked for consistency: ``check_zero_config`` does).
    """
    total = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    steps = config.get("gradient_accumulation_steps")
    if micro is not None and steps is not None:
        return micro * steps * world_size, micro, steps
    if total is not None and micro is not None:
        return total, micro, total / (micro * world_size)
    steps = 1 if steps is None else steps
    if total is not None:
        return total, total / (steps * world_size), steps
    return (micro or 0) * steps * world_size, micro or 0, steps


def _draw_config(rng: random.Random) -> tuple[int, int, int, int, float]:
    """One more 6.4 case: any stage, batch sizes from 1 to 64, 1 to 16 processes, 1 to 8 accumulation steps."""
    return (
        rng.randrange(4),
        rng.choice([1, 4, 8, 24, 64]),
        rng.choice([1, 2, 3, 8, 16]),
        rng.choice([1, 2, 4, 8]),
        round(rng.uniform(1e-4, 0.1), 5),
    )


def _judge_config(case: tuple[int, int, int, int, float], config: Any, _given: tuple) -> str | None:
    """What is wrong with ``config`` for ``case``, or None: it must be a JSON-able DeepSpeed config DeepSpeed's
    parser accepts (``helpers.zero.check_zero_config``), with the stage, the batch arithmetic, lesson 2's SGD
    (momentum 0.9) at the learning rate, and fp32."""
    from helpers import CourseInputError
    from helpers.zero import check_zero_config

    stage, micro, world, steps, lr = case
    if not isinstance(config, dict):
        return f"returned a {type(config).__name__}: return the DeepSpeed config as a dict"
    try:
        json.dumps(config)
    except (TypeError, ValueError) as error:
        return f"is not JSON ({error}): the distributor writes it to a file"
    try:
        check_zero_config(config, world)
    except CourseInputError as error:
        return f"is refused: {error}"
    got_stage = config.get("zero_optimization", {}).get("stage", 0)
    if got_stage != stage:
        return f"has zero_optimization.stage={got_stage!r}, expected {stage}"
    got = effective_batch(config, world)
    if tuple(map(float, got)) != (micro * steps * world, micro, steps):
        return (
            f"means train_batch_size, micro batch, accumulation = {got}, expected "
            f"{(micro * steps * world, micro, steps)}: train_batch_size is the global batch of one optimizer step, "
            "micro batch x accumulation x world size"
        )
    optimizer = config.get("optimizer") or {}
    params = optimizer.get("params") or {}
    if (
        str(optimizer.get("type", "")).lower() != "sgd"
        or not close(params.get("lr"), lr)
        or params.get("momentum") != 0.9
    ):
        wanted = {"type": "SGD", "params": {"lr": lr, "momentum": 0.9}}
        return f"has the optimizer {optimizer!r}: lesson 2's, {json.dumps(wanted)}"
    if any((config.get(key) or {}).get("enabled") for key in ("fp16", "bf16")):
        return "turns on 16-bit training: this run is in fp32 on the CPU; leave fp16 and bf16 out"
    return None


# a DeepSpeed config for lesson 2's SGD in fp32, checked with DeepSpeed's own parser and the batch arithmetic
register("6.4")(
    FunctionCheck(
        "6.4",
        answer="zero_config_for",
        # this lesson's run (stage 2, 32 rows, 2 processes), then the other stages
        fixed=[(2, 32, 2, 1, 0.02)] + [(stage, 16, 4, 2, 0.01) for stage in (0, 1, 3)],
        draw=_draw_config,
        draws=8,
        judge=_judge_config,
        forbid=("helpers.zero:zero_config",),
        hint="build the dict from the arguments: zero_optimization.stage, the batch sizes (train_batch_size = micro "
        "batch x accumulation x world size), lesson 2's SGD at learning_rate",
        passed="{n} configs for stages 0-3 pass DeepSpeed's parser, with the right batch arithmetic",
    )
)
