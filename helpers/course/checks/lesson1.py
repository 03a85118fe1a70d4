"""Checks for lesson 1: from image files to a Delta lake to a PyTorch DataLoader with Petastorm.

Each check runs the student's code on inputs it generates itself (other class names, counts, fractions, device
counts, data sizes, shard counts and batch sizes, from a fixed seed so the verdict is the same in every run) and
tests what the code does, not how it is written. An answer that calls the course helper implementing the exercise
fails (``own_work``). The Petastorm checks share one small converter of generated images (solid colours, so any
resize gives known pixels), made once per process.
"""

from __future__ import annotations

import functools
import io
import itertools
import math
import random
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from helpers import loaders
from helpers.course.checks import CheckFailed, is_whole, register
from helpers.course.checks.function_check import Collected, FunctionCheck, Returns
from helpers.workdir import work_path

__all__ = [
    "LOADER_HINTS",
    "PIXEL_TOLERANCE",
    "SAMPLE_FILES",
    "SAMPLE_ROWS",
    "SAMPLE_STYLES",
    "SEED",
    "SYLLABLES",
    "converter_for_devices",
    "disjoint_complete_shards",
    "epochs_of_fixed_steps",
    "label_from_path",
    "own_transform_spec",
    "repartition_rule",
    "restore_after_bad_write",
    "stable_label_indices",
    "validation_count_rule",
]

SEED = 1
SYLLABLES = ("ro", "sa", "li", "ta", "mu", "ne", "ki", "po", "da", "fe", "zu", "be")
# Sample images: label_index k is a solid colour in one file format and colour mode, at random sizes.
SAMPLE_STYLES = (
    ((200, 30, 90), "RGB", "PNG"),
    ((10, 250, 128), "RGB", "JPEG"),
    ((77, 77, 77), "L", "PNG"),
    ((5, 100, 220), "RGBA", "PNG"),
    ((240, 160, 10), "RGB", "PNG"),
)
SAMPLE_ROWS = 101
SAMPLE_FILES = 8
PIXEL_TOLERANCE = 0.05  # normalised units: about 3 of 255 levels (JPEG)


def _spark():
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        raise CheckFailed("no active SparkSession: run the notebook's set-up cells first")
    return session


def _class_names(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct made-up lowercase class names (no digits, so every way of sorting agrees)."""
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) + rng.choice(("", "s", "_x")))
    return sorted(names)


def _draw_paths(rng: random.Random) -> tuple[tuple[tuple[str, str], ...]]:
    """``((path, class name), ...)``: 2 image files in each of 6 made-up class folders, under roots of several URI
    schemes, with dots in a folder and upper-case extensions."""
    roots = ("file:/data/flowers", "dbfs:/mnt/lake/raw", "s3a://bucket/images/2024", "file:/tmp/a.b/c")
    return (
        tuple(
            (f"{rng.choice(roots)}/{name}/{rng.randint(1, 9999)}{rng.choice(('.jpg', '.png', '.JPEG'))}", name)
            for name in _class_names(rng, 6)
            for _ in range(2)
        ),
    )


def _labels_by_path(out, case: tuple):
    """The label a returned DataFrame gives each path; anything else as it is (the judge names it)."""
    if not {"path", "label"} <= set(getattr(out, "columns", None) or ()):
        return out
    return Collected((row["path"], row["label"]) for row in out.select("path", "label").collect())


def _label_problem(case: tuple[tuple[tuple[str, str], ...]], got: object, _given: tuple) -> str | None:
    """What is wrong with the labels the answer gave the case's paths, or None."""
    if not isinstance(got, Collected):
        what = "a DataFrame without a 'path' and a 'label' column" if hasattr(got, "columns") else type(got).__name__
        return f"returned {what}: return df with a new column named 'label' (df.withColumn('label', ...))"
    wrong = next(((path, name) for path, name in case[0] if got.get(path) != name), None)
    if wrong is None:
        return None
    return f"gave {wrong[0]} the label {got.get(wrong[0])!r}, expected {wrong[1]!r}: take the name of its folder"


#: ``label_column(df)``: a ``label`` column holding the name of each image file's folder, on DataFrames of paths under
#: 3 drawn sets of class folders; reading the images with ``lake`` is delegating
label_from_path = register("1.1")(
    FunctionCheck(
        "1.1",
        answer="label_column",
        fixed=[],
        draw=_draw_paths,
        draws=3,
        arguments=lambda case: (_spark().createDataFrame([(p, len(p)) for p, _ in case[0]], ["path", "length"]),),
        collect=_labels_by_path,
        judge=_label_problem,
        show=lambda case: f"<DataFrame of {len(case[0])} image paths>",
        forbid=("helpers.lake:read_images", "helpers.lake:ingest_images"),
        hint="add a column named 'label': the name of the folder the file is in",
        passed="labels come from the class folder names, on {n} DataFrames of paths",
    )
)


def _sorted_indices(labels: list[str]) -> dict[str, int]:
    """The right mapping: each distinct name to its position among the sorted distinct names."""
    return {name: index for index, name in enumerate(sorted(set(labels)))}


def _labels(rng: random.Random) -> tuple[list[str]]:
    """The labels of a made-up image folder read in some order: 2 to 11 classes, each seen at least once."""
    names = _class_names(rng, rng.randint(2, 11))
    labels = [rng.choice(names) for _ in range(2 * len(names))] + names
    rng.shuffle(labels)
    return (labels,)


def _indices_hint(case: tuple[list[str]], got: object) -> str:
    (labels,) = case
    first_seen = {name: index for index, name in enumerate(dict.fromkeys(labels))}
    if _whole_values(got) and _as_ints(got) == first_seen:
        return "the index must not depend on the order the files were read in: sort the names"
    return "sort the distinct names, then number them from 0"


def _whole_values(got: object) -> bool:
    return isinstance(got, Mapping) and all(is_whole(index) for index in got.values())


def _as_ints(got: Mapping) -> dict:
    """A mapping of whole-number indices (numpy integers, 2.0) as plain ints, to compare with a reference."""
    return {name: int(index) for name, index in got.items()}


#: ``label_indices(labels)``: each distinct class name to its position among the sorted names, on the text's example,
#: one class read last, and 10 drawn folders of 2 to 11 made-up classes read in a shuffled order
stable_label_indices = register("1.2")(
    FunctionCheck(
        "1.2",
        answer="label_indices",
        fixed=[(["tulips", "daisy", "tulips"],), (["roses", "roses", "daisy", "roses"],)],
        draw=_labels,
        draws=10,
        reference=_sorted_indices,
        returns=Returns(
            "a dict from class name to a whole-number index",
            _whole_values,
            lambda got, expected: _as_ints(got) == expected,
        ),
        hint=_indices_hint,
        passed="indices follow the sorted class names on {n} folders, so they are the same in every run",
    )
)


def _right_counts(n: int, val_fraction: float) -> set[int]:
    """The right validation counts: ``n * val_fraction`` rounded (either way at a half), then kept in 1..n-1."""
    exact = n * val_fraction
    nearest = {math.floor(exact), math.ceil(exact)}
    rounded = {r for r in nearest if abs(r - exact) <= 0.5 + 1e-9} or nearest
    return {min(max(r, 1), n - 1) for r in rounded}


def _count_hint(case: tuple[int, float], got: object) -> str:
    n, _ = case
    if isinstance(got, (int, float)) and not 1 <= got <= n - 1:
        return "keep at least 1 and at most n - 1 images in validation"
    return "round n * val_fraction to the nearest whole image"


#: ``validation_count(n, val_fraction)``: images of one class that go to validation, on the text's examples, the
#: edge cases and 12 drawn ones; calling ``loaders.stratified_split`` is delegating
validation_count_rule = register("1.4")(
    FunctionCheck(
        "1.4",
        answer="validation_count",
        fixed=[(100, 0.2), (10, 0.25), (30, 0.05), (9, 0.3), (2, 0.1), (3, 0.9), (10, 0.01), (5, 0.95), (1797, 0.2)],
        draw=lambda rng: (rng.randint(3, 5000), round(rng.uniform(0.02, 0.6), 3)),
        draws=12,
        reference=_right_counts,
        forbid=("helpers.loaders:stratified_split",),
        hint=_count_hint,
        passed="right on {n} class sizes and fractions: both splits get every class",
    )
)


def _partitioned(case: tuple[int, int, int]) -> tuple[object, int]:
    """A DataFrame of ``rows`` image rows in ``partitions`` partitions, and the device count: the answer's call."""
    from pyspark.sql import functions as F

    rows, partitions, devices = case
    label = (F.col("id") % 7).cast("int")
    df = _spark().range(rows, numPartitions=partitions)
    return df.select(
        "id", F.format_string("file:/lake/c%d/%d.png", label, "id").alias("path"), label.alias("label_index")
    ), devices


def _ids_by_partition(out, case: tuple):
    """The row ids each partition of a returned DataFrame holds; anything else as it is (the judge names it)."""
    from pyspark.sql import functions as F

    if not hasattr(out, "select"):
        return out
    ids: dict[int, list[int]] = Collected()
    for row in out.select(F.spark_partition_id().alias("p"), "id").collect():
        ids.setdefault(row["p"], []).append(row["id"])
    return ids


def _partitions_problem(case: tuple[int, int, int], got: object, _given: tuple) -> str | None:
    """What is wrong with how the answer spread the case's rows, or None."""
    rows, _, devices = case
    if not isinstance(got, Collected):
        return f"returned {type(got).__name__}: return the DataFrame, repartitioned"
    if len(got) != 2 * devices:
        return (
            f"put the rows in {len(got)} partition(s), expected {2 * devices} that all hold rows: "
            "df.repartition(n) spreads them evenly"
        )
    if sorted(i for ids in got.values() for i in ids) != list(range(rows)):
        return "lost or repeated rows: repartitioning must keep every row exactly once"
    return None


#: ``repartition_for_devices(df, num_devices)``: 2 non-empty partitions per device, every row once, for 1, 3 and 40
#: devices; ``loaders.partitions_for`` and ``loaders.prepare_data`` would do it for the answer
repartition_rule = register("1.5")(
    FunctionCheck(
        "1.5",
        answer="repartition_for_devices",
        fixed=[(150, 1, 1), (500, 64, 3), (2000, 1, 40)],
        arguments=_partitioned,
        collect=_ids_by_partition,
        judge=_partitions_problem,
        show=lambda case: f"<DataFrame of {case[0]} rows in {case[1]} partition(s)>, {case[2]}",
        forbid=("helpers.loaders:partitions_for", "helpers.loaders:prepare_data"),
        hint="df.repartition(2 * num_devices): 2 partitions per device, every row once",
        passed="2 non-empty partitions per device, for 1 to 40 devices",
    )
)


# --- Petastorm: a small converter of generated images, shared by the checks below -------------------------------


def _encoded_image(style: tuple, size: tuple[int, int]) -> bytes:
    from PIL import Image

    colour, mode, fmt = style
    fill = colour[0] if mode == "L" else (*colour, 255) if mode == "RGBA" else colour
    buffer = io.BytesIO()
    Image.new(mode, size, fill).save(buffer, format=fmt)
    return buffer.getvalue()


@functools.lru_cache(maxsize=1)
def _sample_rows() -> tuple[tuple, ...]:
    """Lake-like rows ``(row_id, content, label_index, path, label, width, height)`` of generated images."""
    rng = random.Random(SEED)
    ids = rng.sample(range(1, 2**40), SAMPLE_ROWS)
    rows = []
    for row_id in ids:
        label_index = rng.randrange(len(SAMPLE_STYLES))
        size = (rng.randint(5, 40), rng.randint(5, 40))
        label = f"class_{label_index}"
        rows.append(
            (
                row_id,
                _encoded_image(SAMPLE_STYLES[label_index], size),
                label_index,
                f"file:/lake/{label}/{row_id}.img",
                label,
                *size,
            )
        )
    return tuple(rows)


def _sample_df():
    """The sample rows as a Spark DataFrame with the lake's columns and ``row_id``."""
    schema = "row_id long, content binary, label_index int, path string, label string, width int, height int"
    return _spark().createDataFrame(list(_sample_rows()), schema)


@functools.lru_cache(maxsize=1)
def _sample_converter():
    """A Petastorm converter of the sample rows (``loaders.TRAIN_COLUMNS``) in ``SAMPLE_FILES`` Parquet files."""
    from petastorm.spark import make_spark_converter

    return make_spark_converter(_sample_df().select(loaders.TRAIN_COLUMNS).repartition(SAMPLE_FILES))


def _ids_spec():
    """A TransformSpec that keeps only ``row_id`` and ``label_index`` (no decoding: the shard checks need ids) and
    adds ``spec_mark`` (``2 * row_id + 1``), which only this spec makes: a loader that ignores it has none."""
    import numpy as np
    from petastorm import TransformSpec

    columns = ["row_id", "label_index"]
    return TransformSpec(
        lambda pdf: pdf[columns].assign(spec_mark=pdf["row_id"] * 2 + 1),
        edit_fields=[("spec_mark", np.int64, (), False)],
        selected_fields=[*columns, "spec_mark"],
    )


def _expected_pixels(label_index: int):
    """The normalised value of each channel of a sample image of class ``label_index``."""
    import torch

    colour = torch.tensor(SAMPLE_STYLES[label_index][0], dtype=torch.float32) / 255
    return (colour - torch.tensor(loaders.IMAGENET_MEAN)) / torch.tensor(loaders.IMAGENET_STD)


def _image_batch_problem(batch: Mapping, image_size: int, batch_size: int) -> str | None:
    """What is wrong with ``batch``: float32 CHW images of the sample colours, ImageNet-normalised, and int64 labels
    are right (None)."""
    import torch

    if not {"features", "label_index"} <= set(batch):
        return f"gave batches that hold {sorted(batch)}: the transform must add 'features' and keep 'label_index'"
    features, labels = batch["features"], batch["label_index"]
    expected_shape = (batch_size, 3, image_size, image_size)
    if tuple(features.shape) != expected_shape:
        return (
            f"gave features of shape {tuple(features.shape)}, expected {expected_shape}: RGB, image_size x "
            "image_size, channels first (CHW), and edit_fields to match"
        )
    if features.dtype != torch.float32 or labels.dtype != torch.int64:
        return (
            f"gave dtypes {features.dtype} / {labels.dtype}, expected torch.float32 / torch.int64: declare them in "
            "edit_fields (np.float32, np.int64) and convert in the function"
        )
    expected = torch.stack([_expected_pixels(int(k)) for k in labels])[:, :, None, None].expand(expected_shape)
    error = float((features - expected).abs().max())
    if error > PIXEL_TOLERANCE:
        return (
            f"gave pixel values off by up to {error:.2f} on solid-colour test images: convert to RGB, scale to "
            "[0, 1], then subtract IMAGENET_MEAN and divide by IMAGENET_STD per channel (R, G, B)"
        )
    return None


LOADER_HINTS = {
    "string or object": "a batch still holds the encoded bytes: leave 'content' out (selected_fields)",
    "row major": "features must be C-contiguous arrays: .copy() (or np.ascontiguousarray) after the transpose",
    "do not match required schema": "the function must return exactly the fields the spec declares "
    "(edit_fields plus selected_fields)",
    "broadcast": "every image must come out with 3 channels: image.convert('RGB') (some are grey or RGBA)",
    "has stopped": "return the context manager itself (converter.make_torch_dataloader(...)), not a loader "
    "from inside a with block",
}


def _loader_fix(error: object) -> str | None:
    """The fix for an error Petastorm raised while reading batches through the answer's spec, if it is a known one."""
    return next((hint for text, hint in LOADER_HINTS.items() if text in str(error)), None)


def _batch_through(spec: object, case: tuple[int, int]):
    """The first batch of ``case[1]`` sample rows read through ``spec`` if it is a TransformSpec; else ``spec``."""
    from petastorm import TransformSpec

    if not isinstance(spec, TransformSpec):
        return spec
    with _sample_converter().make_torch_dataloader(
        batch_size=case[1], num_epochs=1, transform_spec=spec, workers_count=2
    ) as loader:
        return Collected(next(iter(loader)))


def _spec_call(case: tuple[int, int]) -> tuple[int]:
    """The answer's call for ``case``: its image size; the sample converter is made first, outside the answer's
    work (a failure to make it is the check's, not the learner's)."""
    _sample_converter()
    return (case[0],)


def _spec_problem(case: tuple[int, int], got: object, _given: tuple) -> str | None:
    if not isinstance(got, Collected):
        return f"returned a {type(got).__name__}: return a petastorm TransformSpec"
    return _image_batch_problem(got, *case)


#: ``transform_spec(image_size)``: a Petastorm TransformSpec that decodes ``content`` into normalised tensors, read
#: (inside the tripwire: the spec runs there) through the sample converter of solid-colour images at two image and
#: batch sizes
own_transform_spec = register("1.7")(
    FunctionCheck(
        "1.7",
        answer="transform_spec",
        fixed=[(12, 6), (27, 16)],
        arguments=_spec_call,
        collect=_batch_through,
        judge=_spec_problem,
        show=lambda case: str(case[0]),
        forbid=("helpers.loaders:image_transform_spec", "helpers.loaders:decode_image", "helpers.loaders:make_loader"),
        hint=lambda case, got: _loader_fix(got)
        or "decode 'content' to RGB at image_size, float32 CHW and ImageNet-normalised, 'label_index' as int64",
        passed="RGB, resized, float32 CHW, ImageNet-normalised, int64 labels, at any image size",
    )
)


def _shard_calls(case: tuple[int, int]) -> list[tuple]:
    """The calls for every shard of ``case`` (``shard_count, batch_size``), each with a converter of its own that
    records the loaders opened through it."""
    shard_count, batch_size = case
    converter = _sample_converter()
    return [
        (_CountingConverter(converter), _ids_spec(), shard, shard_count, batch_size) for shard in range(shard_count)
    ]


def _read_shard(returned: Any, case: tuple[int, int]) -> Any:
    """The batches of a returned loader context, opened with ``with`` (at most a little more than the whole data
    set): each batch's row ``ids``, and whether every batch carries the mark only the given spec makes
    (``marked``); anything that cannot be opened as it is (the judge names it)."""
    if not hasattr(returned, "__enter__"):
        return returned
    with returned as loader:
        read = list(itertools.islice(loader, SAMPLE_ROWS // case[1] + 2))
    return Collected(
        ids=[batch["row_id"].tolist() for batch in read],
        marked=all("spec_mark" in batch and (batch["spec_mark"] == batch["row_id"] * 2 + 1).all() for batch in read),
    )


def _one_shard_problem(read: Any, converter: _CountingConverter, shard_count: int, batch_size: int) -> str | None:
    """What is wrong with one shard's batches, or None."""
    if not isinstance(read, Collected):
        return (
            f"returned a {type(read).__name__}: return the loader's context manager "
            "(converter.make_torch_dataloader(...))"
        )
    if not read["marked"]:
        return "gave batches that are not what the given spec makes: pass transform_spec=spec to the loader"
    if converter.calls and not any(call.get("shard_count") == shard_count for call in converter.calls):
        return (
            f"opened its loader with shard_count={converter.calls[-1].get('shard_count')!r}, expected {shard_count}: "
            "pass cur_shard=shard and shard_count=shard_count to make_torch_dataloader, so that Petastorm reads only "
            "this worker's row groups"
        )
    sizes = [len(ids) for ids in read["ids"]]
    if any(size != batch_size for size in sizes[:-1]) or (sizes and sizes[-1] > batch_size):
        return f"gave batch sizes {sizes} for batch_size={batch_size}: pass batch_size to the loader"
    ids = [row_id for batch in read["ids"] for row_id in batch]
    if len(set(ids)) != len(ids):
        return "yields rows more than once: read one pass (num_epochs=1)"
    return None


def _shards_problem(case: tuple[int, int], reads: list[Any], given: list[tuple]) -> str | None:
    """What is wrong with the shards of ``case``: each on its own, then together (non-empty, disjoint, covering)."""
    shard_count, batch_size = case
    for shard, (read, call) in enumerate(zip(reads, given)):
        problem = _one_shard_problem(read, call[0], shard_count, batch_size)
        if problem:
            return f"for shard {shard} {problem}"
    shards = [{row_id for batch in read["ids"] for row_id in batch} for read in reads]
    sizes, every_id = [len(ids) for ids in shards], {row[0] for row in _sample_rows()}
    if not all(sizes):
        return f"gave shards of {sizes} rows: each worker must get rows (cur_shard, shard_count)"
    if sum(sizes) != len(set().union(*shards)):
        return "gave shards that overlap: pass cur_shard=shard and shard_count=shard_count"
    if set().union(*shards) != every_id:
        return f"gave shards that hold {sum(sizes)} of {len(every_id)} rows: together they must read every row"
    return None


#: ``shard_loader(converter, spec, shard, shard_count, batch_size)``: a loader over one worker's shard, called for
#: every shard of 2, 3 and 5 on the sample converter, and the shards of one count judged together
disjoint_complete_shards = register("1.8")(
    FunctionCheck(
        "1.8",
        answer="shard_loader",
        fixed=[(2, 7), (3, 16), (5, 4)],
        calls=_shard_calls,
        collect=_read_shard,
        judge=_shards_problem,
        show=lambda case: f"<converter of {SAMPLE_ROWS} rows>, <spec>, <each shard>, {case[0]}, {case[1]}",
        forbid=("helpers.loaders:make_loader", "helpers.loaders:PetastormBatches", "helpers.loaders:prepare_data"),
        hint=lambda case, got: _loader_fix(got)
        or "return converter.make_torch_dataloader(...) with the spec, the batch size and this shard",
        passed="disjoint shards that cover every row, for 2, 3 and 5 workers, batches of the size asked for",
    )
)


# --- Delta time travel --------------------------------------------------------------------------------------------


def _rows(rng: random.Random, classes: list[str], count: int, tag: str) -> list[tuple[str, str]]:
    """``count`` rows ``(path, label)`` that hold every one of ``classes``."""
    labels = list(classes) + [rng.choice(classes) for _ in range(count - len(classes))]
    return [(f"/lake/{tag}/{label}/{i}.png", label) for i, label in enumerate(labels)]


def _without(rows: list[tuple[str, str]], name: str) -> list[tuple[str, str]]:
    """``rows`` less those of class ``name`` (what a bad cleaning job writes)."""
    return [row for row in rows if row[1] != name]


def _damaged_histories(rng: random.Random) -> list[tuple[list[tuple[str, list]], int]]:
    """Histories of writes ``(mode, rows)``, each with the last version that holds every class.

    Good, good append, bad overwrite, bad append (1); good, bad (0); good, bad, a smaller fix, bad again (2);
    good, bad, a fix that is the newest version (2: nothing to restore).
    """
    histories = []
    for shape in range(4):
        names = _class_names(rng, rng.randint(3, 5))
        dropped, other = rng.sample(names, 2)
        good = _rows(rng, names, rng.randint(30, 40), f"{shape}-good")
        if shape == 0:
            more = _rows(rng, names, rng.randint(5, 15), "more")
            tail = _rows(rng, [n for n in names if n != dropped], rng.randint(4, 9), "tail")
            writes = [
                ("overwrite", good),
                ("append", more),
                ("overwrite", _without(good + more, dropped)),
                ("append", tail),
            ]
            histories.append((writes, 1))
        elif shape == 1:
            histories.append(([("overwrite", good), ("overwrite", _without(good, dropped))], 0))
        else:
            fixed = _rows(rng, names, rng.randint(8, 15), "fix")
            writes = [("overwrite", good), ("overwrite", _without(good, dropped)), ("overwrite", fixed)]
            if shape == 2:
                writes.append(("overwrite", _without(fixed, other)))
            histories.append((writes, 2))
    return histories


def _write_history(path: str, writes) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    for mode, rows in writes:
        table = pa.table({"path": [r[0] for r in rows], "label": [r[1] for r in rows]})
        write_deltalake(path, table, mode=mode)


def _paths(path: str, version: int | None = None) -> list[str]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(path, version=version).to_pyarrow_table(columns=["path"])["path"].to_pylist())


def _written(writes, version: int) -> list[str]:
    """The paths version ``version`` of a table holds after ``writes``, replayed (overwrite replaces, append adds)."""
    rows: list[str] = []
    for mode, written in writes[: version + 1]:
        rows = (rows if mode == "append" else []) + [path for path, _ in written]
    return sorted(rows)


def _histories() -> list[tuple[list[tuple[str, list]], int, list[str]]]:
    """``(writes, last good version, class names in a shuffled order)``: the four histories 1.3 is checked on."""
    rng = random.Random(SEED)
    histories = _damaged_histories(rng)
    return [
        (writes, good, sorted({label for _, label in writes[0][1]}, key=lambda _: rng.random()))
        for writes, good in histories
    ]


def _damaged_table(case: tuple) -> tuple[str, list[str]]:
    """The case's history written to a new Delta table under the work directory: ``(path, class names)``."""
    folder = work_path("checks")
    folder.mkdir(parents=True, exist_ok=True)
    path = tempfile.mkdtemp(prefix="check-1.3-", dir=folder)
    _write_history(path, case[0])
    return path, list(case[2])


def _restore_hint(case: tuple, got: object) -> str:
    """The hint; for delta-rs's refusal to restore the current version, where the newest version is good, why."""
    writes, good_version, _ = case
    if good_version == len(writes) - 1 and "should be less the" in str(got):
        return (
            "when the newest version already holds every class there is nothing to restore (delta-rs refuses to "
            "restore the current version): return its number"
        )
    return "look through the history from the newest version down, restore the last one with every class"


def _restore_problem(case: tuple, got: object, given: tuple[str, list[str]]) -> str | None:
    """What is wrong with the table at ``given``'s path after the answer, and with the version it returned."""
    from deltalake import DeltaTable

    writes, good_version, classes = case
    last = len(writes) - 1
    try:
        version = DeltaTable(given[0]).version()
    except Exception:  # noqa: BLE001 - whatever delta-rs raises for a table that is gone
        return "left no Delta table at table_path: restore the table in place"
    if version <= last and good_version < last:
        return (
            "made no new version: restore the good version as a new commit (DeltaTable.restore, or write_deltalake "
            "with mode='overwrite')"
        )
    if _paths(given[0]) != _written(writes, good_version):
        return (
            f"left a table that does not hold exactly the rows of version {good_version}, the last with all "
            f"{len(classes)} classes: look through the history from the newest version down"
        )
    if _paths(given[0], last) != _written(writes, last):
        return "changed the versions in the history: they must stay as they were, restore with a new commit"
    if not is_whole(got) or int(got) != good_version:
        return f"returned {got!r}, but restored version {good_version}: return the number of the version restored"
    return None


#: ``restore_last_good(table_path, class_names)``: the last version with every class made current again, as a new
#: commit, on four Delta tables written for the check (in one, the newest version is good); the lake's helpers
#: would do it for the answer
restore_after_bad_write = register("1.3")(
    FunctionCheck(
        "1.3",
        answer="restore_last_good",
        fixed=_histories(),
        arguments=_damaged_table,
        cleanup=lambda case, given: shutil.rmtree(given[0], ignore_errors=True),
        judge=_restore_problem,
        show=lambda case: f"<Delta table after {len(case[0])} writes>, {case[2]}",
        forbid=(
            "helpers.lake:read_table",
            "helpers.lake:write_table",
            "helpers.lake:table_history",
            "helpers.lake:ingest_images",
        ),
        hint=_restore_hint,
        passed="finds the last good version in the history and makes it current, keeping the history ({n} tables)",
    )
)


def _converter_problem(case: tuple[int], converter: object, _given: tuple) -> str | None:
    """What is wrong with the converter made for ``case``'s device count: every row, the training columns only, in
    2 Parquet files per device; None if nothing."""
    import pyarrow.parquet as pq
    from petastorm.spark import SparkDatasetConverter

    (devices,) = case
    if not isinstance(converter, SparkDatasetConverter):
        return f"returned a {type(converter).__name__}: return the converter from make_spark_converter"
    if len(converter) != SAMPLE_ROWS:
        return f"holds {len(converter)} of {SAMPLE_ROWS} rows: convert the whole df"
    files = converter.file_urls
    if len(files) != 2 * devices:
        return (
            f"wrote {len(files)} Parquet files, expected {2 * devices}: repartition to 2 per device before converting"
        )
    columns = pq.read_schema(urlparse(files[0]).path).names
    if sorted(columns) != sorted(loaders.TRAIN_COLUMNS):
        return f"holds the columns {columns}: select only {loaders.TRAIN_COLUMNS}"
    return None


#: ``to_converter(df, num_devices)``: a Petastorm converter of the training columns in 2 Parquet files per device,
#: for 1 and 3 devices, on the sample DataFrame (the lake's columns); ``loaders.prepare_data`` would do it
converter_for_devices = register("1.6")(
    FunctionCheck(
        "1.6",
        answer="to_converter",
        fixed=[(1,), (3,)],
        arguments=lambda case: (_sample_df(), case[0]),
        judge=_converter_problem,
        show=lambda case: f"<DataFrame of {SAMPLE_ROWS} images with the lake's columns>, {case[0]}",
        forbid=("helpers.loaders:prepare_data",),
        hint="select the training columns, repartition to 2 per device, then make_spark_converter",
        passed="the training columns, 2 Parquet files per device, every row",
    )
)


class _CountingConverter:
    """A converter that counts the loaders opened through it (an epoch must not open a new one) and keeps the
    keyword arguments of each (``cur_shard``, ``shard_count`` and the other reader options are keywords only)."""

    def __init__(self, converter) -> None:
        self._converter = converter
        self.opened = 0
        self.calls: list[dict] = []

    def make_torch_dataloader(self, *args, **kwargs):
        self.opened += 1
        self.calls.append(kwargs)
        return self._converter.make_torch_dataloader(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._converter, name)

    def __len__(self) -> int:
        return len(self._converter)


@functools.lru_cache(maxsize=8)
def _shard_ids(shard: int, shard_count: int) -> frozenset[int]:
    """The row ids of one shard of the sample converter, read straight through Petastorm."""
    with _sample_converter().make_torch_dataloader(
        batch_size=SAMPLE_ROWS,
        num_epochs=1,
        transform_spec=_ids_spec(),
        cur_shard=shard,
        shard_count=shard_count,
        workers_count=2,
    ) as loader:
        return frozenset(row_id for batch in loader for row_id in batch["row_id"].tolist())


def _steps_call(case: tuple[int, int, int, int]) -> tuple:
    """``FixedStepBatches``'s arguments for ``case`` (``shard, shard_count, batch_size, steps``), with a converter
    that counts the loaders opened through it; the shard's rows are read first, outside the answer's work."""
    shard, shard_count, batch_size, steps = case
    _shard_ids(shard, shard_count)
    return _CountingConverter(_sample_converter()), _ids_spec(), batch_size, steps, shard, shard_count


def _read_epochs(batches: Any, case: tuple[int, int, int, int]) -> Any:
    """Two passes' worth of epochs of ``batches`` (at most one batch too many each), closed afterwards: its
    ``length`` (``len()``), each epoch's batch ``sizes`` and the row ids of every epoch in turn (``stream``)."""
    shard, shard_count, batch_size, steps = case
    if not hasattr(batches, "__iter__"):
        return batches
    epochs = -(-2 * len(_shard_ids(shard, shard_count)) // (batch_size * steps))
    read = Collected(length=len(batches), sizes=[], stream=[])
    try:
        for _ in range(epochs):
            ids = [batch["row_id"].tolist() for batch in itertools.islice(iter(batches), steps + 1)]
            read["sizes"].append([len(batch) for batch in ids])
            read["stream"] += [row_id for batch in ids for row_id in batch]
    finally:
        batches.close()
    return read


def _epochs_problem(case: tuple[int, int, int, int], got: Any, given: tuple) -> str | None:
    """What is wrong with the epochs the answer's batches gave for ``case``, or None."""
    shard, shard_count, batch_size, steps = case
    if not isinstance(got, Collected):
        return "made an object that cannot be iterated: define __iter__, yielding steps_per_epoch batches each time"
    if got["length"] != steps:
        return f"has len() {got['length']}, expected steps_per_epoch={steps}: Lightning asks it"
    for epoch, sizes in enumerate(got["sizes"]):
        if sizes != [batch_size] * steps:
            fix = (
                "stop each iteration after steps_per_epoch batches"
                if len(sizes) > steps
                else "keep one loader with num_epochs=None open across epochs"
            )
            return f"yielded batches of {sizes} rows in epoch {epoch}, expected {steps} of {batch_size}: {fix}"
    epochs, opened = len(got["sizes"]), given[0].opened
    if opened > 1:
        return f"opened {opened} loaders in {epochs} epochs: open one (num_epochs=None), go on where the last stopped"
    expected, stream = _shard_ids(shard, shard_count), set(got["stream"])
    if stream != expected:
        return (
            f"read {len(stream & expected)} of the {len(expected)} rows of shard {shard} of {shard_count} in two "
            f"passes' worth of batches, and {len(stream - expected)} from elsewhere: pass cur_shard and shard_count"
        )
    return None


#: Stretch, ``FixedStepBatches(converter, spec, batch_size, steps_per_epoch, cur_shard, shard_count)``: every epoch
#: yields ``steps_per_epoch`` full batches from one loader that stays open, going on through the shard; read for two
#: passes' worth of epochs on shard 0 of 1 and shard 1 of 2 of the sample converter
epochs_of_fixed_steps = register("1.9")(
    FunctionCheck(
        "1.9",
        answer="FixedStepBatches",
        fixed=[(0, 1, 8, 3), (1, 2, 5, 2)],
        arguments=_steps_call,
        collect=_read_epochs,
        judge=_epochs_problem,
        methods=("__init__", "__iter__", "close"),
        show=lambda case: (
            f"<converter of {SAMPLE_ROWS} rows>, <spec>, {case[2]}, {case[3]}, cur_shard={case[0]}, "
            f"shard_count={case[1]}"
        ),
        forbid=("helpers.loaders:PetastormBatches", "helpers.loaders:make_loader"),
        hint="open one loader with num_epochs=None and yield steps_per_epoch of its batches per iteration",
        passed="every epoch has the same number of full batches, from one loader that goes on through the shard",
    )
)
