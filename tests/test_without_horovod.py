"""The course where Horovod is not installed (Databricks Runtime 16.0 ML and later): ``import horovod`` fails.

Lesson 0 runs end to end and says lesson 3 needs Horovod; lesson 3 stops in its first code cell with one line that says
why and what to do, not an ImportError traceback. Lessons 1 and 2 use no launcher, and lesson 6 uses Ray,
TorchDistributor and DeepSpeed: their imports load without Horovod. Lessons 4, 5 and 6 run end to end without
Horovod on the multi-host cluster (test_multihost.py), where such a runtime runs them: lesson 4 with TorchDistributor
alone, lesson 5's ``LAUNCHER="auto"`` picking it. The lessons' Horovod paths run in test_notebooks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.course.build import read_notebook, solution_notebooks
from helpers.course.run import execute
from tests.processes import no_horovod_env as hiding_horovod

pytestmark = pytest.mark.slow

LESSONS = {path.stem[:2]: path for path in solution_notebooks()}


@pytest.fixture(scope="module")
def no_horovod_env() -> dict[str, str]:
    return hiding_horovod(os.environ.get("PYTHONPATH"))


def test_the_hidden_package_really_hides_horovod(no_horovod_env):
    probe = "import horovod.torch"
    hidden = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **no_horovod_env}, capture_output=True)
    assert hidden.returncode != 0 and b"No module named 'horovod'" in hidden.stderr
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def outputs(notebook: Path) -> str:
    """Every text a notebook's cells printed or raised, one string."""
    texts = []
    for cell in read_notebook(notebook).cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", "") + "".join(output.get("traceback", [])))
    return "\n".join(texts)


def test_the_environment_check_says_lesson_3_needs_horovod(no_horovod_env, tmp_path):
    output = tmp_path / "out.ipynb"
    run = execute(LESSONS["00"], output, parameters={"WORK_DIR": str(tmp_path / "work")}, env=no_horovod_env)
    assert not run.failed, run.log_tail
    assert "Horovod is not installed: lesson 3 needs it" in outputs(output)


def test_lesson_3_stops_in_one_line_that_says_what_to_do(no_horovod_env, tmp_path):
    output = tmp_path / "out.ipynb"
    run = execute(LESSONS["03"], output, parameters={"WORK_DIR": str(tmp_path / "work")}, env=no_horovod_env)
    assert run.failed and not run.timed_out
    errors = [o for cell in read_notebook(output).cells for o in cell.get("outputs", []) if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "CourseInputError", errors
    assert errors[0].traceback == [f"CourseInputError: {errors[0].evalue}"]  # one line, no traceback
    assert "Lesson 3 needs Horovod" in errors[0].evalue and "LAUNCHER='torch_distributor'" in errors[0].evalue


@pytest.mark.parametrize("lesson", ["01", "02", "06"])
def test_lessons_without_a_launcher_import_without_horovod(lesson, no_horovod_env):
    """Their code cells' imports (the helpers they use and what those import) load where Horovod cannot."""
    imports = [
        line.strip()
        for cell in read_notebook(LESSONS[lesson]).cells
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if line.startswith(("import ", "from ")) and "helpers" in line
    ]
    assert imports
    probe = "\n".join(imports) + "\nimport sys\nprint(json.dumps('horovod' in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + probe],
        env={**os.environ, **no_horovod_env},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) is False
