"""Notebook CI: every solution runs with papermill and passes its checks, nbval re-checks the outputs marked
``# NBVAL_CHECK_OUTPUT``, every generated lesson reports every exercise "not attempted", and lessons/ is current.

The course's fixture notebook goes through the same tests, so the suite proves the machinery even before
``solutions/`` holds a notebook.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.checks import NOT_ATTEMPTED, PASSED
from helpers.course import SOLUTIONS_DIR, build_lesson, problems, read_notebook, structure
from helpers.grade import allow_errors, check_records, execute
from helpers.workdir import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "solutions" / "99_course_fixture.ipynb"
SANITIZER = REPO_ROOT / "tests" / "nbval_sanitize.cfg"
SOLUTIONS = sorted(SOLUTIONS_DIR.glob("*.ipynb"))
SOLUTION_TIMEOUT_S = 1800  # a real lesson prepares data with Spark and trains small models on the CPU

NOTEBOOKS = [pytest.param(FIXTURE, id="fixture")] + (
    [pytest.param(path, id=path.stem) for path in SOLUTIONS]
    or [pytest.param(None, id="solutions", marks=pytest.mark.skip(reason="solutions/ holds no notebook yet"))]
)


@pytest.fixture(scope="session")
def course_work_dir(tmp_path_factory) -> Path:
    """One work directory for the session: lessons may reuse the data an earlier lesson prepared."""
    return tmp_path_factory.mktemp("course-work")


def exercise_ids(notebook: Path) -> list[str]:
    return structure(read_notebook(notebook)).exercise_ids


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_follows_the_conventions(notebook):
    """A parameters cell with DATA_DIR, WORK_DIR, SEED; a check after every exercise; ids that fit the lesson."""
    assert problems(read_notebook(notebook), notebook.stem) == []


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_passes_every_check(notebook, course_work_dir, tmp_path):
    output = tmp_path / notebook.name
    run = execute(notebook, output, cwd=notebook.parent, work_dir=course_work_dir, timeout=SOLUTION_TIMEOUT_S)
    assert not run.timed_out and run.returncode == 0, run.log_tail
    records = check_records(read_notebook(output))
    failing = [record for record in records if record["status"] != PASSED]
    assert not failing, failing
    assert sorted({record["exercise"] for record in records}) == sorted(exercise_ids(notebook))


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_outputs_match_with_nbval(notebook, course_work_dir):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-sanitize-with", str(SANITIZER),
         "--nbval-kernel-name", "python3", "-p", "no:cacheprovider", "-q", str(notebook)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=SOLUTION_TIMEOUT_S,
        env={**os.environ, "COURSE_WORK_DIR": str(course_work_dir)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_lesson_reports_every_exercise_not_attempted(notebook, course_work_dir, tmp_path):
    lesson = allow_errors(build_lesson(read_notebook(notebook), notebook.stem))
    source, output = tmp_path / "lesson.ipynb", tmp_path / "executed.ipynb"
    nbformat.write(lesson, source)
    run = execute(source, output, cwd=notebook.parent, work_dir=course_work_dir, timeout=SOLUTION_TIMEOUT_S)
    assert not run.timed_out, run.log_tail
    statuses = {record["exercise"]: record["status"] for record in check_records(read_notebook(output))}
    assert statuses == dict.fromkeys(exercise_ids(notebook), NOT_ATTEMPTED)


def test_committed_lessons_are_up_to_date():
    if not SOLUTIONS:
        pytest.skip("solutions/ holds no notebook yet")
    result = subprocess.run(
        [sys.executable, "-m", "helpers.course", "build", "--check"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
