"""Checks for lesson 1: from image files to a Delta lake to a PyTorch DataLoader with Petastorm.

Each check runs the student's code on inputs of its own and tests what it does, not how it is written.
"""

from __future__ import annotations

from helpers.checks import CheckFailed, register, require, require_implemented


def _spark():
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        raise CheckFailed("no active SparkSession: run the notebook's set-up cells first")
    return session


@register("1.1")
def label_from_path(label_column) -> str:
    """``label_column(df)`` adds a ``label`` column: the name of the folder an image file sits in."""
    require_implemented(label_column)
    paths = ["file:/data/flowers/daisy/1.jpg", "file:/x/roses/2.png", "dbfs:/a/b/tulips/3.JPG"]
    df = _spark().createDataFrame([(p,) for p in paths], ["path"])
    out = label_column(df)
    if out is None or "label" not in out.columns:
        raise CheckFailed("return the DataFrame with a new column named 'label' (df.withColumn('label', ...))")
    got = {r["path"]: r["label"] for r in out.collect()}
    expected = dict(zip(paths, ["daisy", "roses", "tulips"]))
    if got != expected:
        raise CheckFailed(f"expected labels {expected}, got {got}: take the name of the folder the file is in")
    return "labels come from the class folder names"


@register("1.2")
def stable_label_indices(label_indices) -> str:
    """``label_indices(labels)`` maps each distinct class name to its position among the sorted names."""
    require_implemented(label_indices)
    got = label_indices(["tulips", "daisy", "roses", "daisy", "tulips"])
    if not isinstance(got, dict):
        raise CheckFailed(f"return a dict from class name to index, got {type(got).__name__}")
    if got != {"daisy": 0, "roses": 1, "tulips": 2}:
        raise CheckFailed(f"got {got}: sort the distinct names, then number them from 0")
    if label_indices(["b", "a"]) != label_indices(["a", "b"]):
        raise CheckFailed("the index must not depend on the order the files were read in")
    return "indices follow the sorted class names, so they are the same in every run"


@register("1.3")
def validation_count_rule(validation_count) -> str:
    """``validation_count(n, val_fraction)``: images of one class that go to validation."""
    require_implemented(validation_count)
    cases = [(100, 0.2, 20), (10, 0.25, None), (2, 0.1, 1), (3, 0.9, 2), (1797, 0.2, None)]
    for n, fraction, exact in cases:
        got = validation_count(n, fraction)
        if not isinstance(got, int):
            raise CheckFailed(f"validation_count({n}, {fraction}) returned {got!r}: return a whole number")
        if not 1 <= got <= n - 1:
            raise CheckFailed(f"validation_count({n}, {fraction}) = {got}: every class needs >= 1 image in each split")
        if exact is not None and got != exact:
            raise CheckFailed(f"validation_count({n}, {fraction}) = {got}, expected {exact}")
        if exact is None and abs(got - n * fraction) > 1:
            raise CheckFailed(f"validation_count({n}, {fraction}) = {got} is more than one image off {n * fraction}")
    return "every class lands in both splits, within one image of the exact fraction"


@register("1.4")
def repartition_rule(repartition_for_devices) -> str:
    """``repartition_for_devices(df, num_devices)`` gives every device at least two non-empty partitions."""
    from pyspark.sql import functions as F

    require_implemented(repartition_for_devices)
    df = _spark().range(200).coalesce(1)
    for devices in (1, 2, 3, 8):
        out = repartition_for_devices(df, devices)
        parts = out.rdd.getNumPartitions()
        if parts < 2 * devices:
            raise CheckFailed(f"{devices} device(s) got {parts} partitions: make at least 2 per device")
        filled = out.select(F.spark_partition_id().alias("p")).distinct().count()
        if filled < 2 * devices:
            raise CheckFailed(f"{devices} device(s): only {filled} partitions hold rows; use df.repartition(n)")
        if out.count() != 200:
            raise CheckFailed("repartitioning must keep every row")
    return "2 partitions per device, none empty"


@register("1.5")
def transformed_batch(namespace) -> str:
    """``batch``: one batch from ``make_loader`` with ``BATCH_SIZE`` and ``IMAGE_SIZE``."""
    import torch

    batch, batch_size, image_size = require(namespace, "batch", "BATCH_SIZE", "IMAGE_SIZE")
    if not isinstance(batch, dict) or "features" not in batch or "label_index" not in batch:
        raise CheckFailed("`batch` should be one dict from the loader: next(iter(loader))")
    features, labels = batch["features"], batch["label_index"]
    if tuple(features.shape) != (batch_size, 3, image_size, image_size):
        raise CheckFailed(f"features have shape {tuple(features.shape)}, expected "
                          f"{(batch_size, 3, image_size, image_size)}: pass batch_size and image_size")
    if features.dtype != torch.float32 or labels.dtype != torch.int64:
        raise CheckFailed(f"dtypes {features.dtype}/{labels.dtype}, expected torch.float32/torch.int64")
    low, high = float(features.min()), float(features.max())
    if low >= 0 or high > 3 or low < -2.5:
        raise CheckFailed(f"values in [{low:.2f}, {high:.2f}]: expected ImageNet-normalised values around 0")
    return f"{batch_size} x 3 x {image_size} x {image_size} float32, normalised to [{low:.2f}, {high:.2f}]"


@register("1.6")
def disjoint_complete_shards(namespace) -> str:
    """``read_shard_ids(converter, shard, shard_count)`` returns the row ids one worker reads."""
    read_shard_ids, converter = require(namespace, "read_shard_ids", "train_converter")
    shards = [list(read_shard_ids(converter, shard, 2)) for shard in range(2)]
    if any(not ids for ids in shards):
        raise CheckFailed(f"shard sizes {[len(s) for s in shards]}: each of 2 workers must get rows (cur_shard)")
    first, second = set(shards[0]), set(shards[1])
    if first & second:
        raise CheckFailed(f"{len(first & second)} rows are in both shards: pass cur_shard and shard_count")
    total = len(converter)
    if len(first | second) != total or len(shards[0]) + len(shards[1]) != total:
        raise CheckFailed(f"the shards hold {len(first | second)} distinct of {total} rows: read one full epoch "
                          "(num_epochs=1)")
    share = len(shards[0]) / total
    return f"2 disjoint shards cover all {total} rows ({share:.0%} / {1 - share:.0%})"


