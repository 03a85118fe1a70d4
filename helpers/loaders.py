"""From the lake to PyTorch: stratified split, Petastorm converters, the image transform, and sharded loaders.

A Petastorm converter materialises a DataFrame once as Parquet in a cache folder; its loaders stream it back as
tensors, each process reading its own shard (``cur_shard``/``shard_count``) of the Parquet row groups.
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers import CourseInputError
from helpers.data import resolve_data_dir
from helpers.lake import default_table_path, ingest_images, read_table
from helpers.validation import whole_number

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "TRAIN_COLUMNS",
    "PetastormBatches",
    "PreparedData",
    "decode_image",
    "image_transform_spec",
    "make_loader",
    "partitions_for",
    "prepare_data",
    "steps_per_epoch",
    "stratified_split",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TRAIN_COLUMNS = ["row_id", "content", "label_index"]

warnings.filterwarnings("ignore", category=FutureWarning, module="petastorm")
# Petastorm logs advice about small Parquet files at WARNING; the course's data sets are small on purpose.
logging.getLogger("petastorm").setLevel(logging.ERROR)


def stratified_split(df, val_fraction: float = 0.2, seed: int = 0):
    """Split a lake DataFrame into (train, validation), class by class.

    In every class of n images, ``round(n * val_fraction)`` go to validation, at least one and at most n - 1, so
    every class is in both splits and each class's proportion is within one image of exact. Which images go where
    is a deterministic function of ``seed`` and the image path.

    Args:
        df: a lake DataFrame (``path``, ``label_index``, ...).
        val_fraction: the share of each class that goes to validation, between 0 and 1.
        seed: which images go where.

    Returns:
        ``(train_df, val_df)``.

    Raises:
        CourseInputError: ``val_fraction`` is not between 0 and 1.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not 0.0 < val_fraction < 1.0:
        raise CourseInputError(f"val_fraction={val_fraction} must be between 0 and 1 (exclusive), e.g. 0.2.")
    by_class = Window.partitionBy("label_index")
    ranked = (
        df.withColumn("_key", F.xxhash64("path", F.lit(seed)))
        .withColumn("_rank", F.row_number().over(by_class.orderBy("_key", "path")))
        .withColumn("_n", F.count(F.lit(1)).over(by_class))
        .withColumn("_n_val", F.least(F.greatest(F.round(F.col("_n") * val_fraction), F.lit(1)), F.col("_n") - 1))
    )
    is_val = F.col("_rank") <= F.col("_n_val")
    helper_columns = ["_key", "_rank", "_n", "_n_val"]
    return ranked.where(~is_val).drop(*helper_columns), ranked.where(is_val).drop(*helper_columns)


def partitions_for(num_devices: int) -> int:
    """How many partitions a split needs so that every device gets work.

    Args:
        num_devices: the processes that will read the split.

    Returns:
        Two per device.

    Raises:
        CourseInputError: ``num_devices`` is not a whole number of at least 1.
    """
    return 2 * whole_number("num_devices", num_devices, hint="One per GPU or process.")


@dataclass
class PreparedData:
    """What :func:`prepare_data` returns; unpacks as ``df, train_converter, val_converter, class_names``.

    Attributes:
        df: the lake DataFrame, with a ``row_id`` column.
        train_converter: the Petastorm converter of the training split.
        val_converter: the Petastorm converter of the validation split.
        class_names: the class names, in ``label_index`` order.
    """

    df: Any
    train_converter: Any
    val_converter: Any
    class_names: list[str]

    def __iter__(self) -> Iterator[Any]:
        return iter((self.df, self.train_converter, self.val_converter, self.class_names))


def prepare_data(
    data_dir: str | os.PathLike | None,
    num_devices: int = 1,
    val_fraction: float = 0.2,
    seed: int = 0,
    *,
    spark=None,
    table_path: str | os.PathLike | None = None,
    refresh: bool = False,
) -> PreparedData:
    """Lake table -> stratified split -> ``2 x num_devices`` partitions each -> Petastorm converters.

    The Delta table for the folder is ingested on first use (or when ``refresh``) and read through its current
    snapshot afterwards.

    Args:
        data_dir: an image folder, or None for the embedded digits.
        num_devices: the processes that will read each split.
        val_fraction: the share of each class that goes to validation.
        seed: which images go to validation.
        spark: the SparkSession (default: :func:`~helpers.spark.get_spark`).
        table_path: the Delta table's folder (default: :func:`~helpers.lake.default_table_path`).
        refresh: ingest the folder again even if its table exists.

    Returns:
        A :class:`PreparedData`: ``df, train_converter, val_converter, class_names = prepare_data(...)``.

    Raises:
        CourseInputError: a bad argument or image folder, or fewer training images than devices.
    """
    from petastorm.spark import make_spark_converter
    from pyspark.sql import functions as F

    from helpers.spark import get_spark

    partitions = partitions_for(num_devices)
    spark = spark or get_spark()
    folder = resolve_data_dir(data_dir)
    path = Path(table_path) if table_path else default_table_path(folder)
    if refresh or not (path / "_delta_log").exists():
        ingest_images(spark, folder, path)
    df = read_table(spark, path).withColumn("row_id", F.xxhash64("path"))
    class_names = [r["label"] for r in df.select("label", "label_index").distinct().orderBy("label_index").collect()]
    train_df, val_df = stratified_split(df, val_fraction, seed)
    train_rows = train_df.count()
    if train_rows < num_devices:
        raise CourseInputError(
            f"num_devices={num_devices} is more than the {train_rows} training images: use fewer devices or more data."
        )
    train_converter = make_spark_converter(train_df.select(TRAIN_COLUMNS).repartition(partitions))
    val_converter = make_spark_converter(val_df.select(TRAIN_COLUMNS).repartition(partitions))
    return PreparedData(df, train_converter, val_converter, class_names)


def decode_image(content: bytes, image_size: int) -> np.ndarray:
    """Decode one encoded image into a float32 CHW array: RGB, resized and centre-cropped, ImageNet-normalised.

    The shorter side is resized to ``image_size * 256 / 224`` and the centre ``image_size`` square kept, the
    recipe used for ImageNet models (256 then 224).

    Args:
        content: the encoded image (JPEG, PNG, ...).
        image_size: the side of the square output.

    Returns:
        A float32 array of shape ``(3, image_size, image_size)``.
    """
    from PIL import Image

    with Image.open(io.BytesIO(content)) as image:
        rgb = image.convert("RGB")
    resize_to = round(image_size * 256 / 224)
    width, height = rgb.size
    scale = resize_to / min(width, height)
    rgb = rgb.resize((max(resize_to, round(width * scale)), max(resize_to, round(height * scale))), Image.BILINEAR)
    left = (rgb.width - image_size) // 2
    top = (rgb.height - image_size) // 2
    rgb = rgb.crop((left, top, left + image_size, top + image_size))
    pixels = np.asarray(rgb, dtype=np.float32) / 255.0
    normalised = (pixels - np.array(IMAGENET_MEAN, np.float32)) / np.array(IMAGENET_STD, np.float32)
    return normalised.transpose(2, 0, 1).copy()


def image_transform_spec(image_size: int = 32):
    """A Petastorm TransformSpec that decodes ``content`` with :func:`decode_image`.

    Args:
        image_size: the side of the square images.

    Returns:
        A ``TransformSpec`` whose batches hold ``features`` (float32, 3 x image_size x image_size), ``label_index``
        (int64) and ``row_id`` (which identifies rows across shards).

    Raises:
        CourseInputError: ``image_size`` is not a whole number of at least 8.
    """
    from petastorm import TransformSpec

    image_size = whole_number("image_size", image_size, minimum=8, hint="E.g. 32 or 224.")

    def transform(pdf: pd.DataFrame) -> pd.DataFrame:
        out = pdf[["row_id", "label_index"]].copy()
        out["label_index"] = out["label_index"].astype(np.int64)
        out["features"] = [decode_image(c, image_size) for c in pdf["content"]]
        return out

    return TransformSpec(
        transform,
        edit_fields=[
            ("features", np.float32, (3, image_size, image_size), False),
            ("label_index", np.int64, (), False),
        ],
        selected_fields=["features", "label_index", "row_id"],
    )


def make_loader(
    converter,
    batch_size: int = 64,
    image_size: int = 32,
    cur_shard: int = 0,
    shard_count: int = 1,
    num_epochs: int | None = 1,
    shuffle: bool = False,
    workers_count: int = 2,
):
    """A PyTorch DataLoader over one shard of a converter (Petastorm's ``make_torch_dataloader``).

    Args:
        converter: a Petastorm converter of ``TRAIN_COLUMNS``.
        batch_size: rows per batch.
        image_size: the side of the square images.
        cur_shard: this process's shard, 0 to ``shard_count - 1``.
        shard_count: the number of shards (processes).
        num_epochs: passes over the shard; None for an endless stream.
        shuffle: shuffle the row groups and the rows inside each (seeded), for training.
        workers_count: Petastorm reader threads.

    Returns:
        A context manager that yields the DataLoader. Batches are dicts: ``features`` (float32 N x 3 x S x S),
        ``label_index`` (int64 N), ``row_id`` (int64 N).

    Raises:
        CourseInputError: a shard, shard count, batch size or image size that is not a whole number in range.
    """
    shard_count = whole_number("shard_count", shard_count)
    cur_shard = whole_number("cur_shard", cur_shard, minimum=0)
    if cur_shard >= shard_count:
        raise CourseInputError(f"cur_shard={cur_shard}: pass 0 to {shard_count - 1}, one shard per process.")
    batch_size = whole_number("batch_size", batch_size)
    spec = image_transform_spec(image_size)
    return converter.make_torch_dataloader(
        batch_size=batch_size,
        num_epochs=num_epochs,
        cur_shard=cur_shard,
        shard_count=shard_count,
        transform_spec=spec,
        workers_count=workers_count,
        # rows are shuffled by the reader, inside each row group: Petastorm's row-by-row shuffling queue would
        # allocate 100 million slots up front (800 MB in every training process)
        shuffling_queue_capacity=0,
        seed=0 if shuffle else None,
        shuffle_row_groups=shuffle,
        shuffle_rows=shuffle,
    )


class PetastormBatches:
    """Batches for Lightning from one Petastorm shard, without the reader-reset error.

    With ``steps_per_epoch`` set (training), one reader with ``num_epochs=None`` stays open across epochs and each
    iteration yields exactly that many batches, so every rank runs the same number of steps. Without it
    (validation), each iteration opens a fresh reader with ``num_epochs=1``: one full pass over the shard.
    Call ``close()`` when done (the DataModule does it in ``teardown``).

    Args:
        converter: a Petastorm converter of ``TRAIN_COLUMNS``.
        batch_size: rows per batch.
        image_size: the side of the square images.
        cur_shard: this process's shard.
        shard_count: the number of shards (processes).
        steps_per_epoch: batches per iteration over an endless reader; None for one full pass per iteration.
        shuffle: shuffle row groups and rows (seeded), for training.
        workers_count: Petastorm reader threads.

    Raises:
        CourseInputError: ``steps_per_epoch`` is not None nor a whole number of at least 1.
    """

    def __init__(
        self,
        converter,
        batch_size: int,
        image_size: int,
        cur_shard: int = 0,
        shard_count: int = 1,
        steps_per_epoch: int | None = None,
        shuffle: bool = False,
        workers_count: int = 2,
    ) -> None:
        self._context = None
        self._iterator: Iterator[dict] | None = None
        self.steps_per_epoch = None if steps_per_epoch is None else whole_number("steps_per_epoch", steps_per_epoch)
        self._loader_args = dict(
            converter=converter,
            batch_size=batch_size,
            image_size=image_size,
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            workers_count=workers_count,
        )

    def __len__(self) -> int:
        if self.steps_per_epoch is None:
            raise TypeError("a full-pass PetastormBatches has no fixed length")
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[dict]:
        if self.steps_per_epoch is None:
            with make_loader(num_epochs=1, **self._loader_args) as loader:
                yield from loader
            return
        if self._iterator is None:
            self._context = make_loader(num_epochs=None, **self._loader_args)
            self._iterator = iter(self._context.__enter__())
        for _ in range(self.steps_per_epoch):
            yield next(self._iterator)

    def close(self) -> None:
        """Stop the persistent reader, if one is open (also on an object whose ``__init__`` never ran, such as a
        subclass's that failed first)."""
        if getattr(self, "_context", None) is not None:
            self._context.__exit__(None, None, None)
        self._context, self._iterator = None, None

    def __del__(self) -> None:
        # A forgotten close() must not leave reader threads running.
        self.close()


def steps_per_epoch(rows: int, batch_size: int, world_size: int = 1) -> int:
    """Optimizer steps per epoch when ``world_size`` devices each take ``batch_size`` rows per step.

    An epoch is one pass over the ``rows`` training rows whatever the device count. (The original notebooks kept
    the steps fixed while adding devices, so one "epoch" on n devices was about n passes of the data.)

    Args:
        rows: training rows in one pass.
        batch_size: rows per device per step.
        world_size: devices taking a batch at each step.

    Returns:
        ``ceil(rows / (batch_size * world_size))``, at least 1.

    Raises:
        CourseInputError: an argument is not a whole number of at least 1.
    """
    rows = whole_number("rows", rows)
    step_rows = whole_number("batch_size", batch_size) * whole_number("world_size", world_size)
    return -(-rows // step_rows)
