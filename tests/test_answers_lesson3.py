"""Lesson 3's checks against a corpus of answers: right ones written differently pass, lazy, hard-coded and subtly
wrong ones fail (never "error"). The Horovod checks start real processes, so most cases are marked slow; each of
those exercises' answers goes through one Horovod job (``check_answers``: every answer in a fresh fork of each
rank, judged by the check's own code), which a test below holds to the one-answer check."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import cloudpickle
import horovod.torch as hvd
import mlflow
import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from helpers.course.checks import _run
from helpers.course.checks.lesson3 import check_answers
from helpers.datamodule import PetastormDataModule
from helpers.devices import device_for_local_rank
from helpers.horovod_strategy import HorovodStrategy
from helpers.loaders import make_loader

# The Horovod workers cannot import this module (tests/ is not on their path): send its answers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def verdict(exercise: str, answer) -> str:
    """The check's status for ``answer``, with its message on failure (for assertion output)."""
    status, message = _run(exercise, answer)
    return status if status == "passed" else f"{status}: {message}"


def assert_fails(exercise: str, answer) -> None:
    status, message = _run(exercise, answer)
    assert status == "failed", (status, message)


@pytest.fixture(scope="module")
def batched(request):
    """``outcome(exercise, case)``: the ``(status, message)`` of a corpus case, from one ``check_answers`` job per
    exercise over all of its cases (:data:`BATCHES`, in that order: wrong answers sit between right ones)."""
    done: dict[str, dict[str, tuple[str, str]]] = {}

    def outcome(exercise: str, case: str) -> tuple[str, str]:
        if exercise not in done:
            cases = BATCHES[exercise]
            extra = request.getfixturevalue("converters") if exercise == "3.1" else {}
            answers = [{**extra, "my_shard_ids": a} if extra else a for a in cases.values()]
            done[exercise] = dict(zip(cases, check_answers(exercise, answers)))
        return done[exercise][case]

    return outcome


# --- 3.1: my_shard_ids ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converters(digits_data):
    """The lesson's converters, prepared for 2 devices (4 files each)."""
    return {"train_converter": digits_data.train_converter, "val_converter": digits_data.val_converter}


def shard_ids_loader(converter):
    hvd.init()
    ids = []
    with make_loader(
        converter, batch_size=128, image_size=8, cur_shard=hvd.rank(), shard_count=hvd.size(), num_epochs=1
    ) as loader:
        for batch in loader:
            ids.extend(batch["row_id"].tolist())
    return ids


def shard_ids_converter(converter):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    with make_loader(converter, 50, 8, rank, size, num_epochs=1) as loader:
        return np.concatenate([batch["row_id"].numpy() for batch in loader])


def shard_ids_two_shards(converter):
    hvd.init()
    with make_loader(converter, image_size=8, cur_shard=hvd.rank() % 2, shard_count=2) as loader:
        return [i for batch in loader for i in batch["row_id"].tolist()]


def shard_ids_unsharded(converter):
    hvd.init()
    with make_loader(converter, image_size=8) as loader:
        return [i for batch in loader for i in batch["row_id"].tolist()]


def shard_ids_datamodule(converter):
    hvd.init()
    module = PetastormDataModule(converter, converter, 64, 8, device_id=hvd.rank(), device_count=hvd.size())
    return [i for batch in module.val_dataloader() for i in batch["row_id"].tolist()]


def shard_ids_one_batch(converter):
    hvd.init()
    with make_loader(converter, image_size=8, cur_shard=hvd.rank(), shard_count=hvd.size()) as loader:
        return next(iter(loader))["row_id"].tolist()


def shard_ids_no_init(converter):
    """Right but for hvd.init(): it must fail even after an answer in the same batch initialised Horovod."""
    with make_loader(converter, image_size=8, cur_shard=hvd.rank(), shard_count=hvd.size(), num_epochs=1) as loader:
        return [i for batch in loader for i in batch["row_id"].tolist()]


def shard_ids_sliced(converter):
    """Disjoint and covering, but every rank reads every row and keeps its slice: no shard asked of Petastorm."""
    hvd.init()
    with make_loader(converter, image_size=8, num_epochs=1) as loader:
        every = [i for batch in loader for i in batch["row_id"].tolist()]
    return sorted(every)[hvd.rank() :: hvd.size()]


RIGHT_31 = [shard_ids_loader, shard_ids_converter]
WRONG_31 = [
    shard_ids_two_shards,
    shard_ids_no_init,
    shard_ids_unsharded,
    shard_ids_datamodule,
    shard_ids_one_batch,
    shard_ids_sliced,
]


@pytest.mark.slow
@pytest.mark.parametrize("answer", RIGHT_31)
def test_3_1_right(batched, answer):
    status, message = batched("3.1", answer.__name__)
    assert status == "passed", message


@pytest.mark.slow
@pytest.mark.parametrize("answer", WRONG_31)
def test_3_1_wrong(batched, answer):
    status, message = batched("3.1", answer.__name__)
    assert status == "failed", (status, message)


@pytest.mark.slow
def test_3_1_hints_name_the_converter_and_the_fix(batched, converters):
    train = converters["train_converter"]
    shown = f"my_shard_ids(<a converter of {len(train)} rows in {len(train.file_urls)} files>)"
    assert batched("3.1", "shard_ids_two_shards")[1] == (
        f"{shown} made two ranks read the same rows: shard by hvd.rank() and hvd.size()"
    )
    assert batched("3.1", "shard_ids_one_batch")[1].startswith(f"{shown} read ")
    assert batched("3.1", "shard_ids_one_batch")[1].endswith(
        " rows on all ranks together: read one full epoch (num_epochs=1)"
    )
    no_init = batched("3.1", "shard_ids_no_init")[1]
    assert "raised ValueError: Horovod has not been initialized" in no_init, no_init
    assert no_init.endswith(
        ": call hvd.init(), then read one full epoch of this rank's shard: make_loader(converter, "
        "..., cur_shard=hvd.rank(), shard_count=hvd.size(), num_epochs=1)"
    ), no_init
    assert "calls helpers.datamodule.PetastormDataModule" in batched("3.1", "shard_ids_datamodule")[1]
    assert batched("3.1", "shard_ids_sliced")[1] == (
        f"{shown} split Parquet row groups between the ranks, so every rank read them all: ask Petastorm for this "
        "rank's shard (cur_shard=hvd.rank(), shard_count=hvd.size()) rather than reading every row and keeping some"
    )


def test_3_1_stub_is_not_attempted(converters):
    def my_shard_ids(converter): ...

    assert _run("3.1", {**converters, "my_shard_ids": my_shard_ids})[0] == "not attempted"


# --- 3.2: scaled_learning_rate (with warm-up) --------------------------------------------------------------------


def lr_branches(base_lr, world_size, step, warmup_steps):
    target = base_lr * world_size
    if step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def lr_fraction(base_lr, world_size, step, warmup_steps):
    progress = min(1.0, step / warmup_steps) if warmup_steps else 1.0
    return np.float64(base_lr) * (1 + (world_size - 1) * progress)


def lr_interp(base_lr, world_size, step, warmup_steps):
    if warmup_steps == 0:
        return base_lr * world_size
    return torch.tensor(np.interp(step, [0, warmup_steps], [base_lr, base_lr * world_size]))


@pytest.mark.parametrize("answer", [lr_branches, lr_fraction, lr_interp])
def test_3_2_right(answer):
    assert verdict("3.2", answer) == "passed"


@pytest.mark.parametrize(
    "answer",
    [
        lambda base_lr, world_size, step, warmup_steps: base_lr * world_size,  # no warm-up
        lambda base_lr, world_size, step, warmup_steps: base_lr * 2,  # hard-coded world size
        lambda base_lr, world_size, step, warmup_steps: base_lr * world_size * min(1, step / max(warmup_steps, 1)),
        lambda base_lr, world_size, step, warmup_steps: base_lr * world_size**0.5,  # square-root rule
        lambda base_lr, world_size, step, warmup_steps: base_lr if step < warmup_steps else base_lr * world_size,
        lambda base_lr, world_size, step, warmup_steps: str(base_lr * world_size),
    ],
)
def test_3_2_wrong(answer):
    assert_fails("3.2", answer)


def test_3_2_cases_meet_every_phase_of_the_warm_up():
    from helpers.course.checks.lesson3 import learning_rate_scaling

    cases = learning_rate_scaling.cases()
    assert {(step > warmup) - (step < warmup) for _, _, step, warmup in cases if warmup} == {-1, 0, 1}
    assert any(warmup == 0 for *_, warmup in cases) and any(0 < step < warmup for _, _, step, warmup in cases[6:])


# --- 3.3: make_distributed --------------------------------------------------------------------------------------


def distributed_keywords(model, optimizer, backward_passes_per_step):
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=backward_passes_per_step
    )


def distributed_wrap_first(model, optimizer, backward_passes_per_step):
    wrapped = hvd.DistributedOptimizer(
        optimizer, model.named_parameters(), backward_passes_per_step=backward_passes_per_step
    )
    hvd.broadcast_optimizer_state(wrapped, 0)
    hvd.broadcast_parameters(dict(model.named_parameters()), 0)
    return wrapped


def distributed_no_state(model, optimizer, backward_passes_per_step):
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=backward_passes_per_step
    )


def distributed_one_pass(model, optimizer, backward_passes_per_step):
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def distributed_plain(model, optimizer, backward_passes_per_step):
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return optimizer


def distributed_by_strategy(model, optimizer, backward_passes_per_step):
    strategy = HorovodStrategy()
    strategy._lightning_module = SimpleNamespace(named_parameters=model.named_parameters)
    return strategy._distributed(optimizer, backward_passes_per_step)


def distributed_listed(model, optimizer, backward_passes_per_step):
    distributed = hvd.DistributedOptimizer(
        optimizer, named_parameters=list(model.named_parameters()), backward_passes_per_step=backward_passes_per_step
    )
    hvd.broadcast_optimizer_state(distributed, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return distributed


def distributed_fixed_passes(model, optimizer, backward_passes_per_step):
    distributed = hvd.DistributedOptimizer(optimizer, model.named_parameters(), backward_passes_per_step=3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(distributed, root_rank=0)
    return distributed


def distributed_rate_by_hand(model, optimizer, backward_passes_per_step):
    """The learning rate set to a guess on every rank instead of broadcast from rank 0."""
    for group in optimizer.param_groups:
        group["lr"] = 0.02
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=backward_passes_per_step
    )


def distributed_no_params(model, optimizer, backward_passes_per_step):
    distributed = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=backward_passes_per_step
    )
    hvd.broadcast_optimizer_state(distributed, root_rank=0)
    return distributed


RIGHT_33 = [distributed_keywords, distributed_wrap_first, distributed_listed]
WRONG_33 = [
    distributed_no_state,
    distributed_one_pass,
    distributed_plain,
    distributed_by_strategy,
    distributed_fixed_passes,
    distributed_rate_by_hand,
    distributed_no_params,
]


@pytest.mark.slow
def test_3_3_hints_name_what_each_rank_was_left_with(batched):
    """Each wrong kind is named: the learning rates the ranks were left with, the backward passes, the weights."""
    assert batched("3.3", "distributed_no_state")[1] == (
        "make_distributed(<a Linear(4, 2) and its SGD, with other weights and learning rate on each rank>, 1) left "
        "the ranks' optimizers different (learning rates [0.02, 0.04, 0.06]): broadcast rank 0's optimizer state too "
        "(its settings and momentum buffers, e.g. after a resume): hvd.broadcast_optimizer_state(optimizer, "
        "root_rank=0)"
    )
    assert "made backward_passes_per_step 3: pass it on" in batched("3.3", "distributed_fixed_passes")[1]
    assert "different weights: hvd.broadcast_parameters" in batched("3.3", "distributed_no_params")[1]
    assert "which does this exercise for you: write it yourself" in batched("3.3", "distributed_by_strategy")[1]


@pytest.mark.slow
@pytest.mark.parametrize("answer", RIGHT_33)
def test_3_3_right(batched, answer):
    status, message = batched("3.3", answer.__name__)
    assert status == "passed", message


@pytest.mark.slow
@pytest.mark.parametrize("answer", WRONG_33)
def test_3_3_wrong(batched, answer):
    status, message = batched("3.3", answer.__name__)
    assert status == "failed", (status, message)


# --- 3.5: hvd_result --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracked_run(session_work_dir):
    """Make ``run(params, start, end, metrics)`` log a finished MLflow run in a fresh experiment; returns its id."""
    import uuid

    from mlflow.tracking import MlflowClient

    from helpers.tracking import tracking_uri

    client = MlflowClient(tracking_uri(None))
    experiment = client.create_experiment(f"answers-3.5-{uuid.uuid4().hex[:6]}")

    def run(params: dict, start: int = 1_000_000, end: int = 1_050_000) -> str:
        created = client.create_run(experiment, start_time=start)
        for key, value in params.items():
            client.log_param(created.info.run_id, key, value)
        client.set_terminated(created.info.run_id, end_time=end)
        return created.info.run_id

    return run


def hvd_namespace(run_id, processes=2, accuracies=(0.3, 0.6)):
    history = [{"epoch": i, "val_loss": 1.0, "val_acc": acc} for i, acc in enumerate(accuracies)]
    result = SimpleNamespace(mlflow_run_id=run_id, val_acc=accuracies[-1], history=history)
    return {"hvd_result": result, "NUM_PROCESSES": processes, "MLFLOW_TRACKING_URI": None}


PARAMS = {"world_size": "2", "learning_rate": "0.01", "effective_learning_rate": "0.02", "class_count": "10"}


def test_3_5_right(tracked_run):
    assert verdict("3.5", hvd_namespace(tracked_run(PARAMS))) == "passed"
    four = {**PARAMS, "world_size": "4", "effective_learning_rate": "0.04"}
    # a low final accuracy is fine as long as the model learned something
    assert verdict("3.5", hvd_namespace(tracked_run(four, 2_000_000, 2_050_000), 4, (0.15, 0.4))) == "passed"


def test_3_5_runs_one_after_another_are_not_siblings(tracked_run):
    tracked_run(PARAMS, 3_000_000, 3_050_000)
    assert verdict("3.5", hvd_namespace(tracked_run(PARAMS, 3_060_000, 3_100_000))) == "passed"


def test_3_5_wrong(tracked_run):
    assert_fails("3.5", hvd_namespace(tracked_run({**PARAMS, "world_size": "1"}, 4_000_000, 4_050_000)))
    assert_fails("3.5", hvd_namespace(tracked_run({**PARAMS, "effective_learning_rate": "0.04"}, 5_000_000)))
    tracked_run(PARAMS, 6_000_000, 6_050_000)  # a second rank logging at the same time
    assert_fails("3.5", hvd_namespace(tracked_run(PARAMS, 6_000_100, 6_050_000)))
    assert_fails("3.5", hvd_namespace(tracked_run(PARAMS, 7_000_000), accuracies=(0.1, 0.1)))
    assert_fails("3.5", hvd_namespace(None))


def test_3_5_unanswered_is_not_attempted():
    assert _run("3.5", {"hvd_result": None})[0] == "not attempted"


# --- 3.4: pin_device and train_by_hand --------------------------------------------------------------------------


def pin_device(use_gpu):
    if not use_gpu:
        return torch.device("cpu")
    device = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(device)
    return device


def pin_device_strings(use_gpu):
    if use_gpu:
        torch.cuda.set_device(hvd.local_rank())
        return "cuda"
    return "cpu"


def pin_device_not_current(use_gpu):
    return torch.device("cuda", hvd.local_rank()) if use_gpu else torch.device("cpu")


def pin_device_global_rank(use_gpu):
    return torch.device(f"cuda:{hvd.rank()}") if use_gpu else torch.device("cpu")


def pin_device_helper(use_gpu):
    return device_for_local_rank(hvd.local_rank(), use_gpu)


def by_hand(
    scale=True,
    broadcast_state=True,
    save_on_all=False,
    log_on_all=False,
    shard=True,
    wrap_last=False,
    set_epoch=True,
    log_each_epoch=True,
):
    """A ``train_by_hand`` following the lesson's recipe, with one step left out or wrong by a flag."""

    def train_by_hand(
        network, dataset, base_lr, epochs, batch_size, checkpoint_path, experiment, tracking_uri, use_gpu=False
    ):
        hvd.init()
        device = pin_device(use_gpu)
        network.to(device)
        sampler = DistributedSampler(dataset, num_replicas=hvd.size() if shard else 1, rank=hvd.rank() if shard else 0)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        optimizer = torch.optim.SGD(network.parameters(), lr=base_lr * (hvd.size() if scale else 1), momentum=0.9)
        if not wrap_last:
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=network.named_parameters())
        if hvd.rank() == 0 and os.path.exists(checkpoint_path):
            saved = torch.load(checkpoint_path)
            network.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        hvd.broadcast_parameters(network.state_dict(), root_rank=0)
        if broadcast_state:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if wrap_last:
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=network.named_parameters())
        logs = log_on_all or hvd.rank() == 0
        if logs:
            mlflow.set_tracking_uri(tracking_uri)
            mlflow.set_experiment(experiment)
            mlflow.start_run()
        for epoch in range(epochs):
            if set_epoch:
                sampler.set_epoch(epoch)
            for batch in loader:
                loss = F.cross_entropy(network(batch["features"].to(device)), batch["label_index"].to(device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if logs and (log_each_epoch or epoch == epochs - 1):
                mlflow.log_metric("train_loss", loss.item(), step=epoch)
        if save_on_all or hvd.rank() == 0:
            os.makedirs(os.path.dirname(checkpoint_path), exist_ok=True)
            torch.save({"model": network.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_path)
        if logs:
            mlflow.end_run()

    return train_by_hand


def by_hand_other_way(
    network, dataset, base_lr, epochs, batch_size, checkpoint_path, experiment, tracking_uri, use_gpu=False
):
    """Right, written differently: slices its shard by hand, scales the lr in place, wraps first, restores a
    whole-objects checkpoint, logs in a `with` block, saves every epoch."""
    hvd.init()
    device = pin_device_strings(use_gpu)
    network = network.to(device)
    shard = Subset(dataset, list(range(hvd.rank(), len(dataset), hvd.size())))
    optimizer = torch.optim.SGD(network.parameters(), lr=base_lr, momentum=0.9)
    for group in optimizer.param_groups:
        group["lr"] *= hvd.size()
    optimizer = hvd.DistributedOptimizer(optimizer, network.named_parameters())
    if hvd.rank() == 0 and os.path.isfile(checkpoint_path):
        saved = torch.load(checkpoint_path, weights_only=False)
        network.load_state_dict(saved["net"].state_dict())
        optimizer.load_state_dict(saved["opt_state"])
    hvd.broadcast_parameters(network.state_dict(), 0)
    hvd.broadcast_optimizer_state(optimizer, 0)
    run = None
    if hvd.rank() == 0:
        mlflow.set_tracking_uri(tracking_uri)
        run = mlflow.start_run(experiment_id=mlflow.get_experiment_by_name(experiment).experiment_id)
    with run if run is not None else _Nothing():
        for epoch in range(epochs):
            losses = []
            for batch in DataLoader(shard, batch_size=batch_size, shuffle=True, num_workers=1):
                optimizer.zero_grad()
                loss = F.cross_entropy(network(batch["features"]), batch["label_index"])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            if hvd.rank() == 0:
                mlflow.log_metrics({"loss": float(np.mean(losses))}, step=epoch)
                os.makedirs(os.path.dirname(checkpoint_path), exist_ok=True)
                torch.save({"net": network, "opt_state": optimizer.state_dict()}, checkpoint_path)


class _Nothing:
    """A do-nothing context manager for the ranks that do not log."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def namespace_35(train_by_hand, pin=pin_device):
    return {"pin_device": pin, "train_by_hand": train_by_hand}


RIGHT_35 = {"recipe": namespace_35(by_hand()), "other-way": namespace_35(by_hand_other_way, pin_device_strings)}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RIGHT_35))
def test_3_4_right(batched, case):
    status, message = batched("3.4", case)
    assert status == "passed", message


WRONG_35 = {
    "no-optimizer-state": (namespace_35(by_hand(broadcast_state=False)), "optimizer state"),
    "checkpoint-every-rank": (namespace_35(by_hand(save_on_all=True)), "rank 0 only"),
    "logging-every-rank": (namespace_35(by_hand(log_on_all=True)), "rank 0 only"),
    "state-restored-before-wrapping": (namespace_35(by_hand(wrap_last=True)), "momentum was lost"),
    "no-lr-scaling": (namespace_35(by_hand(scale=False)), "scale the learning rate"),
    "not-sharded": (namespace_35(by_hand(shard=False)), "shard"),
    "global-rank-device": (namespace_35(by_hand(), pin_device_global_rank), "local_rank"),
    "device-helper": (namespace_35(by_hand(), pin_device_helper), "write it yourself"),
    "device-not-made-current": (namespace_35(by_hand(), pin_device_not_current), "torch.cuda.set_device"),
    "no-set-epoch": (namespace_35(by_hand(set_epoch=False)), "sampler.set_epoch"),
    "loss-logged-once": (namespace_35(by_hand(log_each_epoch=False)), "once per epoch"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(WRONG_35))
def test_3_4_wrong_names_the_step(batched, case):
    status, message = batched("3.4", case)
    step = WRONG_35[case][1]
    assert status == "failed" and step in message, (status, message)


def test_3_4_stubs_are_not_attempted():
    def pin_device(use_gpu): ...

    def train_by_hand(
        network, dataset, base_lr, epochs, batch_size, checkpoint_path, experiment, tracking_uri, use_gpu=False
    ): ...

    assert _run("3.4", {"pin_device": pin_device, "train_by_hand": train_by_hand})[0] == "not attempted"


# --- 3.6 (stretch): global_accuracy -----------------------------------------------------------------------------


def accuracy_allreduce(correct, count):
    totals = hvd.allreduce(torch.tensor([float(correct), float(count)], dtype=torch.float64), op=hvd.Sum)
    return (totals[0] / totals[1]).item()


def accuracy_gather(correct, count):
    pairs = hvd.allgather_object((correct, count))
    return np.float64(sum(c for c, _ in pairs)) / sum(n for _, n in pairs)


def accuracy_mean_of_ratios(correct, count):
    return hvd.allreduce(torch.tensor(correct / count, dtype=torch.float64), op=hvd.Average).item()


def accuracy_local(correct, count):
    return correct / count


def accuracy_constant(correct, count):
    return 0.5


RIGHT_36 = [accuracy_allreduce, accuracy_gather]
WRONG_36 = [accuracy_mean_of_ratios, accuracy_local, accuracy_constant]


@pytest.mark.slow
@pytest.mark.parametrize("answer", RIGHT_36)
def test_3_6_right(batched, answer):
    status, message = batched("3.6", answer.__name__)
    assert status == "passed", message


@pytest.mark.slow
@pytest.mark.parametrize("answer", WRONG_36)
def test_3_6_wrong(batched, answer):
    status, message = batched("3.6", answer.__name__)
    assert status == "failed", (status, message)


@pytest.mark.slow
def test_3_6_hint_names_the_ranks_numbers_and_the_mean_of_ratios(batched):
    assert batched("3.6", "accuracy_mean_of_ratios")[1] == (
        "global_accuracy(<(correct, count) (1, 10) on rank 0, (9, 10) on rank 1, (0, 80) on rank 2>) returned "
        "0.3333333333333333 on rank 0, expected 0.1000 (the mean of the ranks' accuracies: weight each by its count): "
        "sum correct and count over all ranks (hvd.allreduce(..., op=hvd.Sum)) and divide"
    )


def accuracy_one_rank_raises(correct, count):
    """Right on every rank but one, which raises: the others wait in the allreduce until the job ends them."""
    if hvd.rank() == 1:
        raise ValueError("rank 1 gave up")
    return accuracy_allreduce(correct, count)


@pytest.mark.slow
def test_batched_wrong_answer_between_right_ones_gets_its_own_verdict(capfd):
    """No bleed-over: a batch judges the wrong answer in the middle exactly as the one-answer check does (same
    message), and the right answer after it, whose ranks start after a failed rank left the others waiting, passes.
    The one-answer check shows the learner its hint alone, not a wall of the ranks' tracebacks before it."""
    alone = _run("3.6", accuracy_one_rank_raises)
    assert alone == (
        "failed",
        "rank 1 of 3 raised ValueError: rank 1 gave up: sum correct and count over all ranks (hvd.allreduce(..., "
        "op=hvd.Sum)) and divide",
    )
    said = capfd.readouterr()
    assert "Traceback" not in said.out + said.err and "rank 1 gave up" not in said.out + said.err, said
    first, middle, last = check_answers("3.6", [accuracy_allreduce, accuracy_one_rank_raises, accuracy_gather])
    assert (first[0], middle, last[0]) == ("passed", alone, "passed")


def _by_names(answers) -> dict:
    return {answer.__name__: answer for answer in answers}


#: Each exercise's corpus in the order it is batched: a wrong answer between right ones, in every batch.
BATCHES = {
    "3.1": _by_names([RIGHT_31[0], *WRONG_31[:2], RIGHT_31[1], *WRONG_31[2:]]),
    "3.3": _by_names([RIGHT_33[0], *WRONG_33[:2], RIGHT_33[1], *WRONG_33[2:], RIGHT_33[2]]),
    "3.4": {
        "recipe": RIGHT_35["recipe"],
        **{case: WRONG_35[case][0] for case in list(WRONG_35)[:4]},
        "other-way": RIGHT_35["other-way"],
        **{case: WRONG_35[case][0] for case in list(WRONG_35)[4:]},
    },
    "3.6": _by_names([RIGHT_36[0], *WRONG_36[:2], RIGHT_36[1], *WRONG_36[2:]]),
}
