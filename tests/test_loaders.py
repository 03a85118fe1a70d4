"""Split, repartition, Petastorm converters, the TransformSpec, shards and the Lightning-friendly loader."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import CourseInputError
from helpers.lake import ingest_images, read_table
from helpers.loaders import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PetastormBatches,
    decode_image,
    make_loader,
    partitions_for,
    prepare_data,
    stratified_split,
)
from tests.image_folders import make_image_folder


def test_stratified_split_keeps_every_class_in_both_within_one_image(spark, digits_data):
    df = digits_data.df
    train, val = stratified_split(df, 0.2, seed=3)
    totals = Counter(r.label for r in df.select("label").collect())
    in_val = Counter(r.label for r in val.select("label").collect())
    in_train = Counter(r.label for r in train.select("label").collect())
    assert set(in_val) == set(in_train) == set(totals)
    for label, n in totals.items():
        assert abs(in_val[label] - 0.2 * n) <= 1
        assert in_val[label] + in_train[label] == n
    train_paths = {r.path for r in train.select("path").collect()}
    val_paths = {r.path for r in val.select("path").collect()}
    assert not train_paths & val_paths
    # The same seed gives the same split; another seed a different one.
    assert {r.path for r in stratified_split(df, 0.2, seed=3)[1].select("path").collect()} == val_paths
    assert {r.path for r in stratified_split(df, 0.2, seed=4)[1].select("path").collect()} != val_paths


def test_tiny_classes_still_appear_in_both_splits(spark, tmp_path: Path):
    folder = make_image_folder(tmp_path / "imgs", {"a": 2, "b": 9})
    ingest_images(spark, folder, tmp_path / "t")
    train, val = stratified_split(read_table(spark, tmp_path / "t"), 0.1)
    assert {r.label for r in val.collect()} == {r.label for r in train.collect()} == {"a", "b"}


def test_converters_have_two_partitions_per_device(digits_data):
    assert len(digits_data.train_converter.file_urls) >= partitions_for(2) == 4
    assert len(digits_data.val_converter.file_urls) >= 4
    assert len(digits_data.train_converter) + len(digits_data.val_converter) == 1797
    assert digits_data.class_names == [f"digit_{i}" for i in range(10)]


@pytest.mark.parametrize("num_devices", [0, -1, 1.5, True])
def test_bad_device_counts_are_refused(num_devices):
    with pytest.raises(CourseInputError, match=r"^num_devices=.*: pass a whole number of at least 1\."):
        partitions_for(num_devices)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cur_shard": 2, "shard_count": 2}, r"^cur_shard=2: pass 0 to 1, one shard per process\.$"),
        ({"cur_shard": -1}, r"^cur_shard=-1: pass a whole number of at least 0\.$"),
        ({"shard_count": 0}, r"^shard_count=0: pass a whole number of at least 1\.$"),
        ({"batch_size": 0}, r"^batch_size=0: pass a whole number of at least 1\.$"),
        ({"image_size": 4}, r"^image_size=4: pass a whole number of at least 8\. E\.g\. 32 or 224\.$"),
    ],
)
def test_bad_loader_arguments_are_refused_before_reading(kwargs, message):
    with pytest.raises(CourseInputError, match=message):
        make_loader(None, **kwargs)


def test_bad_steps_per_epoch_is_refused():
    with pytest.raises(CourseInputError, match=r"^steps_per_epoch=0: pass a whole number of at least 1\.$"):
        PetastormBatches(None, batch_size=8, image_size=16, steps_per_epoch=0)


def test_more_devices_than_rows_is_a_clear_error(spark, tmp_path: Path):
    folder = make_image_folder(tmp_path / "imgs", {"a": 3, "b": 3})
    with pytest.raises(CourseInputError, match="more than the 4 training images"):
        prepare_data(folder, num_devices=5, spark=spark, table_path=tmp_path / "t")


def test_decode_image_shape_dtype_and_normalisation(tmp_path: Path):
    folder = make_image_folder(tmp_path, {"g": 1}, size=(13, 40), fmt="PNG", mode="L")
    array = decode_image((folder / "g" / "img_000.png").read_bytes(), image_size=24)
    assert array.shape == (3, 24, 24) and array.dtype == np.float32
    low = (0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    high = (1 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    assert (array.min(axis=(1, 2)) >= low - 1e-5).all() and (array.max(axis=(1, 2)) <= high + 1e-5).all()


def test_two_shards_are_disjoint_and_complete(digits_data):
    seen = []
    for shard in range(2):
        with make_loader(
            digits_data.train_converter, batch_size=100, image_size=16, cur_shard=shard, shard_count=2
        ) as loader:
            batches = list(loader)
        ids = torch.cat([b["row_id"] for b in batches]).tolist()
        assert ids, f"shard {shard} is empty"
        assert batches[0]["features"].shape[1:] == (3, 16, 16)
        assert batches[0]["label_index"].dtype == torch.int64
        seen.append(set(ids))
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == len(digits_data.train_converter)


def test_fixed_steps_per_epoch_survive_many_epochs(digits_data):
    batches = PetastormBatches(
        digits_data.train_converter, batch_size=64, image_size=16, steps_per_epoch=30, shuffle=True
    )
    try:
        counts = [sum(1 for _ in batches) for _ in range(3)]  # 30 x 64 > 1438 rows: crosses the data's end
    finally:
        batches.close()
    assert counts == [30, 30, 30] and len(batches) == 30


def test_a_training_loader_shuffles_rows_without_a_large_buffer(digits_data):
    """Every row once per pass, in another order than the unshuffled loader's, and no up-front shuffle buffer:
    Petastorm's row shuffling queue allocated 100 million slots (about 800 MB) in every training process."""
    import psutil

    def row_ids(shuffle: bool) -> list[int]:
        with make_loader(digits_data.train_converter, batch_size=64, image_size=8, shuffle=shuffle) as loader:
            return torch.cat([b["row_id"] for b in loader]).tolist()

    process = psutil.Process()
    before = process.memory_info().rss
    shuffled = row_ids(shuffle=True)
    grown_mb = (process.memory_info().rss - before) / 2**20
    in_order = row_ids(shuffle=False)
    assert sorted(shuffled) == sorted(in_order) and len(shuffled) == len(set(shuffled))
    assert shuffled != in_order
    assert grown_mb < 400, f"opening a shuffling loader grew this process by {grown_mb:.0f} MB"


def test_full_pass_validation_reads_each_row_once_per_epoch(digits_data):
    batches = PetastormBatches(digits_data.val_converter, batch_size=50, image_size=16)
    for _ in range(2):
        ids = torch.cat([b["row_id"] for b in batches]).tolist()
        assert sorted(ids) == sorted(set(ids)) and len(ids) == len(digits_data.val_converter)


def test_another_image_folder_goes_all_the_way_to_a_batch(spark, tmp_path: Path):
    """What lesson 1 does on an instructor's own folder (other classes and sizes, JPEG and grayscale PNG), from the
    files to a normalised batch (this ran lesson 1's whole notebook a second time before)."""
    folder = make_image_folder(tmp_path / "flowers", {"tulips": 45, "daisy": 40}, size=(64, 48), fmt="JPEG")
    make_image_folder(folder, {"roses": 50}, size=(20, 30), fmt="PNG", mode="L", seed=1)
    data = prepare_data(folder, num_devices=2, spark=spark, table_path=tmp_path / "table")
    assert data.class_names == ["daisy", "roses", "tulips"]
    assert data.df.count() == 135
    assert len(data.train_converter) + len(data.val_converter) == 135
    with make_loader(data.train_converter, batch_size=16, image_size=24) as loader:
        batch = next(iter(loader))
    assert tuple(batch["features"].shape) == (16, 3, 24, 24) and batch["features"].dtype == torch.float32
    assert set(batch["label_index"].tolist()) <= {0, 1, 2}
