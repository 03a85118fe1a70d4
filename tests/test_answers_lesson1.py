"""Answer corpus for lesson 1: right answers written differently pass, lazy, hard-coded and subtly wrong ones fail.

Each answer is run against its check directly (``helpers.course.checks._run``); the checks generate their own inputs (a
Spark DataFrame, Delta tables, a small Petastorm converter), so the tests only need an active SparkSession.
"""

from __future__ import annotations

import gc
import io
import itertools
import math
import shutil
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
import torch
from deltalake import DeltaTable, write_deltalake
from petastorm import TransformSpec
from petastorm.pytorch import BatchedDataLoader
from petastorm.spark import make_spark_converter
from petastorm.transform import edit_field
from PIL import Image
from pyspark.sql import functions as F

from helpers import lake, loaders
from helpers.course.checks import PASSED, _run
from helpers.loaders import IMAGENET_MEAN, IMAGENET_STD, TRAIN_COLUMNS

pytestmark = pytest.mark.usefixtures("spark")


def verdict(exercise: str, answer) -> str:
    status, message = _run(exercise, answer)
    assert status in (PASSED, "failed"), message
    return status


def delegated(exercise: str, answer) -> bool:
    status, message = _run(exercise, answer)
    return status == "failed" and "write it yourself" in message


# --- 1.1 label_column ------------------------------------------------------------------------------------------


def label_element_at(df):
    return df.withColumn("label", F.element_at(F.split("path", "/"), -2))


def label_regexp(df):
    return df.withColumn("label", F.regexp_extract(F.col("path"), r"([^/]+)/[^/]+$", 1))


def label_substring_index(df):
    return df.select("*", F.substring_index(F.substring_index("path", "/", -2), "/", 1).alias("label"))


def label_unchanged(df):
    return df


def label_hard_coded(df):
    return df.withColumn("label", F.lit("daisy"))


def label_file_name(df):
    return df.withColumn("label", F.element_at(F.split("path", "/"), -1))


def label_known_classes(df):
    return df.withColumn("label", F.regexp_extract("path", r"(daisy|roses|tulips|digit_\d)", 1))


def label_udf(df):
    folder = F.udf(lambda path: path.rsplit("/", 2)[-2])
    return df.withColumn("label", folder("path"))


def label_some_rows(df):
    return label_element_at(df).limit(6)


def label_collected(df):
    return {row["path"]: row["path"].split("/")[-2] for row in df.collect()}  # the labels, not a DataFrame


def label_delegating(df):
    images, *_ = lake.read_images(df.sparkSession, "/data/flowers")
    return images


@pytest.mark.parametrize("answer", [label_element_at, label_regexp, label_substring_index, label_udf])
def test_1_1_right(answer):
    assert verdict("1.1", answer) == PASSED


@pytest.mark.parametrize(
    "answer",
    [label_unchanged, label_hard_coded, label_file_name, label_known_classes, label_some_rows, label_collected],
)
def test_1_1_wrong(answer):
    assert verdict("1.1", answer) == "failed"


def test_1_1_delegating():
    assert delegated("1.1", label_delegating)


# --- 1.2 label_indices -----------------------------------------------------------------------------------------


def indices_sorted_set(labels):
    return {name: index for index, name in enumerate(sorted(set(labels)))}


def indices_numpy(labels):
    names = np.unique(labels)
    return dict(zip(names, np.arange(len(names))))


def indices_pandas(labels):
    return pd.Series(sorted(pd.unique(pd.Series(labels)))).reset_index().set_index(0)["index"].to_dict()


def indices_sorting_in_place(labels):
    labels.sort()
    return {name: index for index, name in enumerate(dict.fromkeys(labels))}


def indices_constant(labels):
    return {"daisy": 0, "roses": 1, "tulips": 2}


def indices_first_seen(labels):
    return {name: index for index, name in enumerate(dict.fromkeys(labels))}


def indices_from_one(labels):
    return {name: index + 1 for index, name in enumerate(sorted(set(labels)))}


def indices_list(labels):
    return sorted(set(labels))


def indices_all_zero(labels):
    return dict.fromkeys(labels, 0)


def indices_halves(labels):
    return {name: index + 0.5 for index, name in enumerate(sorted(set(labels)))}


@pytest.mark.parametrize("answer", [indices_sorted_set, indices_numpy, indices_pandas, indices_sorting_in_place])
def test_1_2_right(answer):
    assert verdict("1.2", answer) == PASSED


@pytest.mark.parametrize(
    "answer", [indices_constant, indices_first_seen, indices_from_one, indices_list, indices_all_zero, indices_halves]
)
def test_1_2_wrong(answer):
    assert verdict("1.2", answer) == "failed"


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        (indices_first_seen, "must not depend on the order the files were read in"),
        (indices_all_zero, "then number them from 0"),
        (indices_list, "return a dict from class name to a whole-number index"),
    ],
)
def test_1_2_hint_names_the_mistake(answer, hint):
    status, message = _run("1.2", answer)
    assert status == "failed" and hint in message, message


# --- 1.4 validation_count --------------------------------------------------------------------------------------


def count_round(n, val_fraction):
    return int(min(max(round(n * val_fraction), 1), n - 1))


def count_numpy(n, val_fraction):
    return np.clip(np.round(n * val_fraction), 1, n - 1).astype(np.int64)


def count_half_up_float(n, val_fraction):
    return float(max(1, min(n - 1, math.floor(n * val_fraction + 0.5))))


def count_floor(n, val_fraction):
    return max(1, min(n - 1, int(n * val_fraction)))


def count_unclamped(n, val_fraction):
    return round(n * val_fraction)


def count_ceil(n, val_fraction):
    return max(1, min(n - 1, math.ceil(n * val_fraction)))


def count_hard_coded(n, val_fraction):
    return 20


def count_bool(n, val_fraction):
    return True


def count_delegating(n, val_fraction):
    from helpers.spark import get_spark

    df = get_spark().createDataFrame([(f"/{i}.png", 0) for i in range(n)], "path string, label_index int")
    return loaders.stratified_split(df, val_fraction)[1].count()


@pytest.mark.parametrize("answer", [count_round, count_numpy, count_half_up_float])
def test_1_4_right(answer):
    assert verdict("1.4", answer) == PASSED


@pytest.mark.parametrize("answer", [count_floor, count_unclamped, count_ceil, count_hard_coded, count_bool])
def test_1_4_wrong(answer):
    assert verdict("1.4", answer) == "failed"


def test_1_4_delegating():
    assert delegated("1.4", count_delegating)


def test_1_4_cases_hold_a_half_and_both_bounds():
    from helpers.course.checks.lesson1 import validation_count_rule

    products = [n * fraction for n, fraction in validation_count_rule.cases()]
    assert any(abs(p - round(p) - 0.5) < 1e-9 or abs(p - round(p) + 0.5) < 1e-9 for p in products)  # either way
    assert any(p < 0.5 for p in products) and any(
        n - p < 0.5 for (n, _), p in zip(validation_count_rule.cases(), products)
    )


# --- 1.5 repartition_for_devices -------------------------------------------------------------------------------


def partitions_two_per_device(df, num_devices):
    return df.repartition(2 * num_devices)


def partitions_by_random_key(df, num_devices):
    return df.coalesce(1).repartition(num_devices + num_devices, F.rand(seed=7))


def partitions_by_range_of_path(df, num_devices):
    return df.repartitionByRange(2 * num_devices, "path")


def partitions_constant(df, num_devices):
    return df.repartition(64)


def partitions_coalesce(df, num_devices):
    return df.coalesce(2 * num_devices)


def partitions_one_per_device(df, num_devices):
    return df.repartition(num_devices)


def partitions_by_label(df, num_devices):
    return df.repartition(2 * num_devices, "label_index")


def partitions_columns_dropped(df, num_devices):
    return df.select("path", "label_index").repartition(2 * num_devices)


def partitions_rows_twice(df, num_devices):
    return df.union(df).repartition(2 * num_devices)


def partitions_delegating(df, num_devices):
    return df.repartition(loaders.partitions_for(num_devices))


@pytest.mark.parametrize("answer", [partitions_two_per_device, partitions_by_random_key, partitions_by_range_of_path])
def test_1_5_right(answer):
    assert verdict("1.5", answer) == PASSED


@pytest.mark.parametrize(
    "answer",
    [
        partitions_constant,
        partitions_coalesce,
        partitions_one_per_device,
        partitions_by_label,
        partitions_columns_dropped,
        partitions_rows_twice,
    ],
)
def test_1_5_wrong(answer):
    assert verdict("1.5", answer) == "failed"


def test_1_5_delegating():
    assert delegated("1.5", partitions_delegating)


# --- 1.7 transform_spec ----------------------------------------------------------------------------------------

MEAN, STD = np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)


def decode_crop(content, image_size):
    """The lesson's recipe: shorter side to image_size * 256 / 224, centre crop, normalise, CHW."""
    with Image.open(io.BytesIO(content)) as image:
        rgb = image.convert("RGB")
    scale = round(image_size * 256 / 224) / min(rgb.size)
    rgb = rgb.resize((max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))))
    left, top = (rgb.width - image_size) // 2, (rgb.height - image_size) // 2
    rgb = rgb.crop((left, top, left + image_size, top + image_size))
    return ((np.asarray(rgb, np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1).copy()


def spec_selected_fields(image_size):
    def transform(pdf):
        out = pdf[["row_id", "label_index"]].copy()
        out["label_index"] = out["label_index"].astype(np.int64)
        out["features"] = [decode_crop(c, image_size) for c in pdf["content"]]
        return out

    return TransformSpec(
        transform,
        edit_fields=[
            ("features", np.float32, (3, image_size, image_size), False),
            ("label_index", np.int64, (), False),
        ],
        selected_fields=["features", "label_index", "row_id"],
    )


def spec_removed_fields(image_size):
    """Another way: plain resize, normalise all images at once, ``removed_fields`` and ``edit_field``."""

    def transform(pdf):
        images = []
        for content in pdf.pop("content"):
            with Image.open(io.BytesIO(content)) as image:
                images.append(np.asarray(image.convert("RGB").resize((image_size, image_size)), np.float64))
        stacked = ((np.stack(images) / 255.0 - MEAN) / STD).astype(np.float32).transpose(0, 3, 1, 2)
        return pdf.assign(features=list(np.ascontiguousarray(stacked)), label_index=pdf["label_index"].astype("int64"))

    return TransformSpec(
        transform,
        edit_fields=[
            edit_field("features", np.float32, (3, image_size, image_size)),
            edit_field("label_index", np.int64, ()),
        ],
        removed_fields=["content"],
    )


def spec_with(decode, dtype=np.float32, shape=None, label_type=np.int64, keep_content=False):
    """A spec like spec_selected_fields, with one thing changed (for the wrong answers)."""

    def make(image_size):
        def transform(pdf):
            out = pdf[["row_id", "label_index", "content"] if keep_content else ["row_id", "label_index"]].copy()
            out["label_index"] = out["label_index"].astype(label_type)
            out["features"] = [decode(c, image_size).astype(dtype) for c in pdf["content"]]
            return out

        fields = [("features", dtype, shape(image_size) if shape else (3, image_size, image_size), False)]
        fields += [("label_index", label_type, (), False)] if label_type is not None else []
        selected = None if keep_content else ["features", "label_index", "row_id"]
        return TransformSpec(transform, edit_fields=fields, selected_fields=selected)

    return make


def decode_unnormalised(content, image_size):
    with Image.open(io.BytesIO(content)) as image:
        rgb = image.convert("RGB").resize((image_size, image_size))
    return (np.asarray(rgb, np.float32) / 255).transpose(2, 0, 1).copy()


def decode_bgr(content, image_size):
    with Image.open(io.BytesIO(content)) as image:
        bgr = np.asarray(image.convert("RGB").resize((image_size, image_size)), np.float32)[..., ::-1] / 255
    return ((bgr - MEAN) / STD).transpose(2, 0, 1).copy()


def decode_hwc(content, image_size):
    return decode_crop(content, image_size).transpose(1, 2, 0).copy()


def decode_no_rgb(content, image_size):
    with Image.open(io.BytesIO(content)) as image:
        pixels = np.asarray(image.resize((image_size, image_size)), np.float32) / 255
    return ((pixels - MEAN) / STD).transpose(2, 0, 1).copy()


def spec_delegating(image_size):
    return loaders.image_transform_spec(image_size)


def spec_hard_coded_size(image_size):
    return spec_selected_fields(32)


@pytest.mark.parametrize("answer", [spec_selected_fields, spec_removed_fields])
def test_1_7_right(answer):
    assert verdict("1.7", answer) == PASSED


@pytest.mark.parametrize(
    "answer",
    [
        spec_with(decode_unnormalised),
        spec_with(decode_bgr),
        spec_with(decode_hwc, shape=lambda size: (size, size, 3)),
        spec_with(decode_crop, dtype=np.float64),
        spec_with(decode_crop, label_type=None),
        spec_with(decode_crop, keep_content=True),
        spec_with(decode_no_rgb),
        spec_hard_coded_size,
    ],
    ids=["unnormalised", "bgr", "hwc", "float64", "int32-labels", "keeps-content", "no-rgb", "hard-coded-size"],
)
def test_1_7_wrong(answer):
    assert verdict("1.7", answer) == "failed"


@pytest.mark.parametrize("answer", [spec_delegating, spec_with(loaders.decode_image)])
def test_1_7_delegating(answer):
    assert delegated("1.7", answer)


# --- 1.8 shard_loader ------------------------------------------------------------------------------------------


def shard_torch_loader(converter, spec, shard, shard_count, batch_size):
    return converter.make_torch_dataloader(
        batch_size=batch_size, num_epochs=1, cur_shard=shard, shard_count=shard_count, transform_spec=spec
    )


def shard_batched_loader(converter, spec, shard, shard_count, batch_size):
    return converter.make_torch_dataloader(
        transform_spec=spec,
        shard_count=shard_count,
        cur_shard=shard_count - 1 - shard,
        batch_size=batch_size,
        num_epochs=1,
        workers_count=1,
        data_loader_fn=BatchedDataLoader,
    )


def shard_unsharded(converter, spec, shard, shard_count, batch_size):
    return converter.make_torch_dataloader(batch_size=batch_size, num_epochs=1, transform_spec=spec)


def shard_forever(converter, spec, shard, shard_count, batch_size):
    return converter.make_torch_dataloader(
        batch_size=batch_size, cur_shard=shard, shard_count=shard_count, transform_spec=spec
    )


def shard_two_workers(converter, spec, shard, shard_count, batch_size):
    return shard_torch_loader(converter, spec, shard % 2, 2, batch_size)


def shard_fixed_batch(converter, spec, shard, shard_count, batch_size):
    return shard_torch_loader(converter, spec, shard, shard_count, 64)


def shard_closed_loader(converter, spec, shard, shard_count, batch_size):
    with shard_torch_loader(converter, spec, shard, shard_count, batch_size) as loader:
        return loader


def shard_own_spec(converter, spec, shard, shard_count, batch_size):
    """Ignores the spec it was given for one of its own."""
    columns = ["row_id", "label_index"]
    own = TransformSpec(lambda pdf: pdf[columns], selected_fields=columns)
    return converter.make_torch_dataloader(
        batch_size=batch_size, num_epochs=1, cur_shard=shard, shard_count=shard_count, transform_spec=own
    )


@contextmanager
def shard_read_all_and_keep_a_share(converter, spec, shard, shard_count, batch_size):
    """Reads every row on every worker and keeps every shard_count-th one: disjoint and covering, but not sharded."""
    with converter.make_torch_dataloader(batch_size=batch_size, num_epochs=1, transform_spec=spec) as loader:
        rows = [
            {key: batch[key][i] for key in batch}
            for batch in loader
            for i in range(len(batch["row_id"]))
            if int(batch["row_id"][i]) % shard_count == shard
        ]
    yield [
        {key: torch.stack([row[key] for row in rows[i : i + batch_size]]) for key in rows[0]}
        for i in range(0, len(rows), batch_size)
    ]


def shard_always_the_first(converter, spec, shard, shard_count, batch_size):
    return shard_torch_loader(converter, spec, 0, shard_count, batch_size)  # every worker reads shard 0


def shard_delegating(converter, spec, shard, shard_count, batch_size):
    return loaders.make_loader(converter, batch_size, 8, shard, shard_count)


@pytest.mark.parametrize("answer", [shard_torch_loader, shard_batched_loader])
def test_1_8_right(answer):
    assert verdict("1.8", answer) == PASSED


@pytest.mark.parametrize(
    "answer",
    [
        shard_unsharded,
        shard_always_the_first,
        shard_forever,
        shard_two_workers,
        shard_fixed_batch,
        shard_closed_loader,
        shard_own_spec,
        shard_read_all_and_keep_a_share,
    ],
)
def test_1_8_wrong(answer):
    assert verdict("1.8", answer) == "failed"


def test_1_8_delegating():
    assert delegated("1.8", shard_delegating)


# --- 1.3 restore_last_good -------------------------------------------------------------------------------------


def labels_at(table_path, version):
    return set(DeltaTable(table_path, version=version).to_pyarrow_table(columns=["label"])["label"].to_pylist())


def restore_from_history(table_path, class_names):
    table = DeltaTable(table_path)
    for commit in table.history():
        if set(class_names) <= labels_at(table_path, commit["version"]):
            if commit["version"] != table.version():
                table.restore(commit["version"])
            return commit["version"]
    raise ValueError("no good version")


def restore_even_the_current_version(table_path, class_names):
    """Restores the newest version too when it is good: delta-rs refuses that."""
    table = DeltaTable(table_path)
    for commit in table.history():
        if set(class_names) <= labels_at(table_path, commit["version"]):
            table.restore(commit["version"])
            return commit["version"]
    raise ValueError("no good version")


def restore_by_overwrite(table_path, class_names):
    newest = DeltaTable(table_path).version()
    good = next(
        v for v in range(newest, -1, -1) if len(labels_at(table_path, v) & set(class_names)) == len(set(class_names))
    )
    old = DeltaTable(table_path)
    old.load_as_version(good)
    write_deltalake(table_path, old.to_pyarrow_table(), mode="overwrite")
    return np.int64(good)


def restore_previous(table_path, class_names):
    table = DeltaTable(table_path)
    version = table.version() - 1
    table.restore(version)
    return version


def restore_oldest_good(table_path, class_names):
    table = DeltaTable(table_path)
    version = next(v for v in range(table.version() + 1) if set(class_names) <= labels_at(table_path, v))
    table.restore(version)
    return version


def restore_read_only(table_path, class_names):
    newest = DeltaTable(table_path).version()
    return next(v for v in range(newest, -1, -1) if set(class_names) <= labels_at(table_path, v))


def restore_by_append(table_path, class_names):
    version = restore_read_only(table_path, class_names)
    write_deltalake(table_path, DeltaTable(table_path, version=version).to_pyarrow_table(), mode="append")
    return version


def restore_delegating(table_path, class_names):
    from helpers.spark import get_spark

    spark = get_spark()
    version = int(lake.table_history(spark, table_path)["version"].iloc[1])
    lake.write_table(spark, lake.read_table(spark, table_path, version), table_path)
    return version


def restore_by_new_table(table_path, class_names):
    version = restore_read_only(table_path, class_names)
    good = DeltaTable(table_path, version=version).to_pyarrow_table()
    shutil.rmtree(table_path)
    write_deltalake(table_path, good)  # the right rows, and the history gone
    return version


def restore_then_an_empty_delete(table_path, class_names):
    version = restore_from_history(table_path, class_names)
    DeltaTable(table_path).delete("label = ''")  # one more commit, that changes nothing: still right
    return version


def restore_hard_coded(table_path, class_names):
    DeltaTable(table_path).restore(1)
    return 1


@pytest.mark.parametrize("answer", [restore_from_history, restore_by_overwrite, restore_then_an_empty_delete])
def test_1_3_right(answer):
    assert verdict("1.3", answer) == PASSED


@pytest.mark.parametrize(
    "answer",
    [
        restore_previous,
        restore_oldest_good,
        restore_read_only,
        restore_by_append,
        restore_hard_coded,
        restore_even_the_current_version,
        restore_by_new_table,
    ],
)
def test_1_3_wrong(answer):
    assert verdict("1.3", answer) == "failed"


def test_1_3_restoring_the_current_version_gets_the_hint_for_delta_rs_refusal():
    status, message = _run("1.3", restore_even_the_current_version)
    assert status == "failed"
    assert " raised DeltaError: " in message and message.endswith(
        "when the newest version already holds every class there is nothing to restore (delta-rs refuses to "
        "restore the current version): return its number"
    )


def test_1_3_delegating():
    assert delegated("1.3", restore_delegating)


# --- 1.6 to_converter ------------------------------------------------------------------------------------------


def converter_select_repartition(df, num_devices):
    return make_spark_converter(df.select(TRAIN_COLUMNS).repartition(2 * num_devices))


def converter_other_order(df, num_devices):
    training = df.select("label_index", "content", "row_id").repartition(num_devices * 2)
    return make_spark_converter(training, compression_codec="uncompressed")


def converter_all_columns(df, num_devices):
    return make_spark_converter(df.repartition(2 * num_devices))


def converter_not_repartitioned(df, num_devices):
    return make_spark_converter(df.select(TRAIN_COLUMNS))


def converter_constant_files(df, num_devices):
    return make_spark_converter(df.select(TRAIN_COLUMNS).repartition(4))


def converter_lesson_s_two_files(df, num_devices):
    return make_spark_converter(df.select(TRAIN_COLUMNS).repartition(2))  # the lesson's 1 device, whatever is asked


def converter_sampled(df, num_devices):
    return make_spark_converter(df.select(TRAIN_COLUMNS).limit(100).repartition(2 * num_devices))


def converter_dataframe(df, num_devices):
    return df.select(TRAIN_COLUMNS).repartition(2 * num_devices)


def converter_delegating(df, num_devices):
    return loaders.prepare_data(None, num_devices).train_converter


@pytest.mark.parametrize("answer", [converter_select_repartition, converter_other_order])
def test_1_6_right(answer):
    assert verdict("1.6", answer) == PASSED


@pytest.mark.parametrize(
    "answer",
    [
        converter_all_columns,
        converter_not_repartitioned,
        converter_constant_files,
        converter_dataframe,
        converter_lesson_s_two_files,
        converter_sampled,
    ],
)
def test_1_6_wrong(answer):
    assert verdict("1.6", answer) == "failed"


def test_1_6_delegating():
    assert delegated("1.6", converter_delegating)


# --- 1.9 FixedStepBatches (stretch) ----------------------------------------------------------------------------


class StepsFromOneReader:
    """The lesson's answer: one reader (num_epochs=None) opened on first use, ``steps`` batches per iteration."""

    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1):
        self.steps_per_epoch = steps_per_epoch
        self._context = converter.make_torch_dataloader(
            batch_size=batch_size, num_epochs=None, transform_spec=spec, cur_shard=cur_shard, shard_count=shard_count
        )
        self._batches = None

    def __len__(self):
        return self.steps_per_epoch

    def __iter__(self):
        if self._batches is None:
            self._batches = iter(self._context.__enter__())
        for _ in range(self.steps_per_epoch):
            yield next(self._batches)

    def close(self):
        if self._batches is not None:
            self._context.__exit__(None, None, None)
        self._batches = None


class StepsWithIslice:
    """Another way: the reader opens in __init__, each epoch is an islice of one iterator."""

    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1):
        self.steps = steps_per_epoch
        self.context = converter.make_torch_dataloader(
            batch_size=batch_size,
            num_epochs=None,
            transform_spec=spec,
            cur_shard=cur_shard,
            shard_count=shard_count,
            workers_count=1,
            data_loader_fn=BatchedDataLoader,
        )
        self.iterator = iter(self.context.__enter__())

    def __len__(self):
        return self.steps

    def __iter__(self):
        return itertools.islice(self.iterator, self.steps)

    def close(self):
        self.context.__exit__(None, None, None)


class StepsFreshEachEpoch(StepsFromOneReader):
    """Wrong: a new one-pass reader every epoch, so every epoch re-reads the start of the shard."""

    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1):
        self.steps_per_epoch = steps_per_epoch
        self.args = dict(
            batch_size=batch_size, num_epochs=1, transform_spec=spec, cur_shard=cur_shard, shard_count=shard_count
        )
        self.converter = converter
        self._batches = None

    def __iter__(self):
        with self.converter.make_torch_dataloader(**self.args) as loader:
            yield from itertools.islice(loader, self.steps_per_epoch)


class StepsOnePass(StepsFromOneReader):
    """Wrong: one reader, but of a single pass (num_epochs=1): it runs dry in the second pass."""

    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1):
        super().__init__(converter, spec, batch_size, steps_per_epoch, cur_shard, shard_count)
        self._context = converter.make_torch_dataloader(
            batch_size=batch_size, num_epochs=1, transform_spec=spec, cur_shard=cur_shard, shard_count=shard_count
        )

    def __iter__(self):
        if self._batches is None:
            self._batches = iter(self._context.__enter__())
        yield from itertools.islice(self._batches, self.steps_per_epoch)


class StepsUnsharded(StepsFromOneReader):
    """Wrong: ignores cur_shard and shard_count."""

    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1):
        super().__init__(converter, spec, batch_size, steps_per_epoch)


class StepsHardCodedLength(StepsFromOneReader):
    """Wrong: reports a fixed number of steps to Lightning."""

    def __len__(self):
        return 3


class StepsEndless(StepsFromOneReader):
    """Wrong: every iteration goes on until the reader stops, which it never does (num_epochs=None)."""

    def __iter__(self):
        if self._batches is None:
            self._batches = iter(self._context.__enter__())
        yield from self._batches


class StepsDelegating(loaders.PetastormBatches):
    """Delegating: the course's helper does the work."""

    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1):
        super().__init__(converter, batch_size, 8, cur_shard, shard_count, steps_per_epoch)


@pytest.mark.parametrize("answer", [StepsFromOneReader, StepsWithIslice])
def test_1_9_right(answer):
    assert verdict("1.9", answer) == PASSED


@pytest.mark.parametrize(
    "answer", [StepsFreshEachEpoch, StepsOnePass, StepsUnsharded, StepsHardCodedLength, StepsEndless]
)
def test_1_9_wrong(answer):
    assert verdict("1.9", answer) == "failed"


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # no "Exception ignored in __del__"
def test_1_9_delegating():
    assert delegated("1.9", StepsDelegating)
    gc.collect()


# --- every check: unanswered is "not attempted" ----------------------------------------------------------------


def stub(*args): ...


class StubBatches:
    def __init__(self, converter, spec, batch_size, steps_per_epoch, cur_shard=0, shard_count=1): ...

    def __iter__(self): ...

    def __len__(self): ...

    def close(self): ...


@pytest.mark.parametrize("exercise", ["1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8"])
def test_stubs_are_not_attempted(exercise):
    assert _run(exercise, stub)[0] == "not attempted"
    assert _run(exercise, ...)[0] == "not attempted"


def test_stub_class_is_not_attempted():
    assert _run("1.9", StubBatches)[0] == "not attempted"


def test_verdicts_are_the_same_when_run_again():
    for exercise, answer in (("1.8", shard_torch_loader), ("1.3", restore_from_history), ("1.9", StepsFromOneReader)):
        assert [verdict(exercise, answer) for _ in range(2)] == [PASSED, PASSED]
