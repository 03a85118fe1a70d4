"""Lesson 1 on an image folder that is not the embedded digits: other classes, sizes, formats and colour modes."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest

from helpers.checks import PASSED
from helpers.grade import check_records
from helpers.workdir import REPO_ROOT
from tests.image_folders import make_image_folder

LESSON_1 = REPO_ROOT / "solutions" / "01_data_lake_petastorm.ipynb"


@pytest.mark.slow
def test_lesson_1_runs_on_another_image_folder(tmp_path: Path):
    data = tmp_path / "flowers"
    make_image_folder(data, {"tulips": 45, "daisy": 40}, size=(64, 48), fmt="JPEG", mode="RGB")
    make_image_folder(data, {"roses": 50}, size=(20, 30), fmt="PNG", mode="L", seed=1)
    output = tmp_path / "executed.ipynb"
    papermill.execute_notebook(
        str(LESSON_1), str(output), kernel_name="python3", progress_bar=False, cwd=str(LESSON_1.parent),
        parameters={"DATA_DIR": str(data), "WORK_DIR": str(tmp_path / "work"), "IMAGE_SIZE": 24},
    )  # fmt: skip
    executed = nbformat.read(output, as_version=4)
    statuses = {record["exercise"]: record["status"] for record in check_records(executed)}
    assert statuses and set(statuses.values()) == {PASSED}, statuses
    printed = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "['daisy', 'roses', 'tulips']" in printed
    assert "135 images in 3 classes" in printed
