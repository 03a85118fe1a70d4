"""Notebook CI: each solution notebook executes once, and that run is the test.

papermill ``--prepare-only`` injects the CI parameters; nbval executes the prepared notebook once and, in the same
run, compares the outputs marked ``# NBVAL_CHECK_OUTPUT``; every check cell logs its record (``$COURSE_CHECK_LOG``),
and every exercise must have passed; the seconds each check took go to the run's table of the slowest checks. The
generated lesson runs only what its checks need (its imports, the exercise stubs and the check cells) and every
exercise must report "not attempted". The course's fixture notebook goes through the same tests, so the machinery
is proven even before ``solutions/`` holds a notebook.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.course.build import (
    PARAMETERS_TAG,
    build_lesson,
    problems,
    read_notebook,
    solution_notebooks,
    structure,
)
from helpers.course.checks import LOG_ENV, NOT_ATTEMPTED, PASSED
from helpers.course.run import papermill_command
from helpers.workdir import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "solutions" / "99_course_fixture.ipynb"
SANITIZER = REPO_ROOT / "tests" / "nbval_sanitize.cfg"
SOLUTIONS = solution_notebooks()
SLACK = 4  # a notebook may take this many times its measured `ci_seconds` on a loaded CI machine before it fails
DEFAULT_CI_SECONDS = 60

NOTEBOOKS = [pytest.param(FIXTURE, id="fixture")] + (
    [pytest.param(path, id=path.stem) for path in SOLUTIONS]
    or [pytest.param(None, id="solutions", marks=pytest.mark.skip(reason="solutions/ holds no notebook yet"))]
)


@pytest.fixture(scope="session")
def course_work_dir(session_work_dir) -> Path:
    """One work directory for the session: lessons may reuse the data an earlier lesson prepared."""
    path = session_work_dir / "course"
    path.mkdir(exist_ok=True)
    return path


def exercise_ids(notebook: Path) -> list[str]:
    return structure(read_notebook(notebook)).exercise_ids


def timeout_for(notebook: Path) -> int:
    """The notebook's time budget: ``SLACK`` times the ``ci_seconds`` its metadata promises."""
    course = read_notebook(notebook).metadata.get("course", {})
    return SLACK * int(course.get("ci_seconds", DEFAULT_CI_SECONDS))


def logged_records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_follows_the_conventions(notebook):
    """A parameters cell with DATA_DIR, WORK_DIR, SEED; a check after every exercise; ids that fit the lesson."""
    assert problems(read_notebook(notebook), notebook.stem) == []


def run_once(notebook: Path, work: Path, scratch: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Prepare ``notebook`` with the CI parameters, execute and compare it with nbval; return the run and the
    check records it logged."""
    prepared, log = scratch / notebook.name, scratch / "checks.jsonl"
    subprocess.run(
        papermill_command(notebook, prepared, parameters={"WORK_DIR": str(work)}, prepare_only=True),
        check=True,
        capture_output=True,
        cwd=notebook.parent,
    )
    env = {**os.environ, "COURSE_WORK_DIR": str(work), LOG_ENV: str(log)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-sanitize-with", str(SANITIZER),
         "--nbval-kernel-name", "python3", "--nbval-cell-timeout", str(timeout_for(notebook)),
         "-p", "no:cacheprovider", "-q", "--rootdir", str(scratch), str(prepared)],
        capture_output=True, text=True, cwd=scratch, timeout=timeout_for(notebook), env=env,
    )  # fmt: skip
    return result, logged_records(log)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_runs_once_passes_every_check_and_matches_its_outputs(
    notebook, course_work_dir, tmp_path, record_property
):
    result, records = run_once(notebook, course_work_dir, tmp_path)
    # conftest's table of the slowest checks reads this property
    record_property("check_seconds", [(record["exercise"], record["seconds"]) for record in records])
    assert result.returncode == 0, result.stdout[-4000:]
    assert [record for record in records if record["status"] != PASSED] == []
    assert sorted({record["exercise"] for record in records}) == sorted(exercise_ids(notebook))


def changed_fixture(folder: Path, old: str, new: str) -> Path:
    """A copy of the fixture solution with one piece of text replaced."""
    text = FIXTURE.read_text()
    assert old in text
    copy = folder / "solutions" / FIXTURE.name
    copy.parent.mkdir()
    copy.write_text(text.replace(old, new))
    return copy


@pytest.mark.slow
def test_a_changed_output_fails_nbval_in_the_same_run(tmp_path):
    notebook = changed_fixture(tmp_path, '"sum of 1..10: 55\\n"', '"sum of 1..10: 56\\n"')
    result, records = run_once(notebook, tmp_path, tmp_path)
    assert result.returncode != 0 and "55" in result.stdout
    assert records and {record["status"] for record in records} == {PASSED}


@pytest.mark.slow
def test_a_failing_check_is_logged_from_that_run(tmp_path):
    notebook = changed_fixture(tmp_path, "return x * x", "return 2 * x")
    _, records = run_once(notebook, tmp_path, tmp_path)
    assert {record["exercise"]: record["status"] for record in records}["99.2"] == "failed"


DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)


def definitions(source: str) -> list[str]:
    """A cell's top-level imports, functions and classes (defining them runs nothing); none if it is not Python."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in tree.body if isinstance(node, DEFINITIONS)]


def checks_only(lesson: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The lesson cut to what its checks need: the parameters, the definitions of the other cells (their imports,
    functions and classes, in order), the exercise stubs and the check cells."""
    layout = structure(solution)
    needed = {exercise.cell_id for exercise in layout.exercises} | set(layout.check_cells)
    defined: list[str] = []
    kept = []
    for cell in lesson.cells:
        if cell.cell_type != "code":
            continue
        if cell.get("id") in needed or PARAMETERS_TAG in cell.metadata.get("tags", []):
            kept.append(cell)
        else:
            defined += definitions(cell.source)
    cut = nbformat.v4.new_notebook(metadata=lesson.metadata)
    cut.cells = [nbformat.v4.new_code_cell(code) for code in dict.fromkeys(defined)] + kept
    return cut


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_lesson_reports_every_exercise_not_attempted(notebook, course_work_dir, tmp_path, monkeypatch):
    """The generated lesson, cut to what its checks need, run cell by cell in this process (no kernel: the cells
    are plain Python, and ``globals()`` in a check cell is the namespace they share): every check logs "not
    attempted"."""
    solution = read_notebook(notebook)
    lesson = checks_only(build_lesson(solution, notebook.stem), solution)
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    monkeypatch.chdir(notebook.parent)
    namespace: dict = {"__name__": "__main__"}
    for cell in lesson.cells:
        exec(compile(cell.source, f"<{notebook.stem} cell>", "exec"), namespace)  # noqa: S102 - the lesson's own code
        if PARAMETERS_TAG in cell.metadata.get("tags", []):
            namespace["WORK_DIR"] = str(course_work_dir)  # what papermill injects after the parameters
    statuses = {record["exercise"]: record["status"] for record in logged_records(log)}
    assert statuses == dict.fromkeys(exercise_ids(notebook), NOT_ATTEMPTED)


def test_committed_lessons_are_up_to_date():
    if not SOLUTIONS:
        pytest.skip("solutions/ holds no notebook yet")
    result = subprocess.run(
        [sys.executable, "-m", "helpers.course", "build", "--check"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
