"""The data lake: image files -> a Delta table, read back through its snapshot, with history and time travel.

Spark reads the files (``binaryFile``); the table is written by Spark's own Delta support where the cluster has it
(Databricks), else by delta-rs (``deltalake``, no JVM jars). Reads go through a snapshot, never a folder glob.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from helpers import CourseInputError
from helpers.data import IMAGE_EXTENSIONS, class_folders
from helpers.spark import spark_path
from helpers.validation import one_of, whole_number
from helpers.workdir import work_dir

__all__ = [
    "IngestReport",
    "default_table_path",
    "ingest_images",
    "read_images",
    "read_table",
    "table_history",
    "write_table",
]

LAKE_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("label", pa.string()),
        ("label_index", pa.int32()),
        ("content", pa.binary()),
        ("width", pa.int32()),
        ("height", pa.int32()),
    ]
)


@dataclass
class IngestReport:
    """What an ingest wrote: table path and version, rows, class names, and files it skipped.

    Attributes:
        table_path: the Delta table's folder.
        version: the table version the ingest committed.
        rows: images in that version.
        class_names: the class folder names, sorted (position = ``label_index``).
        skipped_non_images: files that are not .jpg/.jpeg/.png.
        skipped_corrupt: image files that could not be decoded.
    """

    table_path: str
    version: int
    rows: int
    class_names: list[str]
    skipped_non_images: int
    skipped_corrupt: int

    def __str__(self) -> str:
        return (
            f"Delta table {self.table_path} version {self.version}: {self.rows} images in "
            f"{len(self.class_names)} classes; skipped {self.skipped_non_images} non-image and "
            f"{self.skipped_corrupt} corrupt files"
        )


def default_table_path(data_dir: str | os.PathLike, work: str | os.PathLike | None = None) -> Path:
    """Where the lake table for an image folder lives.

    Args:
        data_dir: the image folder.
        work: the work directory (default: :func:`~helpers.workdir.work_dir`).

    Returns:
        ``<work>/lake/<folder name>-<short hash of its resolved path>``.
    """
    resolved = str(Path(data_dir).resolve())
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:8]
    return work_dir(work) / "lake" / f"{Path(resolved).name}-{digest}"


def _has_native_delta(spark) -> bool:
    """True when Spark itself can read and write Delta (Databricks, or a cluster with the Delta jars)."""
    from py4j.java_gateway import JavaClass
    from py4j.protocol import Py4JError

    try:
        delta_table = spark._jvm.io.delta.tables.DeltaTable
    except (AttributeError, Py4JError):  # Spark Connect has no JVM view; a locked-down cluster refuses Py4J calls
        return False
    return isinstance(delta_table, JavaClass)


def _image_size(content: bytes) -> tuple[int, int] | None:
    """(width, height) of an encoded image, or None when it cannot be decoded."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(content)) as image:
            image.load()
            return image.size
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):  # how Pillow reports a bad file
        return None


def _image_sizes(contents: pd.Series) -> pd.DataFrame:
    """Decode each image's bytes; width and height, or nulls for corrupt images (used as a pandas UDF)."""
    sizes = [_image_size(c) for c in contents]
    return pd.DataFrame(
        {
            "width": pd.array([s[0] if s else None for s in sizes], dtype="Int32"),
            "height": pd.array([s[1] if s else None for s in sizes], dtype="Int32"),
        }
    )


def read_images(spark, data_dir: str | os.PathLike):
    """Read an image folder into a cached DataFrame (path, label, label_index, content, width, height).

    Labels come from the class folder names; ``label_index`` is the position in the sorted class names, so it is
    stable across runs. Files that are not .jpg/.jpeg/.png are skipped; corrupt images are skipped and counted.

    Args:
        spark: the SparkSession.
        data_dir: an image folder, one sub-folder of images per class.

    Returns:
        ``(df, class_names, skipped_non_images, skipped_corrupt)``; ``df.unpersist()`` when done with it.

    Raises:
        CourseInputError: the folder is not an image folder, or fewer than two classes have readable images.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StructField, StructType

    classes = class_folders(data_dir)
    root = Path(data_dir).resolve()
    # the class folders by name: a glob of every file would list them in a Spark job of its own (over 32 paths)
    files = spark.read.format("binaryFile").load([spark_path(root / name) for name in classes])
    # Spark plans a partition per 32 small files (4 MB "open cost" each): one per task slot decodes them in one pass
    files = files.coalesce(spark.sparkContext.defaultParallelism)
    ext = F.lower(F.regexp_extract("path", r"(\.[^./]+)$", 1))
    is_image = ext.isin(list(IMAGE_EXTENSIONS))
    counts = files.select(F.sum(F.when(is_image, 0).otherwise(1)).alias("other")).first()
    skipped_non_images = int(counts["other"] or 0)

    size_schema = StructType([StructField("width", IntegerType()), StructField("height", IntegerType())])
    sizes = F.pandas_udf(_image_sizes, returnType=size_schema)
    label = F.element_at(F.split("path", "/"), -2)
    mapping = F.create_map(*[item for i, name in enumerate(classes) for item in (F.lit(name), F.lit(i))])
    decoded = (
        files.where(is_image)
        .select("path", label.alias("label"), "content")
        .where(F.col("label").isin(classes))
        .withColumn("label_index", mapping[F.col("label")].cast("int"))
        .withColumn("size", sizes("content"))
        .select("path", "label", "label_index", "content", "size.width", "size.height")
        .cache()
    )
    skipped_corrupt = decoded.where(F.col("width").isNull()).count()
    good = decoded.where(F.col("width").isNotNull())
    present = sorted(r["label"] for r in good.select("label").distinct().collect())
    if len(present) < 2:
        raise CourseInputError(
            f"DATA_DIR '{root}' has readable images in {len(present)} class(es) only: a classifier needs at least two."
        )
    return good, classes, skipped_non_images, skipped_corrupt


def write_table(spark, df, table_path: str | os.PathLike, mode: str = "overwrite") -> int:
    """Write a DataFrame with the lake schema as a new version of the Delta table.

    The commit is atomic: if anything fails, the previous version stays the current one.

    Args:
        spark: the SparkSession.
        df: a DataFrame with the lake's columns (as :func:`read_images` or :func:`read_table` return).
        table_path: the Delta table's folder (created by the first write).
        mode: ``"overwrite"`` (the new version holds ``df`` only) or ``"append"``.

    Returns:
        The version written.

    Raises:
        CourseInputError: ``mode`` is neither ``"overwrite"`` nor ``"append"``.
    """
    one_of("mode", mode, ("overwrite", "append"))
    path = str(table_path)
    if _has_native_delta(spark):
        df.write.format("delta").mode(mode).save(spark_path(path))
    else:
        from deltalake import write_deltalake

        pdf = df.select(*LAKE_SCHEMA.names).toPandas()
        write_deltalake(path, pa.Table.from_pandas(pdf, schema=LAKE_SCHEMA, preserve_index=False), mode=mode)
    return _latest_version(spark, path)


def _delta_rs_table(path: str):
    """The delta-rs ``DeltaTable`` at ``path``, at its current version."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        raise CourseInputError(f"No Delta table at '{path}': ingest the images first (ingest_images).")
    return DeltaTable(path)


def _latest_version(spark, path: str) -> int:
    """The table's current version."""
    if _has_native_delta(spark):
        return int(spark.sql(f"DESCRIBE HISTORY delta.`{spark_path(path)}` LIMIT 1").first()["version"])
    return _delta_rs_table(path).version()


def read_table(spark, table_path: str | os.PathLike, version: int | None = None):
    """Read the Delta table's current snapshot, or an earlier version (time travel), as a Spark DataFrame.

    Args:
        spark: the SparkSession.
        table_path: the Delta table's folder.
        version: the version to read; None for the current one.

    Returns:
        A DataFrame with the lake's columns.

    Raises:
        CourseInputError: there is no Delta table at ``table_path``, or it has no version ``version``.
    """
    path = str(table_path)
    latest = _latest_version(spark, path)
    if version is not None:
        version = whole_number("version", version, minimum=0, hint="See table_history() for the table's versions.")
        if version > latest:
            raise CourseInputError(
                f"Delta table '{path}' has no version {version}: its latest is {latest} (see table_history())."
            )
    if _has_native_delta(spark):
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(spark_path(path))
    table = _delta_rs_table(path)
    if version is not None:
        table.load_as_version(version)
    return spark.read.schema(_spark_schema()).parquet(*map(spark_path, table.file_uris()))


def _spark_schema():
    """:data:`LAKE_SCHEMA` as a Spark schema."""
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    types = {pa.string(): StringType(), pa.int32(): IntegerType(), pa.binary(): BinaryType()}
    return StructType([StructField(f.name, types[f.type]) for f in LAKE_SCHEMA])


def table_history(spark, table_path: str | os.PathLike) -> pd.DataFrame:
    """The table's commits, newest first.

    Args:
        spark: the SparkSession.
        table_path: the Delta table's folder.

    Returns:
        One row per commit: ``version``, ``timestamp`` (UTC), ``operation`` and ``operationParameters``.

    Raises:
        CourseInputError: there is no Delta table at ``table_path`` (delta-rs).
    """
    path = str(table_path)
    if _has_native_delta(spark):
        history = spark.sql(f"DESCRIBE HISTORY delta.`{spark_path(path)}`").toPandas()
        return history[["version", "timestamp", "operation", "operationParameters"]]
    history = pd.DataFrame(_delta_rs_table(path).history())
    history["timestamp"] = pd.to_datetime(history["timestamp"], unit="ms", utc=True)
    return history[["version", "timestamp", "operation", "operationParameters"]]


def ingest_images(spark, data_dir: str | os.PathLike, table_path: str | os.PathLike | None = None) -> IngestReport:
    """Read an image folder with Spark and write it as a new version of its Delta table.

    Everything is validated before the write, so bad input leaves the previous version current and readable.

    Args:
        spark: the SparkSession.
        data_dir: an image folder, one sub-folder of images per class.
        table_path: the Delta table's folder (default: :func:`default_table_path`).

    Returns:
        What was written, as an :class:`IngestReport`.

    Raises:
        CourseInputError: the folder is not an image folder, or fewer than two classes have readable images.
    """
    path = Path(table_path) if table_path else default_table_path(data_dir)
    df, classes, non_images, corrupt = read_images(spark, data_dir)
    version = write_table(spark, df, path)
    df.unpersist()
    rows = read_table(spark, path).count()
    return IngestReport(str(path), version, rows, classes, non_images, corrupt)
