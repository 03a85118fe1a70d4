"""The data lake: image files -> a Delta table, read back through its snapshot, with history and time travel.

Spark reads the files with its ``binaryFile`` source. The Delta table is written with Spark's own Delta support
where the cluster has it (Databricks), and otherwise with delta-rs (``deltalake``), which needs no JVM jars.
Reads always go through the table's snapshot (current or ``version``), never through a glob of its folder.
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
from helpers.workdir import work_dir

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
    """What an ingest wrote: table path and version, rows, class names, and files it skipped."""

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
    """Where the lake table for an image folder lives: ``<work>/lake/<folder name>-<short hash of its path>``."""
    resolved = str(Path(data_dir).resolve())
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:8]
    return work_dir(work) / "lake" / f"{Path(resolved).name}-{digest}"


def has_native_delta(spark) -> bool:
    """True when Spark itself can read and write Delta (Databricks, or a cluster with the Delta jars)."""
    try:
        from py4j.java_gateway import JavaClass

        return isinstance(spark._jvm.io.delta.tables.DeltaTable, JavaClass)
    except Exception:  # noqa: BLE001 - a Spark Connect session or no JVM view: no native Delta
        return False


def _image_size(content: bytes) -> tuple[int, int] | None:
    """(width, height) of an encoded image, or None when it cannot be decoded."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(content)) as image:
            image.load()
            return image.size
    except Exception:  # noqa: BLE001 - any decoding failure means a corrupt file
        return None


def image_sizes(contents: pd.Series) -> pd.DataFrame:
    """Decode each image's bytes; width and height, or nulls for corrupt images (used as a pandas UDF)."""
    sizes = [_image_size(c) for c in contents]
    return pd.DataFrame(
        {
            "width": pd.array([s[0] if s else None for s in sizes], dtype="Int32"),
            "height": pd.array([s[1] if s else None for s in sizes], dtype="Int32"),
        }
    )


def read_images(spark, data_dir: str | os.PathLike):
    """Read an image folder into a DataFrame (path, label, label_index, content, width, height).

    Labels come from the class folder names; ``label_index`` is the position in the sorted class names, so it is
    stable across runs. Files that are not .jpg/.jpeg/.png are skipped; corrupt images are skipped and counted.
    Returns ``(df, class_names, skipped_non_images, skipped_corrupt)``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StructField, StructType

    classes = class_folders(data_dir)
    root = Path(data_dir).resolve()
    files = spark.read.format("binaryFile").load(f"{root}/*/*")
    ext = F.lower(F.regexp_extract("path", r"(\.[^./]+)$", 1))
    is_image = ext.isin(list(IMAGE_EXTENSIONS))
    counts = files.select(F.sum(F.when(is_image, 0).otherwise(1)).alias("other")).first()
    skipped_non_images = int(counts["other"] or 0)

    size_schema = StructType([StructField("width", IntegerType()), StructField("height", IntegerType())])
    sizes = F.pandas_udf(image_sizes, returnType=size_schema)
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
    """Write a DataFrame with the lake schema as a new version of the Delta table; returns that version.

    The commit is atomic: if anything fails, the previous version stays the current one.
    """
    if mode not in ("overwrite", "append"):
        raise CourseInputError(f"write_table mode '{mode}' is not supported: use 'overwrite' or 'append'.")
    path = str(table_path)
    if has_native_delta(spark):
        df.write.format("delta").mode(mode).save(path)
        return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])
    from deltalake import DeltaTable, write_deltalake

    pdf = df.select(*LAKE_SCHEMA.names).toPandas()
    write_deltalake(path, pa.Table.from_pandas(pdf, schema=LAKE_SCHEMA, preserve_index=False), mode=mode)
    return DeltaTable(path).version()


def read_table(spark, table_path: str | os.PathLike, version: int | None = None):
    """Read the Delta table's current snapshot (or ``version``, time travel) as a Spark DataFrame."""
    path = str(table_path)
    if has_native_delta(spark):
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(path)
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, version=version)
    except TableNotFoundError as err:
        raise CourseInputError(f"No Delta table at '{path}': ingest the images first (ingest_images).") from err
    except Exception as err:  # noqa: BLE001 - delta-rs reports an unknown version with a generic error
        raise CourseInputError(f"Delta table '{path}' has no version {version}: see table_history().") from err
    return spark.read.schema(_spark_schema()).parquet(*table.file_uris())


def _spark_schema():
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    types = {pa.string(): StringType(), pa.int32(): IntegerType(), pa.binary(): BinaryType()}
    return StructType([StructField(f.name, types[f.type]) for f in LAKE_SCHEMA])


def table_history(spark, table_path: str | os.PathLike) -> pd.DataFrame:
    """The table's commits, newest first: version, timestamp, operation and its parameters."""
    path = str(table_path)
    if has_native_delta(spark):
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").toPandas()
        return history[["version", "timestamp", "operation", "operationParameters"]]
    from deltalake import DeltaTable

    rows = DeltaTable(path).history()
    history = pd.DataFrame(rows)
    history["timestamp"] = pd.to_datetime(history["timestamp"], unit="ms", utc=True)
    return history[["version", "timestamp", "operation", "operationParameters"]]


def ingest_images(spark, data_dir: str | os.PathLike, table_path: str | os.PathLike | None = None) -> IngestReport:
    """Read an image folder with Spark and write it as a new version of its Delta table.

    Everything is validated before the write, so bad input leaves the previous version current and readable.
    """
    path = Path(table_path) if table_path else default_table_path(data_dir)
    df, classes, non_images, corrupt = read_images(spark, data_dir)
    version = write_table(spark, df, path)
    df.unpersist()
    rows = read_table(spark, path).count()
    return IngestReport(str(path), version, rows, classes, non_images, corrupt)
