"""Checks for lesson 3: single-node Horovod. Three of them start 2 real Horovod processes (a few seconds each)."""

from __future__ import annotations

import math
from typing import Any

from helpers.checks import CheckFailed, NotAttempted, register, require, require_implemented


def _shard_job(my_shard_ids, converter) -> list[list[int]]:
    """In each Horovod process: the student's shard reader; rank 0 returns every rank's ids."""
    import horovod.torch as hvd

    ids = [int(i) for i in my_shard_ids(converter)]
    return hvd.allgather_object(ids)


def _wrap_job(make_distributed) -> dict[str, Any]:
    """In each Horovod process: a model initialised differently per rank takes one step on rank-specific data."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    distributed = make_distributed(model, optimizer, 1)
    features = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 + hvd.rank()))
    distributed.zero_grad()
    model(features).pow(2).mean().backward()
    distributed.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    # hvd.DistributedOptimizer makes a subclass of the optimizer's own class that adds `synchronize`.
    return {"distributed": hasattr(distributed, "synchronize"), "optimizer": type(distributed).__name__,
            "weights": hvd.allgather_object(weights)}


@register("3.1")
def init_and_shard(namespace) -> str:
    """``my_shard_ids(converter)``: after ``hvd.init()``, the row ids of this rank's shard, one full epoch."""
    from helpers.horovod_runner import HorovodRunner

    my_shard_ids, converter = require(namespace, "my_shard_ids", "train_converter")
    shards = HorovodRunner(np=-2).run(_shard_job, my_shard_ids=my_shard_ids, converter=converter)
    first, second = (set(s) for s in shards)
    if not first or not second:
        raise CheckFailed(f"shard sizes {[len(s) for s in shards]}: use cur_shard=hvd.rank(), shard_count=hvd.size()")
    if first & second:
        raise CheckFailed("both ranks read the same rows: shard by hvd.rank() and hvd.size()")
    if len(first | second) != len(converter):
        raise CheckFailed(f"the ranks read {len(first | second)} of {len(converter)} rows: read one full epoch")
    return f"2 ranks read disjoint shards ({len(first)} + {len(second)} rows)"


@register("3.2")
def learning_rate_scaling(scaled_learning_rate) -> str:
    """``scaled_learning_rate(base_lr, world_size)``: the learning rate grows with the number of processes."""
    require_implemented(scaled_learning_rate)
    for base, size in [(1e-5, 1), (1e-5, 4), (0.02, 2), (0.1, 8)]:
        got = scaled_learning_rate(base, size)
        if not isinstance(got, (int, float)) or not math.isclose(got, base * size):
            raise CheckFailed(f"scaled_learning_rate({base}, {size}) = {got!r}, expected {base * size}: each step "
                              "averages gradients over world_size times more images")
    return "learning rate x world size, as the global batch grows"


@register("3.3")
def distributed_optimizer(make_distributed) -> str:
    """``make_distributed(model, optimizer, backward_passes_per_step)``: broadcast, then DistributedOptimizer."""
    from helpers.horovod_runner import HorovodRunner

    require_implemented(make_distributed)
    result = HorovodRunner(np=-2).run(_wrap_job, make_distributed=make_distributed)
    if result is None:
        raise NotAttempted("make_distributed returns nothing yet")
    if not result["distributed"]:
        raise CheckFailed(f"returned a {result['optimizer']}: return hvd.DistributedOptimizer(...)")
    first, second = result["weights"]
    if max(abs(a - b) for a, b in zip(first, second)) > 1e-6:
        raise CheckFailed("after one step the 2 ranks have different weights: broadcast the parameters and the "
                          "optimizer state from rank 0, and average gradients with DistributedOptimizer")
    return "both ranks start from rank 0's weights and stay identical after a step"


@register("3.4")
def horovod_training(namespace) -> str:
    """``hvd_result``: the TrainResult rank 0 returned from ``train_hvd`` run with 2 processes."""
    from mlflow.tracking import MlflowClient

    from helpers.tracking import tracking_uri

    result = require(namespace, "hvd_result")
    if result is None:
        raise NotAttempted("train_hvd returns nothing yet: return what train(...) returns")
    if not getattr(result, "mlflow_run_id", None):
        raise CheckFailed("no MLflow run id: pass mlflow_experiment to train(...) (it logs on rank 0 only)")
    client = MlflowClient(tracking_uri(namespace.get("MLFLOW_TRACKING_URI")))
    run = client.get_run(result.mlflow_run_id)
    params = run.data.params
    if params.get("world_size") != "2":
        raise CheckFailed(f"world_size={params.get('world_size')}: train with strategy=HorovodStrategy()")
    base, effective = float(params["learning_rate"]), float(params.get("effective_learning_rate", "nan"))
    if not math.isclose(effective, 2 * base):
        raise CheckFailed(f"effective learning rate {effective} is not 2 x {base}")
    started = run.info.start_time
    siblings = client.search_runs([run.info.experiment_id],
                                  f"attributes.start_time >= {started - 60_000} and "
                                  f"attributes.start_time <= {started + 60_000}")
    if len(siblings) > 1:
        raise CheckFailed(f"{len(siblings)} MLflow runs for one training: only rank 0 may log")
    if result.val_acc is None or result.val_acc < 0.8:
        raise CheckFailed(f"val_acc {result.val_acc}: the model did not learn enough (expected >= 0.8)")
    return f"one MLflow run, 2 processes, lr {base:g} -> {effective:g}, val_acc {result.val_acc:.2f}"
