"""The data lake: image folders -> Delta table with Spark and delta-rs, history, time travel, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from helpers import CourseInputError
from helpers.data import class_folders, embedded_digits
from helpers.lake import ingest_images, read_table, table_history, write_table
from tests.image_folders import make_image_folder


def test_embedded_digits_are_real_pngs_in_class_folders(digits_dir: Path):
    classes = class_folders(digits_dir)
    assert classes == [f"digit_{i}" for i in range(10)]
    files = list(digits_dir.glob("*/*.png"))
    assert len(files) == 1797
    with Image.open(files[0]) as image:
        assert image.format == "PNG" and image.size == (8, 8)
    assert embedded_digits(digits_dir.parent.parent) == digits_dir  # written once, then reused


@pytest.mark.parametrize(
    "layout, message",
    [
        (None, "does not exist"),
        ({}, "no class sub-folders"),
        ({"only": 3}, "only one class"),
    ],
)
def test_bad_data_dir_is_a_clear_one_line_error(tmp_path: Path, layout, message):
    folder = tmp_path / "images"
    if layout is not None:
        folder.mkdir()
        make_image_folder(folder, layout)
    with pytest.raises(CourseInputError, match=message) as err:
        class_folders(folder)
    assert "\n" not in str(err.value) and "DATA_DIR" in str(err.value)


def test_ingest_other_folder_skips_non_images_and_corrupt_files(spark, tmp_path: Path):
    folder = make_image_folder(tmp_path / "imgs", {"tulip": 4, "rose": 3, "aster": 5}, size=(30, 17))
    make_image_folder(folder, {"rose": 2}, size=(9, 11), fmt="PNG", mode="L", seed=1)  # grayscale PNGs too
    (folder / "rose" / "notes.txt").write_text("not an image")
    (folder / "tulip" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (folder / "LICENSE.txt").write_text("top-level files are ignored")

    report = ingest_images(spark, folder, tmp_path / "table")

    assert report.class_names == ["aster", "rose", "tulip"]
    assert (report.rows, report.skipped_non_images, report.skipped_corrupt) == (14, 1, 1)
    rows = read_table(spark, report.table_path).collect()
    assert {(r.label, r.label_index) for r in rows} == {("aster", 0), ("rose", 1), ("tulip", 2)}
    sizes = {Path(r.path).suffix: (r.width, r.height) for r in rows}
    assert sizes == {".jpg": (30, 17), ".png": (9, 11)}


def test_failed_ingest_keeps_the_previous_version_readable(spark, tmp_path: Path):
    good = make_image_folder(tmp_path / "good", {"a": 3, "b": 3})
    bad = make_image_folder(tmp_path / "bad", {"a": 3})
    table = tmp_path / "table"
    ingest_images(spark, good, table)
    with pytest.raises(CourseInputError, match="only one class"):
        ingest_images(spark, bad, table)
    assert read_table(spark, table).count() == 6
    assert list(table_history(spark, table)["version"]) == [0]


def test_history_and_time_travel_after_a_second_write(spark, tmp_path: Path):
    folder = make_image_folder(tmp_path / "imgs", {"a": 4, "b": 2})
    table = tmp_path / "table"
    ingest_images(spark, folder, table)
    current = read_table(spark, table)
    assert write_table(spark, current.where("label = 'a'"), table) == 1

    history = table_history(spark, table)
    assert list(history["version"]) == [1, 0]
    assert read_table(spark, table).count() == 4
    assert read_table(spark, table, version=0).count() == 6
    with pytest.raises(CourseInputError, match="has no version 7: its latest is 1"):
        read_table(spark, table, version=7)
    for bad in (-1, True, "0"):
        with pytest.raises(CourseInputError, match=r"^version=.*: pass a whole number of at least 0\."):
            read_table(spark, table, version=bad)


def test_a_missing_table_is_a_clear_error(spark, tmp_path: Path):
    for read in (read_table, table_history):
        with pytest.raises(CourseInputError, match="^No Delta table at .*: ingest the images first"):
            read(spark, tmp_path / "nothing here")
    with pytest.raises(CourseInputError, match="^mode='merge': use one of 'overwrite', 'append'"):
        write_table(spark, None, tmp_path / "t", mode="merge")


def test_paths_handed_to_spark_carry_their_scheme(tmp_path):
    from helpers.spark import spark_path

    # without a scheme Spark would resolve them against the cluster's default file system (HDFS, DBFS)
    assert spark_path(tmp_path / "lake") == f"file://{tmp_path.resolve()}/lake"
    assert spark_path("/dbfs/course-work/lake") == "dbfs:/course-work/lake"
    for kept in ("/Volumes/main/course/work/lake", "s3://bucket/lake", "file:///data/lake", "dbfs:/x"):
        assert spark_path(kept) == kept
