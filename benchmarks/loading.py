"""Part 1, data loading: images/s of the lesson 1 Petastorm loader against an in-memory DataLoader, at two sizes.

Variants, all over the same training split of the default data (the embedded digits, batch 64, shuffled), measured
in steady state (the loader is opened and warmed up, then a fixed number of batches timed):

- ``in_memory``: ``torch.utils.data.DataLoader(TensorDataset(decoded features, labels), shuffle=True)``, the upper
  bound: the images are already decoded tensors in this process.
- ``petastorm_predecoded`` (a): decoded once, into the table: a Petastorm converter over a DataFrame whose
  ``pixels`` column holds each image already resized and cropped, as raw uint8 CHW bytes (one Parquet value per
  row, a quarter of float32's size). A batch-level TransformSpec turns a row group's bytes into one uint8 array,
  ``BatchedDataLoader`` shuffles and batches with torch ops, and the consumer normalises each batch to float32
  (the same values the in-memory tensors hold, to within uint8 rounding).
- ``petastorm_decode`` (b): ``helpers.loaders.make_loader`` as lesson 1 uses it: encoded bytes decoded by
  ``image_transform_spec`` in the reader's worker threads.

At 32 x 32 (parts 1a, 1b) the encoded bytes are the lake table's own 8 x 8 PNGs, and a tuning table of (a) follows.
At the instructor's 224 x 224 (parts 1c, 1d) they are photo-sized JPEGs made from the same digits
(:func:`photo_jpeg`), and a subset of the split is used (``max_rows``) to bound the memory the decoded tensors take.
"""

from __future__ import annotations

import functools
import io
import os
import time
from statistics import median

import numpy as np

from benchmarks.common import Comparison, alternate, profile_text
from helpers.loaders import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["BATCH_SIZE", "PHOTO_SIZE", "LoadingBench", "compare_sizes", "photo_jpeg", "run_loading"]

BATCH_SIZE = 64
PHOTO_SIZE = (500, 375)  # width, height of the JPEGs of the 224 px variant: of the order of a tf_flowers photo


def _consume(iterator, warmup: int, batches: int, features_of) -> float:
    """Skip ``warmup`` batches, then time ``batches`` batches; return images/s."""
    for _ in range(warmup):
        next(iterator)
    images = 0
    started = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        features = features_of(batch)
        images += features.shape[0]
    return images / (time.perf_counter() - started)


_MEAN = np.array(IMAGENET_MEAN, np.float32)[:, None, None]
_STD = np.array(IMAGENET_STD, np.float32)[:, None, None]


def _bytes_to_pixels(rows, image_size: int):
    """TransformSpec function (a whole row group at once): ``pixels`` bytes -> uint8 (3, S, S) arrays."""
    import pandas as pd

    flat = np.frombuffer(b"".join(rows["pixels"]), np.uint8).reshape(len(rows), 3, image_size, image_size)
    return pd.DataFrame({"label_index": rows["label_index"].to_numpy(), "pixels": list(flat)})


def _normalise(pixels):
    """A uint8 (N, 3, S, S) batch -> float32, ImageNet-normalised (what ``decode_image`` returns)."""
    import torch

    mean = torch.from_numpy(_MEAN)
    std = torch.from_numpy(_STD)
    return (pixels.float().div_(255) - mean) / std


def _endless(loader):
    while True:
        yield from loader


def photo_jpeg(content: bytes, seed: int, size: tuple[int, int] = PHOTO_SIZE, quality: int = 90) -> bytes:
    """A photo-sized JPEG made from a small image: resized to ``size`` (bicubic) with seeded pixel noise added,
    so that the JPEG holds photo-like detail rather than smooth gradients, encoded at ``quality``.

    Args:
        content: the encoded source image (the lake table's PNG).
        seed: the noise's seed (one per image).
        size: the JPEG's width and height.
        quality: the JPEG quality.

    Returns:
        The JPEG's bytes.
    """
    from PIL import Image

    with Image.open(io.BytesIO(content)) as image:
        rgb = np.asarray(image.convert("RGB").resize(size, Image.BICUBIC), np.float32)
    noise = np.random.default_rng(seed).normal(0.0, 12.0, rgb.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(rgb + noise, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


class LoadingBench:
    """Part 1 at one image size: the loaders above, alternated; ``run`` returns the (a) and (b) comparisons.

    Args:
        batches, warmup: batches timed per repetition, after ``warmup`` untimed ones.
        workers_count: Petastorm reader threads.
        image_size: the side of the square images.
        photos: decode photo-sized JPEGs (:func:`photo_jpeg`) instead of the lake table's PNGs.
        max_rows: use at most this many training images (None: all).
        names: the two comparisons' labels, e.g. ``("1a", "1b")``.
        tuning: also measure the tuning table of (a).
    """

    def __init__(
        self,
        batches: int = 60,
        warmup: int = 5,
        workers_count: int = 2,
        image_size: int = 32,
        photos: bool = False,
        max_rows: int | None = None,
        names: tuple[str, str] = ("1a", "1b"),
        tuning: bool = True,
    ) -> None:
        self.batches, self.warmup, self.workers_count = batches, warmup, workers_count
        self.image_size, self.photos, self.max_rows = image_size, photos, max_rows
        self.names, self.tuning = names, tuning
        self.converters: list = []

    @property
    def size_text(self) -> str:
        return f"{self.image_size} x {self.image_size}"

    def _converter(self, pdf):
        """A Petastorm converter over ``pdf`` (2 partitions), deleted in ``close``."""
        from petastorm.spark import make_spark_converter

        converter = make_spark_converter(self.spark.createDataFrame(pdf).repartition(2))
        self.converters.append(converter)
        return converter

    def setup(self) -> None:
        """Lake table -> split -> the encoded bytes' converter and a second one over decoded uint8 arrays."""
        import pandas as pd
        import torch

        from helpers.loaders import TRAIN_COLUMNS, decode_image, prepare_data, stratified_split
        from helpers.spark import get_spark

        self.spark = get_spark()
        prepared = prepare_data(None, num_devices=1, spark=self.spark)
        train_df, _ = stratified_split(prepared.df)
        rows = train_df.select(TRAIN_COLUMNS).toPandas().sort_values("row_id").head(self.max_rows)
        if self.photos:
            rows["content"] = [photo_jpeg(c, seed) for seed, c in enumerate(rows["content"])]
            self.bytes_converter = self._converter(rows.reset_index(drop=True))
        else:
            self.bytes_converter = prepared.train_converter
        self.contents = list(rows["content"])
        self.encoded_kb = np.mean([len(c) for c in self.contents]) / 1024
        decoded = np.stack([decode_image(c, self.image_size) for c in self.contents])
        self.rows = len(decoded)
        labels = rows["label_index"].to_numpy(np.int64)
        self.features = torch.from_numpy(decoded)
        self.labels = torch.from_numpy(labels)
        # decode once, into the table: uint8 CHW bytes per row (undoing decode_image's normalisation)
        pixels = np.clip(np.round((decoded * _STD + _MEAN) * 255), 0, 255).astype(np.uint8)
        self.decoded_converter = self._converter(
            pd.DataFrame({"label_index": labels, "pixels": [row.tobytes() for row in pixels]})
        )
        if self.tuning:  # the earlier layout: the normalised float32 values as an array<float> column
            floats = pd.DataFrame({"label_index": labels, "features": list(decoded.reshape(len(decoded), -1))})
            self.float_converter = self._converter(floats)

    # --- the variants ------------------------------------------------------------------------------------------

    def in_memory(self) -> float:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(
            TensorDataset(self.features, self.labels),
            batch_size=BATCH_SIZE,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
        )
        return _consume(_endless(loader), self.warmup, self.batches, lambda b: b[0])

    def petastorm_predecoded(
        self, reader_pool_type: str = "thread", workers_count: int | None = None, batched: bool = True
    ) -> float:
        """(a): uint8 bytes from the table -> one array per row group -> batches -> normalised float32."""
        from petastorm import TransformSpec
        from petastorm.pytorch import BatchedDataLoader

        size = self.image_size
        spec = TransformSpec(
            functools.partial(_bytes_to_pixels, image_size=size),
            edit_fields=[("pixels", np.uint8, (3, size, size), False)],
        )
        with self.decoded_converter.make_torch_dataloader(
            transform_spec=spec,
            data_loader_fn=BatchedDataLoader if batched else None,
            batch_size=BATCH_SIZE,
            num_epochs=None,
            workers_count=workers_count or self.workers_count,
            shuffling_queue_capacity=4 * BATCH_SIZE,
            seed=0,
            shuffle_row_groups=True,
            reader_pool_type=reader_pool_type,
        ) as loader:
            return _consume(iter(loader), self.warmup, self.batches, lambda b: _normalise(b["pixels"]))

    def petastorm_float_rows(self) -> float:
        """The float32 array<float> layout with Petastorm's row-by-row DataLoader (no TransformSpec)."""
        with self.float_converter.make_torch_dataloader(
            batch_size=BATCH_SIZE,
            num_epochs=None,
            workers_count=self.workers_count,
            shuffling_queue_capacity=4 * BATCH_SIZE,
            seed=0,
            shuffle_row_groups=True,
        ) as loader:
            size = self.image_size
            return _consume(iter(loader), self.warmup, self.batches, lambda b: b["features"].view(-1, 3, size, size))

    def petastorm_decode(self, workers_count: int | None = None) -> float:
        from helpers.loaders import make_loader

        with make_loader(
            self.bytes_converter,
            batch_size=BATCH_SIZE,
            image_size=self.image_size,
            num_epochs=None,
            shuffle=True,
            workers_count=workers_count or self.workers_count,
        ) as loader:
            return _consume(iter(loader), self.warmup, self.batches, lambda b: b["features"])

    def decode_only(self) -> float:
        """images/s of ``decode_image`` alone, one thread, over the training images' bytes (no loader)."""
        from helpers.loaders import decode_image

        started = time.perf_counter()
        for content in self.contents:
            decode_image(content, self.image_size)
        return len(self.contents) / (time.perf_counter() - started)

    # --- where the time goes -----------------------------------------------------------------------------------

    def profile_predecoded(self) -> str:
        """cProfile of reading pre-decoded batches with ``reader_pool_type="dummy"``: the reading then happens in
        the consuming thread, so the profile shows all of the work (Parquet, Arrow to numpy, shuffling, tensors)."""
        return profile_text(lambda: self.petastorm_predecoded("dummy", 1), 12)

    def run(self, repeats: int, log=print) -> list[Comparison]:
        """Set up, alternate the variants ``repeats`` times; the (a) and (b) comparisons with their notes."""
        source = f"{PHOTO_SIZE[0]} x {PHOTO_SIZE[1]} JPEGs" if self.photos else "the lake's PNGs"
        log(f"  setup: lake table, converters ({self.size_text} from {source}, batch {BATCH_SIZE})")
        self.setup()
        log(f"  {self.rows} training images; {self.batches} batches timed per repetition after {self.warmup}")
        variants = {
            "in_memory": self.in_memory,
            "petastorm_predecoded": self.petastorm_predecoded,
            "petastorm_decode": self.petastorm_decode,
            "decode_only_1_thread": self.decode_only,
        }
        values = alternate(variants, repeats, log=log)
        a, b = self._comparisons(values)
        b.notes.append(self._decode_note(values))
        if self.tuning:
            self._tune(a, repeats, median(values["in_memory"]), log)
        if not a.passed:
            a.profile = self.profile_predecoded()
            a.notes.append(self._limits_note(median(values["in_memory"])))
        return [a, b]

    def _comparisons(self, values: dict[str, list[float]]) -> tuple[Comparison, Comparison]:
        """(a) against its target of 0.7 x in-memory, and (b), reported (its target shown for scale)."""
        at = "" if self.image_size == 32 else f" at {self.image_size} px"
        coded = "JPEGs" if self.photos else "PNGs"
        a = Comparison(
            f"{self.names[0]}. Petastorm loader{at}, pre-decoded arrays",
            "images/s",
            "petastorm_predecoded",
            "in_memory",
            0.7,
            ">=",
            {k: values[k] for k in ("petastorm_predecoded", "in_memory")},
        )
        b = Comparison(
            f"{self.names[1]}. Petastorm loader{at}, decoding {coded} in the TransformSpec (report)",
            "images/s",
            "petastorm_decode",
            "in_memory",
            0.7,
            ">=",
            {k: values[k] for k in ("petastorm_decode", "in_memory", "decode_only_1_thread")},
            report_only=True,
        )
        return a, b

    def _decode_note(self, values: dict[str, list[float]]) -> str:
        """What limits (b): decoding alone against the loader decoding, and what decoding costs per image."""
        decode_alone = median(values["decode_only_1_thread"])
        with_decode = median(values["petastorm_decode"])
        predecoded = median(values["petastorm_predecoded"])
        source = (
            f"{PHOTO_SIZE[0]} x {PHOTO_SIZE[1]} JPEGs (made from the digits with pixel noise, {self.encoded_kb:.0f} KB "
            "on average)"
            if self.photos
            else f"8 x 8 PNGs ({self.encoded_kb:.2f} KB on average)"
        )
        cost = (
            f"decoding costs {1e6 / with_decode - 1e6 / predecoded:.1f} us per image in every epoch, which decoding "
            "once into the table (a) removes."
            if with_decode < predecoded
            else "at this image size the reader threads decode as fast as the loader moves pre-decoded rows, so "
            "decoding is hidden behind Petastorm's per-row work."
        )
        return (
            f"What limits (b): `decode_image` alone (PIL open, RGB, bilinear resize to "
            f"{round(self.image_size * 256 / 224)}, centre crop, normalise; no loader) runs at {decode_alone:.0f} "
            f"images/s on one thread (median, measured alternately with the loaders). The loader decoding in its "
            f"TransformSpec reached {with_decode:.0f} images/s with {self.workers_count} reader threads "
            f"({with_decode / decode_alone:.2f} x one thread's decoding alone: the transform's per-row pandas and "
            "numpy steps run under the GIL, and the reader threads share 2 cores with the consumer), against "
            f"{predecoded:.0f} images/s for the same loader over pre-decoded rows (a): {cost} (Measured at "
            f"{self.size_text} from {source}, {self.rows} training images.)"
        )

    def _tune(self, a: Comparison, repeats: int, in_memory: float, log) -> None:
        """Tuning of (a): the loader class, reader threads, and the earlier float32 layout; notes on ``a``."""
        tuning = alternate(
            {
                "as measured above (uint8 bytes, BatchedDataLoader, 2 reader threads)": self.petastorm_predecoded,
                "reader workers_count=1": lambda: self.petastorm_predecoded("thread", 1),
                "reader_pool_type=dummy (reads in the consuming thread)": lambda: self.petastorm_predecoded("dummy", 1),
                "row-by-row DataLoader instead of BatchedDataLoader": lambda: self.petastorm_predecoded(batched=False),
                "float32 array<float> column, row-by-row DataLoader (the first layout)": self.petastorm_float_rows,
            },
            repeats,
            warmup=False,
            log=log,
        )
        a.notes.append(
            "Tuning of (a), medians (ratio to in-memory): "
            + "; ".join(f"{k}: {median(v):.0f} images/s ({median(v) / in_memory:.2f})" for k, v in tuning.items())
            + "."
        )
        a.notes.append(
            "What was changed to make (a) faster: the first layout stored the normalised float32 values as an "
            f"array<float> column. Parquet decodes such a nested list value by value ({3 * self.image_size**2} per "
            f"{self.size_text} image) and Petastorm's row-by-row DataLoader then makes one tensor per row; a cProfile "
            "had `read_row_group` alone at ~14 us per image. Storing the same pixels as one uint8 bytes value per "
            "row, turning a whole row group into one array in the TransformSpec, batching with BatchedDataLoader "
            "and normalising per batch in torch is the first line of the tuning table against the last."
        )
        self.tuning_values = tuning

    def _limits_note(self, in_memory: float) -> str:
        """What limits (a), read from the profile below it."""
        return (
            f"What limits (a) at {self.size_text}: Petastorm's fixed Python work per row and per batch, against an "
            f"in-memory bound of {in_memory:.0f} images/s ({1e6 / in_memory:.1f} us per image: a tensor index and a "
            "stack). In the profile below (reader_pool_type=dummy, so that the reading shows in the same thread) "
            "the time is spread over the reader's queue locks (`acquire`), Parquet's `read_row_group`, the torch "
            "shuffling buffer (`_add_many`, and the per-batch list comprehension of `retrieve`), Arrow to pandas, "
            "and Petastorm's check of every row's shape after a TransformSpec (`_check_shape_and_ravel`, once per "
            "row) followed by a `vstack` back into one array. The per-row costs do not grow with the image; the "
            "copies (Parquet, vstack, shuffling, normalising) do, as do the in-memory bound's."
        )

    def close(self) -> None:
        """Delete the converters' Parquet caches made here (the lake's own converter is left alone)."""
        for converter in self.converters:
            try:
                converter.delete()
            except Exception:  # noqa: BLE001 - cache clean-up is best effort
                pass
        self.converters = []


def compare_sizes(small: list[Comparison], large: list[Comparison], large_size: int) -> list[Comparison]:
    """``large`` (the same variants at a larger image size), each with a note comparing its ratio with ``small``'s.

    Args:
        small: ``LoadingBench.run``'s (a) and (b) at the smaller size.
        large: the same at the larger size, in the same order.
        large_size: the larger images' side, in pixels.

    Returns:
        ``large``, its notes extended.
    """
    batch_kb = BATCH_SIZE * 3 * 4 * large_size**2 / 1024
    slower_bound = (
        " A ratio above 1 means the in-memory DataLoader was the slower one: its time goes into collating each "
        f"batch (`default_collate`'s `torch.stack` of {BATCH_SIZE} float32 images, {batch_kb / 1024:.0f} MB, into "
        "fresh memory, in a cProfile run apart), which varied widely with the machine's load (see its "
        "repetitions), while the pre-decoded loader moves uint8 pixels (a quarter of the bytes) until the batch is "
        "normalised."
    )
    for at_small, at_large in zip(small, large):
        per_image = {
            name: (1e6 / median(at_small.values[name]), 1e6 / median(at_large.values[name]))
            for name in (at_large.numerator, at_large.denominator)
        }
        at_large.notes.append(
            f"The same ratio at both sizes: {at_large.ratio:.3f} here against {at_small.ratio:.3f} in "
            f"{at_small.name.split('.')[0]} (32 px). Per image (medians): "
            + "; ".join(f"`{name}` {a:.1f} us at 32 px, {b:.1f} us here" for name, (a, b) in per_image.items())
            + _size_verdict(at_small.ratio, at_large.ratio)
            + (slower_bound if at_large.ratio > 1 else "")
        )
    return large


def _size_verdict(small_ratio: float, large_ratio: float) -> str:
    """What the 32 px and 224 px ratios say about Petastorm's fixed per-row costs (within 20%: the same)."""
    if large_ratio > 1.2 * small_ratio:
        return ": Petastorm's fixed per-row and per-batch costs weigh less beside the work that grows with the image."
    if large_ratio < small_ratio / 1.2:
        return (
            ": Petastorm fell further behind, so its work that grows with the image (Parquet's read, the copies, "
            "normalising) grew faster than the in-memory bound's."
        )
    return (
        ": about the same ratio, so at this size Petastorm's fixed per-row costs are not what holds it back; its "
        "work that grows with the image (Parquet's read, the copies, normalising) grows as fast as the in-memory "
        "bound's stacking."
    )


def run_loading(repeats: int, quick: bool = False, log=print):
    """Part 1: the loaders at 32 px (1a, 1b, with the tuning table), then at 224 px from photo-sized JPEGs (1c, 1d).

    Args:
        repeats: repetitions of each variant (at least ``MIN_REPEATS``).
        quick: tiny sizes (``--quick``: checks that everything runs, measures nothing).
        log: where progress goes.

    Returns:
        ``(comparisons, features, labels)``: 1a-1d, and the 32 px training images as tensors (for part 2).
    """
    bench = LoadingBench(batches=10 if quick else 150, warmup=2 if quick else 10)
    small = bench.run(repeats, log=log)
    features, labels = bench.features, bench.labels
    bench.close()
    log(f"  -- at 224 px (load average {os.getloadavg()[0]:.2f})")
    bench = LoadingBench(
        batches=2 if quick else 16,
        warmup=1 if quick else 3,
        image_size=224,
        photos=True,
        max_rows=128 if quick else 768,
        names=("1c", "1d"),
        tuning=False,
    )
    large = bench.run(repeats, log=log)
    bench.close()
    return small + compare_sizes(small, large, 224), features, labels
