"""Grade a class's notebooks: ``python -m helpers.course grade SUBMISSIONS_DIR --out grades.csv``.

Every ``*.ipynb`` under ``SUBMISSIONS_DIR`` is a submission (checkpoint and hidden folders are skipped); its name
is its path relative to that folder, so both ``alice__01_data_lake_petastorm.ipynb`` and
``alice/01_data_lake_petastorm.ipynb`` work. Its lesson is the ``course.lesson`` entry of the notebook's metadata
(``helpers.course build`` writes it) or else the longest solution name (``01_data_lake_petastorm``) contained in
the file name.

The notebook that runs is the lesson built from the solution, with only the student's exercise cells (matched by
cell id) and the cells the student added; check cells, the parameters cell and everything else come from the
lesson, so edited or deleted checks can neither cheat nor break grading: each check cell re-imports ``check``
first, and only records printed by the lesson's own check cells count. (The student's code runs in the same
kernel, so this stops accidents and casual cheats, not a determined attacker.) The notebook runs with papermill in
its own process, under a per-notebook timeout, with the CI parameters and errors allowed. Each exercise's status
comes from the record its check cell printed: passed, failed, not attempted, or error (the check's own code raised,
or no record: a timeout, a dead kernel, a check cell that raised; or a duplicated exercise cell, or a file that is
not a notebook).
``grades.csv`` gets one row per exercise (submission, lesson, exercise, status, detail, optional: "yes" for a
stretch exercise) and the executed notebooks, with a summary on top, go to ``grades_feedback/`` next to it. One
bad submission never stops the run.

``--jobs N`` grades N submissions at a time. Each runs isolated (:func:`isolated_env`): its own work folder (the
``WORK_DIR`` parameter and ``COURSE_WORK_DIR``), hence its own Delta tables, Petastorm cache and MLflow store (an
``MLFLOW_TRACKING_URI`` set for the grader is not passed on), its own ``TMPDIR``, and no Spark web UI, the one
fixed port the lessons use (4040, with 16 retries); the other ports are picked free at run time (torchrun
``--standalone``, Horovod's Gloo rendezvous, lesson 4's cluster). One line is printed per finished submission:
``[n/N] name: counts (seconds)``. The CSV is rewritten after each one, so a run that stops half-way (Ctrl-C, a
crash, a closed laptop) loses only the notebooks that were running: run the same command again and the
submissions already graded (rows in the CSV, and a feedback notebook newer than the submission) are kept, the rest
graded; ``--regrade`` grades everything again. Ctrl-C starts no new submission and waits for those running.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from helpers import CourseInputError
from helpers.course.build import (
    SOLUTIONS_DIR,
    Structure,
    build_lesson,
    display_path,
    problems,
    read_notebook,
    solution_notebooks,
    structure,
)
from helpers.course.checks import ERROR, MIMETYPE, NOT_ATTEMPTED, PASSED, format_line
from helpers.course.run import execute
from helpers.validation import whole_number

__all__ = [
    "CHECK_IMPORT",
    "CSV_FIELDS",
    "DEFAULT_TIMEOUT_S",
    "Grade",
    "Lesson",
    "RAISES_TAG",
    "STATUSES",
    "add_arguments",
    "allow_errors",
    "assemble",
    "cell_records",
    "check_records",
    "command",
    "grade",
    "grade_submission",
    "graded_before",
    "isolated_env",
    "load_lesson",
    "match_lesson",
    "read_submission",
    "submissions",
]

DEFAULT_TIMEOUT_S = 600
RAISES_TAG = "raises-exception"
STATUSES = (PASSED, "failed", NOT_ATTEMPTED, ERROR)
CSV_FIELDS = ("submission", "lesson", "exercise", "status", "detail", "optional")
CHECK_IMPORT = "from helpers.course.checks import check  # the grader's: a `check` defined by the student is not used"


@dataclass(frozen=True)
class Grade:
    """One row of ``grades.csv``."""

    submission: str
    lesson: str
    exercise: str
    status: str
    detail: str = ""
    optional: bool = False


@dataclass(frozen=True)
class Lesson:
    """A lesson as the grader needs it: the notebook built from its solution, and its exercise layout."""

    name: str
    notebook: NotebookNode
    layout: Structure
    solution_dir: Path


def allow_errors(nb: NotebookNode) -> NotebookNode:
    """Tag every code cell ``raises-exception`` so that execution goes on past errors.

    Args:
        nb: the notebook, changed in place.

    Returns:
        ``nb``.
    """
    for cell in nb.cells:
        if cell.cell_type == "code":
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
    return nb


def _record(output: NotebookNode) -> dict | None:
    """The check record an output carries, if any."""
    data = output.get("data", {}) if output.get("output_type") in ("display_data", "execute_result") else {}
    record = data.get(MIMETYPE)
    if isinstance(record, str):
        try:
            record = json.loads(record)
        except json.JSONDecodeError:
            return None
    return record if isinstance(record, dict) and {"exercise", "status"} <= record.keys() else None


def cell_records(cell: NotebookNode) -> list[dict]:
    """The check records in one executed cell's outputs.

    Args:
        cell: an executed code cell.

    Returns:
        The records (``exercise``, ``status``, ``message``...), in order.
    """
    return [record for output in cell.get("outputs", []) if (record := _record(output)) is not None]


def check_records(nb: NotebookNode) -> list[dict]:
    """Every check record in an executed notebook's outputs.

    Args:
        nb: the executed notebook.

    Returns:
        The records, in order.
    """
    return [record for cell in nb.cells for record in cell_records(cell)]


def load_lesson(solution_path: Path) -> Lesson:
    """The lesson built from a solution, with its exercise layout.

    Args:
        solution_path: the solution notebook.

    Returns:
        The lesson as the grader needs it.

    Raises:
        CourseInputError: the solution is unreadable or breaks the conventions.
    """
    solution = read_notebook(solution_path)
    found = problems(solution, solution_path.stem)
    if found:
        raise CourseInputError(f"{display_path(solution_path)}: {found[0]}")
    lesson = build_lesson(solution, solution_path.stem)
    return Lesson(solution_path.stem, lesson, structure(solution), solution_path.parent)


def read_submission(path: Path) -> dict:
    """A submitted notebook as plain JSON (nbformat would silently renumber duplicated cell ids).

    Args:
        path: the submitted file.

    Returns:
        The notebook's JSON.

    Raises:
        ValueError: with the reason, for a file that is not an nbformat 4 notebook.
    """
    try:
        submission = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{type(error).__name__}: {error}") from None
    if not isinstance(submission, dict) or not isinstance(submission.get("cells"), list):
        raise ValueError("no list of cells (is it an nbformat 4 notebook?)")
    return submission


def match_lesson(path: Path, submission: dict | None, names: Sequence[str]) -> str | None:
    """The lesson a submission is for.

    Args:
        path: the submission's path (its file name is searched for a lesson name).
        submission: its JSON, or None if unreadable.
        names: the lessons' names (``01_data_lake_petastorm``...).

    Returns:
        Its metadata's ``course.lesson`` if that is one of ``names``, else the longest of ``names`` in its file
        name, else None.
    """
    metadata = (submission or {}).get("metadata")
    course = metadata.get("course") if isinstance(metadata, dict) else None
    named = course.get("lesson") if isinstance(course, dict) else None
    if named in names:
        return named
    candidates = [name for name in names if name in path.name]
    return max(candidates, key=len) if candidates else None


def _cell_id(cell: dict) -> str | None:
    """A submitted cell's id (None when it has none, or a broken one)."""
    cell_id = cell.get("id")
    return cell_id if isinstance(cell_id, str) else None


def _source(cell: dict) -> str:
    """A submitted cell's source as one string (hand-edited files may hold a list of lines, or junk)."""
    source = cell.get("source", "")
    if isinstance(source, list):
        return "".join(str(line) for line in source)
    return source if isinstance(source, str) else ""


def _fresh_cell(cell: dict, cell_id: str) -> NotebookNode:
    """A copy of a student's own cell: its source only (no tags, no outputs), under ``cell_id``."""
    make = {
        "markdown": nbformat.v4.new_markdown_cell,
        "raw": nbformat.v4.new_raw_cell,
    }.get(cell.get("cell_type"), nbformat.v4.new_code_cell)
    new = make(_source(cell))
    new.id = cell_id
    return new


def assemble(lesson: Lesson, submission: dict) -> tuple[NotebookNode, set[str]]:
    """The notebook to run: the lesson, with the student's exercise cells and added cells; all errors allowed.

    Args:
        lesson: the lesson the submission is for.
        submission: the submission's JSON.

    Returns:
        The notebook, and the ids of exercise cells the submission holds more than once (graded "error").
    """
    exercise_cells = {exercise.cell_id for exercise in lesson.layout.exercises}
    known = {cell.id for cell in lesson.notebook.cells}
    cells = [(_cell_id(cell), cell) for cell in submission["cells"] if isinstance(cell, dict)]
    counts = Counter(cell_id for cell_id, _ in cells)
    duplicated = {cell_id for cell_id in exercise_cells if counts[cell_id] > 1}
    answers = {
        cell_id: _source(cell) for cell_id, cell in cells if cell_id in exercise_cells and cell_id not in duplicated
    }
    added: dict[str | None, list[NotebookNode]] = defaultdict(list)
    anchor = None
    for number, (cell_id, cell) in enumerate(cells):
        if cell_id in known:
            anchor = cell_id
        else:
            added[anchor].append(_fresh_cell(cell, f"student-added-{number}"))
    graded = nbformat.v4.new_notebook(metadata=copy.deepcopy(lesson.notebook.metadata))
    graded.cells.extend(added[None])
    for cell in lesson.notebook.cells:
        restored = copy.deepcopy(cell)
        if cell.id in answers:
            restored.source = answers[cell.id]
        elif cell.id in lesson.layout.check_cells:
            restored.source = f"{CHECK_IMPORT}\n{cell.source}"
        graded.cells.append(restored)
        graded.cells.extend(added[cell.id])
    return allow_errors(graded), duplicated


def _read_output(path: Path) -> NotebookNode | None:
    """An executed notebook, or None if papermill left none (or half a file) behind."""
    try:
        return nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - a run killed mid-write leaves anything behind
        return None


def _statuses(lesson: Lesson, executed: NotebookNode | None) -> dict[str, tuple[str, str]]:
    """``exercise id -> (status, message)`` from the records of the lesson's own check cells."""
    found: dict[str, tuple[str, str]] = {}
    if executed is None:
        return found
    for cell in executed.cells:
        owned = lesson.layout.check_cells.get(cell.get("id"), ())
        for record in cell_records(cell):
            if record["exercise"] in owned:
                status = record["status"] if record["status"] in STATUSES else ERROR
                found[record["exercise"]] = (status, str(record.get("message", "")))
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                raised = f"the check cell raised {output.get('ename')}: {output.get('evalue')}"
                found.update({exercise_id: (ERROR, raised) for exercise_id in owned if exercise_id not in found})
    return found


def _add_summary(path: Path, executed: NotebookNode, grades: list[Grade]) -> None:
    """Put a markdown cell with the grades at the top of the feedback notebook."""
    lines = [
        f"- {format_line(g.exercise, g.status, g.detail)}{' (stretch, optional)' if g.optional else ''}" for g in grades
    ]
    summary = nbformat.v4.new_markdown_cell("## Grading summary\n\n" + "\n".join(lines))
    summary.id = "grading-summary"
    executed.cells.insert(0, summary)
    nbformat.write(executed, path)


def isolated_env(tmp: Path) -> dict[str, str | None]:
    """The environment variables one submission's notebook runs with, so that parallel gradings share nothing.

    Args:
        tmp: the submission's own temporary folder (its ``TMPDIR`` goes under it).

    Returns:
        The variables for :func:`helpers.course.run.execute` (None: removed): the Spark web UI off (its port
        is the one the lessons do not pick free), no MLflow store but the one in the work folder, ``TMPDIR``.
    """
    temp = tmp / "tmp"
    temp.mkdir(exist_ok=True)
    submit = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    return {
        "PYSPARK_SUBMIT_ARGS": f"--conf spark.ui.enabled=false {submit}",
        "MLFLOW_TRACKING_URI": None,
        "MLFLOW_REGISTRY_URI": None,
        "TMPDIR": str(temp),
    }


def grade_submission(
    path: Path, name: str, lessons: dict[str, Path], feedback: Path, timeout: float, cache: dict[str, Lesson]
) -> list[Grade]:
    """Grade one submission; every failure becomes "error" rows, never an exception.

    Args:
        path: the submitted notebook.
        name: its name in the CSV (its path relative to the submissions folder).
        lessons: the solution notebooks by name.
        feedback: where the executed notebook goes.
        timeout: seconds the notebook may run.
        cache: lessons already built, by name (filled in).

    Returns:
        One row per exercise of its lesson (one "error" row if no lesson matches).
    """
    try:
        submission, unreadable = read_submission(path), ""
    except ValueError as error:
        submission, unreadable = None, f"not a valid notebook: {error}"
    lesson_name = match_lesson(path, submission, sorted(lessons))
    if lesson_name is None:
        return [Grade(name, "", "", ERROR, "no solution matches its metadata or file name")]
    try:
        lesson = cache.get(lesson_name) or cache.setdefault(lesson_name, load_lesson(lessons[lesson_name]))
    except CourseInputError as error:
        return [Grade(name, lesson_name, "", ERROR, str(error))]
    exercise_ids = lesson.layout.exercise_ids
    if submission is None:
        return [Grade(name, lesson.name, exercise_id, ERROR, unreadable) for exercise_id in exercise_ids]
    graded, duplicated = assemble(lesson, submission)
    feedback.parent.mkdir(parents=True, exist_ok=True)
    feedback.unlink(missing_ok=True)  # never read a stale result from an earlier grading run
    with tempfile.TemporaryDirectory(prefix="grade-", ignore_cleanup_errors=True) as tmp:
        source = Path(tmp) / "graded.ipynb"
        nbformat.write(graded, source)
        # WORK_DIR only: the other parameters' defaults are the CI settings
        params = {"WORK_DIR": str(Path(tmp) / "work")}
        env = isolated_env(Path(tmp))
        run = execute(source, feedback, parameters=params, cwd=lesson.solution_dir, env=env, timeout=timeout)
    executed = _read_output(feedback)
    found = _statuses(lesson, executed)
    if run.timed_out:
        missing = f"no check result: the notebook ran past the {timeout:g} s timeout"
    else:
        last = run.log_tail.splitlines()[-1] if run.log_tail else ""
        missing = f"no check result: the run stopped before this check (exit {run.returncode}) {last}".strip()
    grades = []
    for exercise in lesson.layout.exercises:
        for exercise_id in exercise.check_ids:
            if exercise.cell_id in duplicated:
                status, detail = ERROR, "the exercise cell appears more than once"
            else:
                status, detail = found.get(exercise_id, (ERROR, missing))
            grades.append(Grade(name, lesson.name, exercise_id, status, detail, exercise.stretch))
    if executed is not None:
        _add_summary(feedback, executed, grades)
    return grades


def submissions(folder: Path, skip: Path) -> list[Path]:
    """The submitted notebooks.

    Args:
        folder: the submissions folder, searched recursively.
        skip: a folder left out (the grader's own feedback folder).

    Returns:
        Every ``*.ipynb`` under ``folder`` but checkpoints, hidden folders and ``skip``, sorted.
    """
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        relative = path.relative_to(folder).parts
        if any(part.startswith(".") for part in relative[:-1]) or path.resolve().is_relative_to(skip.resolve()):
            continue
        found.append(path)
    return found


def graded_before(out: Path, feedback_dir: Path, names: dict[str, Path]) -> dict[str, list[Grade]]:
    """The submissions an earlier run of the grader finished, with their rows.

    Args:
        out: the CSV that run wrote (may not exist).
        feedback_dir: its feedback notebooks' folder.
        names: the submissions now, by name.

    Returns:
        The rows of each submission still in ``names`` that has rows in ``out`` and a feedback notebook at least
        as new as the submission (a resubmitted notebook is graded again). Unreadable or unmatched submissions
        have no feedback notebook: they are checked again (in no time).

    Raises:
        CourseInputError: ``out`` exists but is not a grades CSV (it is left alone).
    """
    if not out.is_file():
        return {}
    with out.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        if next(reader, None) != list(CSV_FIELDS):
            raise CourseInputError(f"{out} is not a grades CSV (no {','.join(CSV_FIELDS)} header): pick another --out")
        rows = [row for row in reader if len(row) == len(CSV_FIELDS)]
    found: dict[str, list[Grade]] = defaultdict(list)
    for name, lesson, exercise, status, detail, optional in rows:
        found[name].append(Grade(name, lesson, exercise, status, detail, optional == "yes"))

    def finished(name: str) -> bool:
        notebook = feedback_dir / name
        return notebook.is_file() and notebook.stat().st_mtime >= names[name].stat().st_mtime

    return {name: rows for name, rows in found.items() if name in names and finished(name)}


def _write_csv(out: Path, grades: list[Grade]) -> None:
    """Replace ``out`` with these rows in one step (a run killed mid-write leaves the previous file)."""
    partial = out.with_name(f".{out.name}.partial")
    with partial.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_FIELDS)
        writer.writerows(
            (g.submission, g.lesson, g.exercise, g.status, g.detail, "yes" if g.optional else "") for g in grades
        )
    partial.replace(out)


def _counts(rows: list[Grade]) -> str:
    """``3 passed, 1 failed``: a submission's statuses, for the progress line."""
    counts = Counter(row.status for row in rows)
    return ", ".join(f"{counts[status]} {status}" for status in STATUSES if counts[status])


def grade(
    submissions_dir: Path,
    out: Path,
    solutions_dir: Path = SOLUTIONS_DIR,
    timeout: float = DEFAULT_TIMEOUT_S,
    jobs: int = 1,
    regrade: bool = False,
) -> list[Grade]:
    """Grade every submission of a class; write ``out`` (CSV) and the executed notebooks to ``<out stem>_feedback/``.

    Args:
        submissions_dir: the submitted notebooks' folder.
        out: the CSV to write; the submissions it already grades are kept (see :func:`graded_before`).
        solutions_dir: the solution notebooks' folder.
        timeout: seconds each notebook may run.
        jobs: how many submissions are graded at a time, each isolated (:func:`isolated_env`).
        regrade: grade every submission again, ignoring ``out``.

    Returns:
        The CSV's rows, in the submissions' order.

    Raises:
        CourseInputError: no submissions folder, no solutions, no submission, ``jobs`` below 1, or an ``out``
            that is not a grades CSV.
    """
    jobs = whole_number("--jobs", jobs, hint="It is how many submissions are graded at a time.")
    if not submissions_dir.is_dir():
        raise CourseInputError(f"no submissions folder at {submissions_dir}")
    lessons = {path.stem: path for path in solution_notebooks(solutions_dir)}
    if not lessons:
        raise CourseInputError(f"no solution notebooks in {display_path(solutions_dir)}")
    feedback_dir = out.parent / f"{out.stem}_feedback"
    names = {path.relative_to(submissions_dir).as_posix(): path for path in submissions(submissions_dir, feedback_dir)}
    if not names:
        raise CourseInputError(f"no *.ipynb submissions under {submissions_dir}")
    results = {} if regrade else graded_before(out, feedback_dir, names)
    if results:
        print(f"{len(results)} of {len(names)} already graded in {out} (kept; --regrade grades them again)", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    cache: dict[str, Lesson] = {}

    def timed(name: str) -> tuple[list[Grade], float]:
        started = time.monotonic()
        rows = grade_submission(names[name], name, lessons, feedback_dir / name, timeout, cache)
        return rows, time.monotonic() - started

    def in_order() -> list[Grade]:
        return [row for name in names for row in results.get(name, [])]

    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="grade") as pool:
        futures = {pool.submit(timed, name): name for name in names if name not in results}
        try:
            for future in as_completed(futures):
                name = futures[future]
                results[name], seconds = future.result()
                _write_csv(out, in_order())
                print(f"[{len(results)}/{len(names)}] {name}: {_counts(results[name])} ({seconds:.0f} s)", flush=True)
        except KeyboardInterrupt:
            print("interrupted: the notebooks running finish and are recorded; run again to grade the rest", flush=True)
            pool.shutdown(wait=True, cancel_futures=True)
            for future, name in futures.items():
                if name not in results and not future.cancelled() and future.exception() is None:
                    results[name] = future.result()[0]
            _write_csv(out, in_order())
            raise
    _write_csv(out, in_order())
    return in_order()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``grade`` subcommand's options (``python -m helpers.course grade --help``).

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument("submissions", type=Path, help="folder of submitted notebooks (searched recursively)")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write; feedback goes to <name>_feedback/")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS_DIR, help="solution notebooks folder")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per notebook")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at a time, each isolated (default 1)")
    parser.add_argument("--regrade", action="store_true", help="grade again the submissions --out already grades")


def command(args: argparse.Namespace) -> int:
    """Run the ``grade`` subcommand: write the CSV and the feedback notebooks, print where they are.

    Args:
        args: the options :func:`add_arguments` declared, parsed.

    Returns:
        The exit status, 0.

    Raises:
        CourseInputError: a non-positive timeout, or see :func:`grade`.
    """
    if args.timeout <= 0:
        raise CourseInputError(f"--timeout {args.timeout:g}: pass a positive number of seconds per notebook.")
    grades = grade(args.submissions, args.out, args.solutions, args.timeout, args.jobs, args.regrade)
    print(f"wrote {args.out} ({len(grades)} rows) and {args.out.parent / (args.out.stem + '_feedback')}/")
    return 0
