"""Checks for lesson 3: single-node Horovod.

Every check but 3.2 and 3.5 runs the answer in real Horovod processes (a few seconds each), on inputs it makes
itself: its own world size (3 processes, not the lesson's 2, so a hard-coded 2 fails), data, learning rates and
gradient accumulation. Inside the workers ``own_work`` rejects answers that hand the step to the course's helpers.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import signal
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from helpers.course.checks import (
    CheckFailed,
    Delegated,
    NotAttempted,
    close,
    hinted,
    named_helpers,
    own_work,
    register,
    require,
)
from helpers.course.checks.function_check import NUMBER, Case, FunctionCheck, drive, resume
from helpers.course.checks.ranks import rank_report, rank_reports
from helpers.jobs import write_atomically

__all__ = [
    "CHECK_PROCESSES",
    "CHECK_SEED",
    "SYNCED",
    "check_answers",
    "distributed_optimizer",
    "global_accuracy_check",
    "horovod_by_hand",
    "horovod_training",
    "init_and_shard",
    "learning_rate_scaling",
]

CHECK_SEED = 3
CHECK_PROCESSES = 3  # not the lesson's 2: an answer that hard-codes 2 processes fails
SYNCED = 1e-6  # largest weight difference between ranks that counts as identical


def _launch(processes: int, job, kwargs: dict[str, Any]) -> None:
    """Run ``job(**kwargs)`` on ``processes`` local Horovod processes (the ranks report to the check's folder).

    A worker's error becomes a :class:`CheckFailed` naming the rank and its last line (a :class:`Delegated` stays
    one), so a crashing answer reads as a hint rather than a traceback. The ranks' output is held back: local
    Horovod streams every rank's stream into the notebook, and a failing answer would put each rank's traceback
    (and Horovod's "Process 1 exit with status code 1") above the one line the learner needs.
    """
    from helpers.horovod_runner import HorovodRunner, HorovodWorkerError

    ranks_said = io.StringIO()  # Horovod's forwarding threads write to sys.stdout and sys.stderr as they are now
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(ranks_said), contextlib.redirect_stderr(ranks_said):
            warnings.simplefilter("ignore")  # more processes than cores on a laptop is fine for a check
            HorovodRunner(np=-processes).run(job, **kwargs)
    except HorovodWorkerError as error:
        raise _as_hint(error, processes) from None


def _as_hint(error, processes: int) -> CheckFailed:
    """A worker's error (a ``HorovodWorkerError``) as the hint the learner sees."""
    lines = (error.worker_traceback or str(error)).strip().splitlines()
    last = lines[-1] if lines else str(error)
    if "Delegated" in last:
        return Delegated(last.split(": ", 1)[-1])
    return CheckFailed(f"rank {error.rank} of {processes} raised {last}")


def _one_launch(steps):
    """The check made of ``steps(answer)``, a generator that yields one ``(processes, job, kwargs)`` to launch,
    resumes when the job has ended and returns the success message (``check_answers`` runs many through one job)."""

    def check(answer) -> str:
        return drive(steps(answer), _launch)

    check.steps = steps
    check.__doc__ = steps.__doc__
    return check


def check_answers(exercise_id: str, answers: list[Any]) -> list[tuple[str, str]]:
    """Check several answers to one multi-process exercise (3.1, 3.3, 3.4, 3.6) with one Horovod job per world size.

    Each answer is prepared and judged by its check's own code and gets the ``(status, message)`` that ``check``
    would give it alone: in every rank it runs in a fresh fork of the worker (no state, Horovod init or MLflow run
    carries over), with its own rendezvous, job folder and failure records, and a rank that fails ends that
    answer's other ranks as ``horovod.run`` does. For the test corpus; the notebooks check one answer at a time.

    Args:
        exercise_id: one of ``"3.1"``, ``"3.3"``, ``"3.4"``, ``"3.6"``.
        answers: what ``check`` would be given for each answer (a function, or a namespace such as
            ``globals()``).

    Returns:
        One ``(status, message)`` per answer, in the order of ``answers``: a status of
        :data:`~helpers.course.checks.PASSED`, ``FAILED`` or ``NOT_ATTEMPTED`` and the line's message.

    Raises:
        ValueError: ``exercise_id`` is not like ``"N.x"``.
        AttributeError: ``exercise_id`` has no check, or one that launches no Horovod job (3.2, 3.5).
    """
    from helpers.course.checks import NOT_ATTEMPTED, PASSED, _find_check, _is_unanswered, _judged
    from helpers.horovod_runner import HorovodRunner

    steps = _find_check(exercise_id).steps
    outcomes: list[tuple[str, str] | None] = [None] * len(answers)
    started: dict[int, list[tuple[int, Any, tuple[int, Any, dict[str, Any]]]]] = {}
    for index, answer in enumerate(answers):
        if _is_unanswered(answer):
            outcomes[index] = (NOT_ATTEMPTED, "replace the `...` with your code")
            continue
        judging, launch = steps(answer), []

        def start(judging=judging, launch=launch) -> None:
            launch.append(next(judging))
            HorovodRunner._check_picklable(launch[0][1], launch[0][2])  # as HorovodRunner.run does first

        outcome = _judged(start)
        if outcome[0] == PASSED:
            started.setdefault(launch[0][0], []).append((index, judging, launch[0]))
        else:
            outcomes[index] = outcome
    for processes, group in started.items():
        errors = _launch_batch(processes, [(job, kwargs) for _, _, (_, job, kwargs) in group])
        for (index, judging, _), error in zip(group, errors):
            thrown = _as_hint(error, processes) if error is not None else None  # as _launch raises it
            outcomes[index] = _judged(lambda judging=judging, e=thrown: resume(judging, e))
    return outcomes


def _launch_batch(processes: int, launches: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
    """Run every ``job(**kwargs)`` of ``launches`` in turn in one job of ``processes`` Horovod processes; per launch
    None, or the ``HorovodWorkerError`` that ``HorovodRunner.run`` would raise."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    from helpers.horovod_runner import HorovodRunner, _worker_error
    from helpers.jobs import JobFolder

    folders = [JobFolder.create("horovod") for _ in launches]
    servers = [RendezvousServer() for _ in launches]
    ports = [server.start() for server in servers]
    for server in servers:  # a fresh rendezvous per answer: Gloo cannot reliably meet twice on one
        server.init(get_host_assignments(parse_hosts(f"localhost:{processes}"), processes))
    plan = [(job, kwargs, str(folder.path), port) for (job, kwargs), folder, port in zip(launches, folders, ports)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            HorovodRunner(np=-processes).run(_batch_job, plan=plan)
    finally:
        for server in servers:
            server.stop()
    outcomes = []
    for folder in folders:
        exits = {int(p.name.rsplit("-", 1)[1]): json.loads(p.read_text()) for p in folder.path.glob("exit-rank-*")}
        failed = sorted((e["time"], rank, e["code"]) for rank, e in exits.items() if e["code"])
        if failed:
            folder.fail_open_mlflow_runs()
            first = RuntimeError(f"Process name: {failed[0][1]}\nExit code: {failed[0][2]}")
            outcomes.append(_worker_error(first, folder, processes))
        else:
            outcomes.append(None)
        folder.remove()
    return outcomes


def _batch_job(plan: list[tuple[Any, dict[str, Any], str, int]]) -> None:
    """In each Horovod process: every launch in turn, each in a fresh fork of this process (see check_answers)."""
    rank = int(os.environ["HOROVOD_RANK"])
    for job, kwargs, folder, port in plan:
        pid = os.fork()
        if pid == 0:
            _forked_worker(job, kwargs, Path(folder), port, rank)
        code = _wait_for(pid, Path(folder))
        # whole or not at all: the other ranks read it while they wait (_wait_for)
        write_atomically(Path(folder) / f"exit-rank-{rank}", json.dumps({"code": code, "time": time.time()}).encode())


def _forked_worker(job, kwargs: dict[str, Any], folder: Path, port: int, rank: int) -> None:
    """One answer in one rank, as ``HorovodRunner`` runs it (``WorkerCall``, its worker set-up); never returns."""
    from helpers.horovod_runner import _WorkerSetup
    from helpers.jobs import JobFolder, WorkerCall, stall_timeout_s

    code = 1
    try:
        os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(port)
        call = WorkerCall(job, JobFolder(folder), rank_env="HOROVOD_RANK", setup=_WorkerSetup(stall_timeout_s()))
        call(**kwargs)
        code = 0
    except BaseException:  # noqa: BLE001, S110 - recorded by WorkerCall, reported by the driver
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait_for(pid: int, folder: Path) -> int:
    """``pid``'s exit code (a signal as 128 + its number, as a shell reports it); when another rank's process has
    failed first, it is ended, as ``horovod.run`` ends a job's other processes."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        if any(json.loads(p.read_text())["code"] for p in folder.glob("exit-rank-*")):
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
            return 128 + signal.SIGTERM
        time.sleep(0.05)


_STRATEGY = "helpers.horovod_strategy:HorovodStrategy"  # the course's Horovod strategy: it wraps the optimizer too


def _flat(tensors) -> list[float]:
    """The values of ``tensors`` as one list of floats."""
    return [float(x) for t in tensors for x in t.detach().float().flatten().tolist()]


def _flat_weights(module) -> list[float]:
    """All of a module's parameters and buffers as one list of floats."""
    return _flat(module.state_dict().values())


def _spread(per_rank: list[list[float]]) -> float:
    """The largest difference between any rank's values and rank 0's."""
    return max(max(abs(a - b) for a, b in zip(per_rank[0], other)) for other in per_rank)


# --- 3.1 --------------------------------------------------------------------------------------------------------


def _horovod_started(_case: tuple, _given: Any) -> contextlib.AbstractContextManager:
    """Where the exercise's function runs in a training process: Horovod is started before the call."""
    import horovod.torch as hvd

    hvd.init()
    return contextlib.nullcontext()


def _lesson_converters(namespace) -> list[Case]:
    """The lesson's training and validation converters, one case each."""
    train_converter, val_converter = require(namespace, "train_converter", "val_converter")
    return [Case((train_converter,)), Case((val_converter,))]


def _shard_processes(cases: list[tuple]) -> int:
    """``CHECK_PROCESSES``, or fewer where a converter has fewer Parquet files: Petastorm shards by file."""
    return min(CHECK_PROCESSES, *(len(converter.file_urls) for (converter,) in cases))


def _row_groups(converter) -> list[set[int]]:
    """The row ids of each Parquet row group of ``converter``'s files, the unit Petastorm shards by; none where the
    driver cannot open the files (a storage pyarrow has no file system for)."""
    import pyarrow.fs
    import pyarrow.parquet as pq

    groups = []
    try:
        for url in converter.file_urls:
            filesystem, path = pyarrow.fs.FileSystem.from_uri(url)
            with filesystem.open_input_file(path) as file:
                parquet = pq.ParquetFile(file)
                for index in range(parquet.num_row_groups):
                    groups.append(set(parquet.read_row_group(index, columns=["row_id"]).column(0).to_pylist()))
    except (OSError, ValueError):
        return []
    return groups


def _shard_problem(case: tuple, shards: list[list[int]], _given: tuple) -> str | None:
    """Why ``shards`` (one list of row ids per rank) are not one epoch of ``case``'s converter split into disjoint
    shards by Petastorm (whole row groups: not every row read and some kept), or None."""
    rows, read = len(case[0]), set().union(*shards)
    sizes = [len(s) for s in shards]
    if min(sizes) == 0:
        return f"read shards of {sizes} rows on the ranks: use cur_shard=hvd.rank(), shard_count=hvd.size()"
    if sum(len(set(s)) for s in shards) != len(read):
        return "made two ranks read the same rows: shard by hvd.rank() and hvd.size()"
    if len(read) != rows:
        return f"read {len(read)} of the {rows} rows on all ranks together: read one full epoch (num_epochs=1)"
    by_rank = [set(shard) for shard in shards]
    if any(sum(1 for shard in by_rank if group & shard) > 1 for group in _row_groups(case[0])):
        return (
            "split Parquet row groups between the ranks, so every rank read them all: ask Petastorm for this rank's "
            "shard (cur_shard=hvd.rank(), shard_count=hvd.size()) rather than reading every row and keeping some"
        )
    return None


#: ``my_shard_ids(converter)``: after ``hvd.init()``, the row ids of this rank's shard, one full epoch; called on
#: the lesson's ``train_converter`` and ``val_converter`` in ``CHECK_PROCESSES`` local Horovod processes at once
#: (fewer where a converter has fewer Parquet files), which together must read each converter's rows once
init_and_shard = register("3.1")(
    FunctionCheck(
        "3.1",
        answer="my_shard_ids",
        fixed=[],
        from_namespace=_lesson_converters,
        arguments=tuple,
        collect=lambda ids, _case: [int(i) for i in ids],
        processes=_shard_processes,
        launch=_launch,
        judge=_shard_problem,
        forbid=["helpers.datamodule:PetastormDataModule", "helpers.loaders:PetastormBatches"],
        show=lambda case: f"<a converter of {len(case[0])} rows in {len(case[0].file_urls)} files>",
        hint="call hvd.init(), then read one full epoch of this rank's shard: make_loader(converter, ..., "
        "cur_shard=hvd.rank(), shard_count=hvd.size(), num_epochs=1)",
        passed="",
        passed_namespace=lambda own: (
            f"{_shard_processes([case.args for case in own])} ranks read disjoint shards that cover the training "
            "and the validation data"
        ),
    )
)


# --- 3.2 --------------------------------------------------------------------------------------------------------


def _warmed_up(base_lr: float, world_size: int, step: int, warmup_steps: int) -> float:
    """The linear scaling rule with gradual warm-up (Goyal et al., 2017): from ``base_lr`` to
    ``base_lr x world_size``."""
    if step >= warmup_steps:
        return base_lr * world_size
    return base_lr + (base_lr * world_size - base_lr) * step / warmup_steps


def _draw_warmup(rng) -> tuple[float, int, int, int]:
    warmup = rng.randint(1, 199)
    return 10 ** rng.uniform(-5, -1), rng.randint(3, 64), rng.randint(0, 2 * warmup - 1), warmup


def _warmup_hint(case: tuple[float, int, int, int], got: object) -> str:
    _, _, step, warmup = case
    where = "after the warm-up" if step >= warmup else f"at step {step} of a {warmup}-step warm-up"
    return f"{where}, ramp linearly from base_lr at step 0 to base_lr x world_size at warmup_steps, then hold it"


#: ``scaled_learning_rate(base_lr, world_size, step, warmup_steps)``: the learning rate of optimizer step ``step``,
#: ramped linearly from ``base_lr`` to ``base_lr x world_size`` over the first ``warmup_steps`` steps; on fixed
#: cases with and without warm-up and 8 drawn ones
learning_rate_scaling = register("3.2")(
    FunctionCheck(
        "3.2",
        answer="scaled_learning_rate",
        fixed=[(1e-5, 1, 0, 0), (0.02, 2, 0, 0), (0.02, 2, 5, 0), (0.1, 4, 0, 10), (0.1, 4, 10, 10), (0.1, 4, 15, 10)],
        draw=_draw_warmup,
        draws=8,
        reference=_warmed_up,
        returns=NUMBER,
        keywords=True,
        hint=_warmup_hint,
        passed="base_lr x world_size, reached by a linear warm-up ({n} cases)",
    )
)


# --- 3.3 --------------------------------------------------------------------------------------------------------


def _rank_inputs(case: tuple[int, ...]) -> list[tuple[Any, Any, int]]:
    """Each rank's ``(model, optimizer, backward_passes_per_step)`` for a case: weights and a learning rate of its
    own, so that only broadcasting both makes the ranks agree."""
    import torch

    (passes,) = case
    inputs = []
    for rank in range(CHECK_PROCESSES):
        torch.manual_seed(100 * passes + rank)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * (passes + 2 * rank + 1), momentum=0.9)
        inputs.append((model, optimizer, passes))
    return inputs


def _one_step(distributed, case: tuple[int, ...]) -> dict[str, Any]:
    """In each rank, right after ``make_distributed`` returned: the weights and learning rate it left, then one
    optimizer step of ``passes`` backward passes on this rank's own data, and the weights after it."""
    import horovod.torch as hvd
    import torch

    (passes,) = case
    params = [p for group in distributed.param_groups for p in group["params"]]
    seen = {
        "optimizer": type(distributed).__name__,
        "distributed": hasattr(distributed, "synchronize"),
        "passes": getattr(distributed, "backward_passes_per_step", None),
        "learning_rate": distributed.param_groups[0]["lr"],
        "started": _flat(params),
    }
    if not seen["distributed"] or seen["passes"] != passes:
        return seen  # judged on these alone: a step would stop at Horovod's own count of the backward passes
    data = torch.Generator().manual_seed(hvd.rank())
    distributed.zero_grad()
    for _ in range(passes):
        sum((p * torch.randn(p.shape, generator=data)).pow(2).sum() for p in params).backward()
    distributed.step()
    return {**seen, "weights": _flat(params)}


def _distributed_problem(case: tuple[int, ...], per_rank: list[dict[str, Any]], given: list) -> str | None:
    """What is wrong with every rank's optimizer and weights, or None: each must hold rank 0's weights and learning
    rate (as ``given``), and the weights must stay the same after a step."""
    (passes,) = case
    first = per_rank[0]
    if not first["distributed"]:
        return f"returned a {first['optimizer']}: return hvd.DistributedOptimizer(...)"
    if first["passes"] != passes:
        return f"made backward_passes_per_step {first['passes']}: pass it on to hvd.DistributedOptimizer"
    if _spread([rank["started"] for rank in per_rank]) > SYNCED:
        return "left the ranks with different weights: hvd.broadcast_parameters(model.state_dict(), root_rank=0)"
    rates = [rank["learning_rate"] for rank in per_rank]
    if rates != [given[0][1].param_groups[0]["lr"]] * len(rates):
        return (
            f"left the ranks' optimizers different (learning rates {rates}): broadcast rank 0's optimizer state "
            "too (its settings and momentum buffers, e.g. after a resume): hvd.broadcast_optimizer_state(optimizer, "
            "root_rank=0)"
        )
    if _spread([rank["weights"] for rank in per_rank]) > SYNCED:
        return (
            "left the ranks with different weights after one step: average the gradients with "
            "hvd.DistributedOptimizer(optimizer, named_parameters=...)"
        )
    return None


#: ``make_distributed(model, optimizer, backward_passes_per_step)``: broadcast, then ``hvd.DistributedOptimizer``;
#: called in ``CHECK_PROCESSES`` local Horovod processes at once, each with its own weights and learning rate, for
#: 1 and 3 backward passes per step and a drawn number, then one optimizer step on each rank's own data
distributed_optimizer = register("3.3")(
    FunctionCheck(
        "3.3",
        answer="make_distributed",
        fixed=[(1,), (3,)],
        draw=lambda rng: (rng.randint(2, 5),),
        draws=1,
        calls=_rank_inputs,
        collect=_one_step,
        around=_horovod_started,
        processes=CHECK_PROCESSES,
        launch=_launch,
        judge=_distributed_problem,
        forbid=[_STRATEGY],
        show=lambda case: f"<a Linear(4, 2) and its SGD, with other weights and learning rate on each rank>, {case[0]}",
        hint="wrap the optimizer, then broadcast the parameters and the wrapped optimizer's state from rank 0",
        passed=f"{CHECK_PROCESSES} ranks start from rank 0's weights and optimizer and stay identical ({{n}} cases)",
    )
)


# --- 3.5 --------------------------------------------------------------------------------------------------------


def _concurrent_runs(client, run) -> int:
    """How many runs of ``run``'s experiment were open while it was (itself included)."""
    end = run.info.end_time or run.info.start_time
    candidates = client.search_runs([run.info.experiment_id], f"attributes.start_time <= {end}")
    return sum(1 for other in candidates if (other.info.end_time or end) >= run.info.start_time)


@register("3.5")
def horovod_training(namespace) -> str:
    """``hvd_result``: the TrainResult rank 0 returned from ``train_hvd`` run with ``NUM_PROCESSES`` processes.

    Args:
        namespace: the notebook's ``globals()``, holding ``hvd_result``, and ``NUM_PROCESSES`` (default 2) and
            ``MLFLOW_TRACKING_URI`` if the notebook set them; the check reads the result's MLflow run, it runs
            nothing.

    Returns:
        The success message ``check`` shows.

    Raises:
        NotAttempted: ``hvd_result`` is not defined, or is None.
        CheckFailed: the result has no MLflow run id; the run's ``world_size`` is not ``NUM_PROCESSES``; its
            effective learning rate is not ``NUM_PROCESSES`` times its learning rate; other runs were open at
            the same time; ``val_acc`` never rose above chance.
        Exception: any other error (e.g. MLflow's, for a run id it does not know), unchanged (``check`` shows
            it as a failure).
    """
    from mlflow.tracking import MlflowClient

    from helpers.tracking import tracking_uri

    result = require(namespace, "hvd_result")
    if result is None:
        raise NotAttempted("train_hvd returns nothing yet: return what train(...) returns")
    processes = namespace.get("NUM_PROCESSES", 2)
    if not getattr(result, "mlflow_run_id", None):
        raise CheckFailed("no MLflow run id: pass mlflow_experiment to train(...) (it logs on rank 0 only)")
    client = MlflowClient(tracking_uri(namespace.get("MLFLOW_TRACKING_URI")))
    run = client.get_run(result.mlflow_run_id)
    params = run.data.params
    if params.get("world_size") != str(processes):
        raise CheckFailed(
            f"world_size={params.get('world_size')}, expected {processes}: train with "
            "strategy=HorovodStrategy() in every process"
        )
    base, effective = float(params["learning_rate"]), float(params.get("effective_learning_rate", "nan"))
    if not math.isclose(effective, processes * base):
        raise CheckFailed(
            f"effective learning rate {effective} is not {processes} x {base}: let HorovodStrategy "
            "scale it, and do not scale it yourself as well"
        )
    runs = _concurrent_runs(client, run)
    if runs > 1:
        raise CheckFailed(f"{runs} MLflow runs for one training: only rank 0 may log")
    classes = int(params.get("class_count", 0)) or None
    history = [row["val_acc"] for row in result.history if "val_acc" in row]
    if classes and history and max(history) <= 1 / classes:
        raise CheckFailed(
            f"val_acc stayed at chance level (1/{classes}): the model did not learn; check the "
            "DataModule's shard and the learning rate"
        )
    return f"one MLflow run, {processes} processes, lr {base:g} -> {effective:g}"


# --- 3.4 --------------------------------------------------------------------------------------------------------


class _RecordedDataset:
    """A map-style data set of dict samples that appends every index read to a file (DataLoader workers too)."""

    def __init__(self, features, labels, record: str) -> None:
        self.features, self.labels, self.record = features, labels, record

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        with open(self.record, "a") as log:
            log.write(f"{int(index)}\n")
        return {"features": self.features[index], "label_index": self.labels[index]}


def _reads(path: Path) -> list[int]:
    """The indices a rank read, from its record file."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


class _Spy:
    """Record which of Horovod's steps (``module.name``) the code inside the block calls, in ``calls``; for an
    optimizer-state broadcast also whether that optimizer is the distributed one and holds non-zero state."""

    def __init__(self, module, names: list[str], calls: dict[str, Any]) -> None:
        self.module, self.saved, self.calls = module, {n: getattr(module, n) for n in names}, calls

    def __enter__(self):
        for name, original in self.saved.items():
            setattr(self.module, name, self._recording(name, original))
        return self

    def _recording(self, name, original):
        def record(*args, **kwargs):
            result = original(*args, **kwargs)
            optimizer = args[0] if args else kwargs.get("optimizer")
            if name == "broadcast_optimizer_state" and optimizer is not None:
                held = [t for s in optimizer.state.values() for t in s.values() if hasattr(t, "abs")]
                self.calls[name] = {
                    "distributed": hasattr(optimizer, "synchronize"),
                    "state": float(sum(t.abs().sum() for t in held)),
                }
            else:
                self.calls[name] = True
            return result

        return record

    def __exit__(self, *exc) -> None:
        for name, original in self.saved.items():
            setattr(self.module, name, original)


def _probe_pin_device(pin_device, hvd) -> dict[str, Any]:
    """``pin_device`` on the CPU, then on a pretend GPU node where this rank's local rank is another number."""
    import torch

    cpu = torch.device(pin_device(False))
    local = hvd.size() - 1 - hvd.local_rank()  # reversed, so that hvd.rank() gives the wrong answer
    pinned: list[Any] = []
    saved = (torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device, hvd.local_rank)
    torch.cuda.is_available, torch.cuda.device_count = (lambda: True), (lambda: hvd.size())
    torch.cuda.set_device, hvd.local_rank = pinned.append, (lambda: local)
    try:
        gpu = torch.device(pin_device(True))
    finally:
        torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device, hvd.local_rank = saved
    set_to = [torch.device(d).index if not isinstance(d, int) else d for d in pinned]
    index = gpu.index if gpu.index is not None else (set_to[-1] if set_to else None)
    return {"cpu": cpu.type, "gpu": gpu.type, "index": index, "expected": local, "set": set_to[-1] if set_to else None}


def _by_hand_job(pin_device, train_by_hand, settings: dict[str, Any]) -> None:
    """In each Horovod process: ``train_by_hand`` from scratch, then resumed from rank 0's checkpoint, with a
    network initialised differently on every rank; then ``pin_device``. Each rank has its own checkpoint folder,
    as machines without shared storage do. Each rank reports what it saw (:func:`~.ranks.rank_report`)."""
    import horovod.torch as hvd
    import torch

    from helpers.devices import device_for_local_rank

    data = torch.Generator().manual_seed(settings["seed"])
    labels = torch.randint(0, settings["classes"], (settings["rows"],), generator=data)
    centres = torch.randn(settings["classes"], 3, 8, 8, generator=data)
    features = centres[labels] + 0.5 * torch.randn(settings["rows"], 3, 8, 8, generator=data)
    with rank_report(settings["folder"], calls=[]) as seen:
        _train_twice(train_by_hand, settings, features, labels, seen)
        hvd.init()  # the check's own: the probe reads this process's local rank and the job's size
        with own_work(device_for_local_rank):
            seen["pin"] = _probe_pin_device(pin_device, hvd)


def _train_twice(train_by_hand, settings: dict[str, Any], features, labels, seen: dict[str, Any]) -> None:
    """In a rank: ``train_by_hand`` fresh, then resumed, each on a network of its own; per training, the weights
    before and after it and the Horovod steps it took, in ``seen``."""
    import horovod.torch as hvd
    import torch

    from helpers.devices import device_for_local_rank

    rank, folder = int(os.environ["HOROVOD_RANK"]), Path(settings["folder"])
    for call in ("fresh", "resumed"):
        torch.manual_seed(1000 * settings["seed"] + 10 * rank + len(seen["calls"]))
        network = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(3 * 8 * 8, 16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, settings["classes"]),
        )
        before = _flat_weights(network)
        dataset = _RecordedDataset(features, labels, str(folder / f"reads-{call}-{rank}.txt"))
        calls: dict[str, Any] = {}
        with (
            _Spy(hvd, ["broadcast_parameters", "broadcast_optimizer_state", "DistributedOptimizer"], calls),
            own_work(
                device_for_local_rank, *named_helpers("helpers.horovod_strategy:HorovodStrategy", imported_only=True)
            ),
        ):
            train_by_hand(
                network=network,
                dataset=dataset,
                base_lr=settings["base_lr"],
                epochs=settings["epochs"][call],
                batch_size=settings["batch_size"],
                checkpoint_path=str(folder / f"node-{rank}" / "checkpoint.pt"),
                experiment=f"{settings['experiment']}-{call}",
                tracking_uri=settings["tracking_uri"],
                use_gpu=False,
            )
        seen["keys"] = list(network.state_dict())
        seen["calls"].append({"before": before, "after": _flat_weights(network), "steps": calls})


def _seen(reports: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The ranks' reports as the judge reads them: per training, rank 0's weights before it and every rank's after
    it and steps; rank 0's weight names; every rank's device probe."""
    ranks = [reports[rank] for rank in range(CHECK_PROCESSES)]
    calls = [
        {
            "before": ranks[0]["calls"][index]["before"],
            "after": [rank["calls"][index]["after"] for rank in ranks],
            "steps": [rank["calls"][index]["steps"] for rank in ranks],
        }
        for index in range(len(ranks[0]["calls"]))
    ]
    return {"calls": calls, "keys": ranks[0]["keys"], "pin": [rank["pin"] for rank in ranks]}


def _pin_problem(probes: list[dict[str, Any]]) -> str | None:
    """Why the ranks' ``pin_device`` results are wrong, or None."""
    for rank, probe in enumerate(probes):
        if probe["cpu"] != "cpu":
            return f"pin_device(use_gpu=False) gave a {probe['cpu']} device on rank {rank}: use the CPU"
        if probe["gpu"] != "cuda" or probe["index"] != probe["expected"]:
            return (
                f"with GPUs, rank {rank} (local rank {probe['expected']}) got {probe['gpu']}:{probe['index']}: "
                "pin cuda:<hvd.local_rank()> (torch.cuda.set_device) for one GPU per process"
            )
        if probe["set"] != probe["expected"]:
            return (
                f"with GPUs, rank {rank} did not make cuda:{probe['expected']} the current device: call "
                "torch.cuda.set_device(device), or CUDA calls without a device (and NCCL) use GPU 0 on every rank"
            )
    return None


def _epoch_reads(folder: Path, rank: int, epochs: int) -> list[list[int]]:
    """The rows ``rank`` read in each epoch of the fresh training, in order."""
    reads = _reads(folder / f"reads-fresh-{rank}.txt")
    per_epoch = len(reads) // epochs
    return [reads[i * per_epoch : (i + 1) * per_epoch] for i in range(epochs)]


def _by_hand_shard_problem(folder: Path, processes: int, rows: int, epochs: int) -> str | None:
    """Why the ranks did not each read their own part of the data in the first epoch of the fresh training (a
    sampler that reshuffles gives each rank other rows in the next), or None."""
    reads = [set(_epoch_reads(folder, rank, epochs)[0]) for rank in range(processes)]
    share = math.ceil(rows / processes)
    if not all(reads):
        return f"rank {[bool(r) for r in reads].index(False)} read no data: iterate a DataLoader over the dataset"
    if max(len(r) for r in reads) > share:
        return (
            f"a rank read {max(len(r) for r in reads)} of {rows} rows in one epoch: shard the data, e.g. "
            "DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())"
        )
    shared = sum(len(r) for r in reads) - len(set().union(*reads))
    if shared > processes - 1:
        return "the ranks read the same rows: shard by hvd.rank() and hvd.size()"
    return None


def _reshuffle_problem(folder: Path, processes: int, epochs: int) -> str | None:
    """Why every epoch of the fresh training read each rank's rows in the same order, or None."""
    for rank in range(processes):
        orders = _epoch_reads(folder, rank, epochs)
        if len(orders[0]) > 1 and all(order == orders[0] for order in orders):
            return (
                f"rank {rank} read its rows in the same order in all {epochs} epochs: shuffle anew every epoch "
                "(DistributedSampler does once you call sampler.set_epoch(epoch) at the start of each)"
            )
    return None


def _common(steps: list[dict[str, Any]]) -> set[str]:
    """The Horovod steps every rank called."""
    return set.intersection(*(set(s) for s in steps))


def _state_problem(steps: list[dict[str, Any]]) -> str | None:
    """Why the optimizer state rank 0 restored did not reach the optimizer that trains on every rank, or None."""
    if "broadcast_optimizer_state" not in _common(steps):
        return "broadcast the optimizer state too: hvd.broadcast_optimizer_state(optimizer, root_rank=0)"
    restored = steps[0]["broadcast_optimizer_state"]
    if not restored["distributed"] or restored["state"] == 0:
        return (
            "the restored momentum was lost: wrap the optimizer in hvd.DistributedOptimizer first (it builds a "
            "new optimizer without the old one's state), then restore and broadcast that one's state"
        )
    return None


def _sync_hint(steps: set[str]) -> str:
    """The migration step that most likely explains ranks ending with different weights."""
    if "broadcast_parameters" not in steps:
        return "broadcast the initial parameters: hvd.broadcast_parameters(network.state_dict(), root_rank=0)"
    if "DistributedOptimizer" not in steps:
        return "average the gradients: wrap the optimizer in hvd.DistributedOptimizer"
    return "broadcast from rank 0 after it restored the checkpoint, and before training"


def _find(saved: Any, test) -> Any:
    """The first value in ``saved`` (or ``saved`` itself; nested dicts, lists, modules) for which ``test`` holds."""
    import torch

    if isinstance(saved, (torch.nn.Module, torch.optim.Optimizer)):
        saved = saved.state_dict()
    if isinstance(saved, dict) and test(saved):
        return saved
    children = saved.values() if isinstance(saved, dict) else saved if isinstance(saved, (list, tuple)) else []
    for child in children:
        found = _find(child, test)
        if found is not None:
            return found
    return None


def _checkpoint_problem(folder: Path, keys: list[str], weights: list[float], expected_lr: float) -> str | None:
    """Why the checkpoints written are not one file of rank 0's weights and optimizer state at the scaled lr."""
    import torch

    files = sorted(p for p in folder.glob("node-*/**/*") if p.is_file())
    if not files:
        return "no checkpoint file: on rank 0, torch.save the network and optimizer state to checkpoint_path"
    if len({p.relative_to(folder).parts[0] for p in files}) > 1:
        return f"{len(files)} checkpoint files, one per rank: save on rank 0 only"
    if len(files) > 1:
        return f"{len(files)} checkpoint files: save one, at checkpoint_path (overwrite it)"
    saved = torch.load(files[0], map_location="cpu", weights_only=False)
    model = _find(saved, lambda d: list(d) == keys)
    if model is None or [float(x) for t in model.values() for x in t.float().flatten().tolist()] != weights:
        return "the checkpoint does not hold the trained network's state_dict()"
    optimizer = _find(saved, lambda d: "param_groups" in d and "state" in d)
    if optimizer is None:
        return "the checkpoint has no optimizer state: save optimizer.state_dict() too, so a resume keeps momentum"
    lr = optimizer["param_groups"][0].get("lr")
    if not close(lr, expected_lr, rel=1e-6):
        return f"the optimizer's lr is {lr}, expected base_lr x hvd.size() = {expected_lr:.4g}: scale the learning rate"
    return None


def _mlflow_problem(uri: str, epochs: dict[str, int]) -> str | None:
    """Why the experiments (``{name: epochs trained}``) do not hold exactly one run each with a metric logged once
    per epoch, or None."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for name in epochs:
        runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        if not runs:
            return (
                "no MLflow run: on rank 0, mlflow.set_tracking_uri(tracking_uri), mlflow.set_experiment("
                "experiment), then start a run and log"
            )
        if len(runs) > 1:
            return f"{len(runs)} MLflow runs for one training: log on rank 0 only"
        if not runs[0].data.metrics:
            return "the MLflow run has no metrics: log the training loss every epoch (mlflow.log_metric)"
        histories = [client.get_metric_history(runs[0].info.run_id, key) for key in runs[0].data.metrics]
        counts = sorted({len(history) for history in histories})
        if epochs[name] not in counts:
            return (
                f"a training of {epochs[name]} epoch(s) logged its metrics {counts} time(s): log the training loss "
                "once per epoch (mlflow.log_metric(..., step=epoch))"
            )
    return None


def _new_experiments(uri: str, base: str, folder: Path) -> None:
    """Create the check's two experiments up front (ranks creating them at once would race in SQLite)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for call in ("fresh", "resumed"):
        client.create_experiment(f"{base}-{call}", artifact_location=(folder / "artifacts" / call).as_uri())


def _by_hand_problem(seen: dict[str, Any], folder: Path, settings: dict[str, Any]) -> str | None:
    """The first migration step that ``_by_hand_job``'s observations show missing or wrong, or None."""
    fresh, resumed = seen["calls"]
    problem = (
        _pin_problem(seen["pin"])
        or _by_hand_shard_problem(folder, CHECK_PROCESSES, settings["rows"], settings["epochs"]["fresh"])
        or _reshuffle_problem(folder, CHECK_PROCESSES, settings["epochs"]["fresh"])
    )
    if problem:
        return problem
    if _spread(fresh["after"]) > SYNCED:
        return f"the ranks end with different weights: {_sync_hint(_common(fresh['steps']))}"
    if fresh["after"][0] == fresh["before"]:
        return "the network's weights did not change: train it in place for `epochs` epochs"
    expected_lr = settings["base_lr"] * CHECK_PROCESSES
    epochs = {f"{settings['experiment']}-{call}": count for call, count in settings["epochs"].items()}
    problem = _checkpoint_problem(folder, seen["keys"], resumed["after"][0], expected_lr) or _mlflow_problem(
        settings["tracking_uri"], epochs
    )
    if problem:
        return problem
    final = resumed["after"][0]
    if math.dist(final, fresh["after"][0]) > math.dist(final, resumed["before"]):
        return "the second training did not resume: when checkpoint_path exists, rank 0 loads it"
    problem = _state_problem(resumed["steps"])
    if not problem and _spread(resumed["after"]) > SYNCED:
        problem = f"after resuming, the ranks end with different weights: {_sync_hint(_common(resumed['steps']))}"
    return problem


_BY_HAND_HINT = (
    "pin_device and train_by_hand run in every process, on the check's data: take steps 1 to 7 in order "
    "(hvd.init() first; only rank 0 loads the checkpoint, logs to MLflow and saves)"
)


@register("3.4")
@_one_launch
def horovod_by_hand(namespace) -> str:
    """``pin_device(use_gpu)`` and ``train_by_hand(...)``: the plain loop migrated to Horovod step by step.

    Args:
        namespace: the notebook's ``globals()``, holding ``pin_device`` and ``train_by_hand``; both run in
            ``CHECK_PROCESSES`` local Horovod processes: ``train_by_hand`` from scratch, then resumed, on seeded
            data with its own checkpoint folders and MLflow experiments.

    Returns:
        The success message ``check`` shows.

    Raises:
        NotAttempted: ``pin_device`` or ``train_by_hand`` is not defined, or is a stub.
        CheckFailed: the first migration step missing or wrong: the device pinned, the data sharding, equal
            weights on every rank, training, one checkpoint on rank 0 at the scaled learning rate, one MLflow run
            with metrics per training, the resume, the broadcast optimizer state; or a rank raised (the hint
            names it and its last error line).
        Delegated: a rank calls ``device_for_local_rank`` or uses ``HorovodStrategy``.
        CourseInputError: Horovod is not installed, or ``pin_device`` or ``train_by_hand`` cannot be pickled
            for the workers (from ``HorovodRunner.run``).
    """
    from helpers.tracking import tracking_uri
    from helpers.workdir import work_path

    pin_device, train_by_hand = require(namespace, "pin_device", "train_by_hand")
    rng = np.random.default_rng(CHECK_SEED)
    folder = work_path("checks", f"3.4-{uuid.uuid4().hex[:8]}")
    folder.mkdir(parents=True)
    uri = tracking_uri(None)
    settings = {
        "folder": str(folder),
        "seed": CHECK_SEED,
        "rows": int(rng.integers(90, 130)),
        "classes": int(rng.integers(3, 7)),
        "batch_size": int(rng.integers(6, 10)),
        "base_lr": float(rng.uniform(0.005, 0.02)),
        "epochs": {"fresh": 2, "resumed": 1},
        "experiment": f"check-3.4-{folder.name}",
        "tracking_uri": uri,
    }
    _new_experiments(uri, settings["experiment"], folder)
    with hinted(_BY_HAND_HINT):
        yield (
            CHECK_PROCESSES,
            _by_hand_job,
            {"pin_device": pin_device, "train_by_hand": train_by_hand, "settings": settings},
        )
    problem = _by_hand_problem(_seen(rank_reports(folder)), folder, settings)
    if problem:
        raise CheckFailed(problem)
    return (
        f"{CHECK_PROCESSES} ranks on their own shards stay identical, resume from rank 0's one checkpoint, "
        "and log one MLflow run"
    )


# --- 3.6 (stretch) ----------------------------------------------------------------------------------------------


def _draw_shards(rng: random.Random) -> tuple[tuple[int, int], ...]:
    """Every rank's ``(correct, count)`` on its validation shard, one per check process."""
    counts = [rng.randint(5, 199) for _ in range(CHECK_PROCESSES)]
    return tuple((rng.randint(0, count), count) for count in counts)


def _accuracy_problem(case: tuple[tuple[int, int], ...], per_rank: list[Any], _given: list[tuple]) -> str | None:
    """What is wrong with the accuracy each rank's call returned, or None: every rank must get the accuracy over
    all shards."""
    expected = sum(correct for correct, _ in case) / sum(count for _, count in case)
    for rank, got in enumerate(per_rank):
        if isinstance(got, bool) or not close(got, expected, rel=1e-6):
            mean = sum(correct / count for correct, count in case) / len(case)
            why = " (the mean of the ranks' accuracies: weight each by its count)" if close(got, mean, rel=1e-6) else ""
            return (
                f"returned {got!r} on rank {rank}, expected {expected:.4f}{why}: sum correct and count over all ranks "
                "(hvd.allreduce(..., op=hvd.Sum)) and divide"
            )
    return None


#: ``global_accuracy(correct, count)``: the accuracy over every rank's validation shard, on every rank; called in
#: ``CHECK_PROCESSES`` local Horovod processes at once, each with its own ``(correct, count)``
global_accuracy_check = register("3.6")(
    FunctionCheck(
        "3.6",
        answer="global_accuracy",
        fixed=[((1, 10), (9, 10), (0, 80))],  # the mean of the ranks' accuracies is 0.333, the accuracy 0.1
        draw=_draw_shards,
        draws=1,
        calls=lambda case: [tuple(shard) for shard in case],
        around=_horovod_started,
        processes=CHECK_PROCESSES,
        launch=_launch,
        judge=_accuracy_problem,
        show=lambda case: f"<(correct, count) {', '.join(f'{shard} on rank {r}' for r, shard in enumerate(case))}>",
        hint="sum correct and count over all ranks (hvd.allreduce(..., op=hvd.Sum)) and divide",
        passed="every rank gets the same, correctly weighted accuracy over all shards ({n} cases)",
    )
)
