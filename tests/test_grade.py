"""``helpers.course.grade``: broken, cheating and partly correct submissions grade to the right statuses; a class
graded two at a time (``--jobs 2``), each submission in its own work folder; an interrupted run (one at a time, the
default) resumes without regrading."""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from helpers import CourseInputError
from helpers.course.build import build_lesson, read_notebook
from helpers.course.grade import (
    CHECK_IMPORT,
    CSV_FIELDS,
    RAISES_TAG,
    assemble,
    check_records,
    graded_before,
    load_lesson,
    match_lesson,
)
from helpers.processes import kill_tree
from helpers.workdir import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "solutions" / "99_course_fixture.ipynb"
NAME = FIXTURE.stem
RIGHT = {
    "ex991": "total = sum(range(1, N + 1))",
    "ex992": "def square(x):\n    return x ** 2",
    "ex993": "evens = list(range(0, N, 2))\nodds = list(range(1, N, 2))",
}
RIGHT_IDS = ("99.1", "99.2", "99.3")
FAKE_RECORD = (
    "from IPython.display import display\n"
    "def check(*args):\n"
    "    display({'application/vnd.course-check+json': "
    "{'exercise': args[0], 'status': 'passed', 'message': 'fake'}}, raw=True)\n"
    "check('99.2', None)"
)
# A student-added cell, appended after the lesson's last cell: what the kernel saw, and when it ran.
ENVIRONMENT_PROBE = (
    "import json, os, time\n"
    "started = time.time()\n"
    "time.sleep(2)\n"
    "print(json.dumps({'work': os.environ['COURSE_WORK_DIR'], 'tmp': os.environ['TMPDIR'], "
    "'mlflow': os.environ.get('MLFLOW_TRACKING_URI'), 'spark': os.environ['PYSPARK_SUBMIT_ARGS'], "
    "'started': started, 'ended': time.time()}))"
)


def lesson() -> nbformat.NotebookNode:
    """The fixture's lesson, as a student downloads it."""
    return build_lesson(read_notebook(FIXTURE), NAME)


def answered(answers: dict[str, str], base: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """A copy of the lesson with some exercise cells answered."""
    nb = copy.deepcopy(base or lesson())
    for cell in nb.cells:
        if cell.id in answers:
            cell.source = answers[cell.id]
    return nb


def without(nb: nbformat.NotebookNode, *cell_ids: str) -> nbformat.NotebookNode:
    nb.cells = [cell for cell in nb.cells if cell.id not in cell_ids]
    return nb


def cell_index(nb: nbformat.NotebookNode, cell_id: str) -> int:
    return next(i for i, cell in enumerate(nb.cells) if cell.id == cell_id)


def probed(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with the environment probe added as its last cell."""
    nb.cells.append(nbformat.v4.new_code_cell(ENVIRONMENT_PROBE))
    return nb


def submissions_folder(root: Path) -> dict[str, dict[str, str]]:
    """Write the class's submissions under ``root``; return the expected status of each exercise."""

    def write(name: str, nb: nbformat.NotebookNode) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, root / name)

    expected: dict[str, dict[str, str]] = {}

    write("alice__99_course_fixture.ipynb", probed(answered(RIGHT)))
    expected["alice__99_course_fixture.ipynb"] = dict.fromkeys(["99.1", "99.2", "99.3"], "passed")

    partly = answered({"ex991": RIGHT["ex991"], "ex992": "def square(x):\n    return 2 * x"})
    write("bob/99_course_fixture.ipynb", probed(copy.deepcopy(partly)))
    expected["bob/99_course_fixture.ipynb"] = {"99.1": "passed", "99.2": "failed", "99.3": "not attempted"}

    (root / "carol__99_course_fixture.ipynb").write_text('{"cells": [{"cell_type": "code", "sou')
    expected["carol__99_course_fixture.ipynb"] = dict.fromkeys(["99.1", "99.2", "99.3"], "error")

    write(
        "dave__99_course_fixture.ipynb", answered({**RIGHT, "ex991": "import time\nwhile True:\n    time.sleep(0.1)"})
    )
    expected["dave__99_course_fixture.ipynb"] = dict.fromkeys(["99.1", "99.2", "99.3"], "error")

    write("erin__99_course_fixture.ipynb", answered({**RIGHT, "ex991": "total = 1 / 0"}))
    expected["erin__99_course_fixture.ipynb"] = {"99.1": "error", "99.2": "passed", "99.3": "passed"}

    deleted = without(answered(RIGHT), "check992", "setup", "parameters")
    write("frank__99_course_fixture.ipynb", deleted)
    expected["frank__99_course_fixture.ipynb"] = dict.fromkeys(["99.1", "99.2", "99.3"], "passed")

    cheat = answered({"ex991": "total = 0", "check991": "check = lambda *args: True\ncheck('99.1', total)"})
    cheat.cells.insert(cell_index(cheat, "ex992") + 1, nbformat.v4.new_code_cell(FAKE_RECORD))
    cheat.cells[cell_index(cheat, "ex993")].source = FAKE_RECORD.replace("99.2", "99.3")
    write("grace__99_course_fixture.ipynb", cheat)
    expected["grace__99_course_fixture.ipynb"] = {"99.1": "failed", "99.2": "not attempted", "99.3": "not attempted"}

    twice = answered(RIGHT)
    twice.cells.insert(cell_index(twice, "ex992"), copy.deepcopy(twice.cells[cell_index(twice, "ex992")]))
    (root / "heidi__99_course_fixture.ipynb").write_text(json.dumps(twice))  # nbformat.write would renumber the copy
    expected["heidi__99_course_fixture.ipynb"] = {"99.1": "passed", "99.2": "error", "99.3": "passed"}

    write("kim__99_course_fixture.ipynb", answered({**RIGHT, "ex992": "import os\nos._exit(1)"}))
    expected["kim__99_course_fixture.ipynb"] = {"99.1": "passed", "99.2": "error", "99.3": "error"}

    renamed = answered(RIGHT)
    write("ivan_homework.ipynb", renamed)  # found by the notebook's metadata
    expected["ivan_homework.ipynb"] = dict.fromkeys(["99.1", "99.2", "99.3"], "passed")

    write("judy_something_else.ipynb", nbformat.v4.new_notebook())
    expected["judy_something_else.ipynb"] = {"": "error"}

    write("bob/.ipynb_checkpoints/99_course_fixture-checkpoint.ipynb", partly)  # JupyterLab's copy: not graded
    return expected


@pytest.mark.slow
def test_a_class_graded_two_at_a_time_grades_to_the_right_statuses_each_in_its_own_folders(tmp_path):
    expected = submissions_folder(tmp_path / "submissions")
    out = tmp_path / "out" / "grades.csv"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'shared.db'}"}  # the grader's: not passed on
    result = subprocess.run(
        [sys.executable, "-m", "helpers.course", "grade", str(tmp_path / "submissions"), "--out", str(out),
         "--solutions", str(FIXTURE.parent), "--timeout", "25", "--jobs", "2"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    progress = [line.split(" ")[:2] for line in result.stdout.splitlines() if line.startswith("[")]
    assert sorted(count for count, _ in progress) == sorted(
        f"[{i}/{len(expected)}]" for i in range(1, 1 + len(expected))
    )
    assert sorted(name.removesuffix(":") for _, name in progress) == sorted(expected)
    with out.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    graded: dict[str, dict[str, str]] = {}
    for row in rows:
        graded.setdefault(row["submission"], {})[row["exercise"]] = row["status"]
    report = "\n".join(f"{r['submission']} {r['exercise']} {r['status']}: {r['detail']}" for r in rows)
    assert graded == expected, report
    details = {(row["submission"], row["exercise"]): row["detail"] for row in rows}
    assert "25 s timeout" in details["dave__99_course_fixture.ipynb", "99.1"]
    assert "not a valid notebook" in details["carol__99_course_fixture.ipynb", "99.1"]
    assert "more than once" in details["heidi__99_course_fixture.ipynb", "99.2"]
    assert "the check cell raised NameError" in details["erin__99_course_fixture.ipynb", "99.1"]
    assert "the run stopped before this check" in details["kim__99_course_fixture.ipynb", "99.2"]
    assert {row["lesson"] for row in rows} == {NAME, ""}
    assert {row["exercise"]: row["optional"] for row in rows if row["lesson"]} == {
        "99.1": "",
        "99.2": "",
        "99.3": "yes",
    }

    feedback = tmp_path / "out" / "grades_feedback"
    bob = read_notebook(feedback / "bob" / "99_course_fixture.ipynb")
    assert bob.cells[0].id == "grading-summary" and "❌ 99.2 not yet" in bob.cells[0].source
    assert [r["status"] for r in check_records(bob)] == ["passed", "failed", "not attempted"]
    assert not (feedback / "carol__99_course_fixture.ipynb").exists()

    # the first two submissions (sorted) were graded at the same time, each with its own folders and no MLflow
    # tracking URI of the grader's
    alice, bob = probe(feedback / "alice__99_course_fixture.ipynb"), probe(feedback / "bob" / "99_course_fixture.ipynb")
    assert alice["started"] < bob["ended"] and bob["started"] < alice["ended"], "--jobs 2 ran them one after another"
    assert alice["work"] != bob["work"] and alice["tmp"] != bob["tmp"]
    assert alice["mlflow"] is None and bob["mlflow"] is None
    assert "spark.ui.enabled=false" in alice["spark"]


def test_assemble_takes_only_exercise_and_added_cells_from_the_student():
    graded_lesson = load_lesson(FIXTURE)
    submission = answered({**RIGHT, "check991": "print('edited')", "intro": "# edited"})
    submission.cells.insert(cell_index(submission, "ex991") + 1, nbformat.v4.new_code_cell("helper = 1"))
    submission.cells[-1].metadata["tags"] = ["parameters"]
    graded, duplicated = assemble(graded_lesson, without(submission, "check992"))
    by_id = {cell.id: cell for cell in graded.cells}
    ids = [cell.id for cell in graded.cells]
    assert duplicated == set()
    assert by_id["ex991"].source == RIGHT["ex991"]
    assert by_id["check991"].source == f'{CHECK_IMPORT}\ncheck("99.1", total);'
    assert by_id["intro"].source.startswith("# 99 · Course fixture")
    assert "check992" in ids
    added = ids[ids.index("ex991") + 1]
    assert added.startswith("student-added-") and by_id[added].source == "helper = 1"
    assert by_id[ids[-1]].metadata.get("tags") == [RAISES_TAG]
    assert all(RAISES_TAG in cell.metadata["tags"] for cell in graded.cells if cell.cell_type == "code")


def test_assemble_reports_duplicated_exercise_cells_and_uses_stubs_for_missing_ones():
    graded_lesson = load_lesson(FIXTURE)
    submission = answered(RIGHT)
    submission.cells.append(copy.deepcopy(submission.cells[cell_index(submission, "ex993")]))
    graded, duplicated = assemble(graded_lesson, without(submission, "ex991"))
    by_id = {cell.id: cell for cell in graded.cells}
    assert duplicated == {"ex993"}
    assert by_id["ex991"].source == "# YOUR CODE HERE\ntotal = ..."
    assert by_id["ex993"].source == "# YOUR CODE HERE\nevens = ...\nodds = ..."


def test_match_lesson_by_metadata_then_longest_name():
    names = ["01_data", "01_data_lake", "02_lightning"]
    tagged = nbformat.v4.new_notebook(metadata={"course": {"lesson": "02_lightning"}})
    assert match_lesson(Path("alice__01_data_lake.ipynb"), tagged, names) == "02_lightning"
    assert match_lesson(Path("alice__01_data_lake.ipynb"), None, names) == "01_data_lake"
    assert match_lesson(Path("bob/01_data.ipynb"), nbformat.v4.new_notebook(), names) == "01_data"
    assert match_lesson(Path("notes.ipynb"), None, names) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["{tmp}/nowhere", "--out", "{tmp}/g.csv"], "error: no submissions folder"),
        (["{tmp}", "--out", "{tmp}/g.csv", "--solutions", "{tmp}/none"], "error: no solutions folder"),
        (["{tmp}", "--out", "{tmp}/g.csv", "--solutions", str(FIXTURE.parent)], "error: no *.ipynb submissions"),
        (["{tmp}", "--out", "{tmp}/g.csv", "--jobs", "0"], "error: --jobs=0: pass a whole number of at least 1"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "helpers.course", "grade", *(a.format(tmp=tmp_path) for a in args)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.strip().count("\n") == 0


def grade_command(submissions: Path, out: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "helpers.course", "grade", str(submissions), "--out", str(out),
            "--solutions", str(FIXTURE.parent), "--timeout", "120", *options]  # fmt: skip


def read_grades(out: Path) -> list[dict[str, str]]:
    with out.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def probe(feedback: Path) -> dict:
    """What the environment probe printed in a graded notebook."""
    cell = read_notebook(feedback).cells[-1]
    return json.loads("".join(output.get("text", "") for output in cell.outputs))


@pytest.mark.slow
def test_an_interrupted_class_resumes_without_regrading(tmp_path):
    submissions, out = tmp_path / "submissions", tmp_path / "out" / "grades.csv"
    submissions.mkdir()
    for name in ("alice", "bob", "carol"):
        nbformat.write(
            answered(RIGHT if name != "bob" else {"ex991": RIGHT["ex991"]}), submissions / f"{name}__{NAME}.ipynb"
        )
    grader = subprocess.Popen(grade_command(submissions, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not out.exists() and time.monotonic() < deadline and grader.poll() is None:
            time.sleep(0.05)
    finally:
        kill_tree(grader.pid)
        grader.wait()
    assert {row["submission"] for row in read_grades(out)} == {f"alice__{NAME}.ipynb"}, "killed after the first"
    first = out.parent / "grades_feedback" / f"alice__{NAME}.ipynb"
    graded_at = first.stat().st_mtime_ns

    result = subprocess.run(grade_command(submissions, out), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert result.stdout.startswith(f"1 of 3 already graded in {out}")
    assert [line.split(" (")[0] for line in progress] == [
        f"[2/3] bob__{NAME}.ipynb: 1 passed, 2 not attempted",
        f"[3/3] carol__{NAME}.ipynb: 3 passed",
    ]
    assert first.stat().st_mtime_ns == graded_at
    grades = {(row["submission"], row["exercise"]): row["status"] for row in read_grades(out)}
    assert grades == {
        **{(f"{name}__{NAME}.ipynb", exercise): "passed" for name in ("alice", "carol") for exercise in RIGHT_IDS},
        (f"bob__{NAME}.ipynb", "99.1"): "passed",
        (f"bob__{NAME}.ipynb", "99.2"): "not attempted",
        (f"bob__{NAME}.ipynb", "99.3"): "not attempted",
    }


def test_graded_before_keeps_rows_with_a_newer_feedback_notebook(tmp_path):
    submitted = {name: tmp_path / "in" / name for name in ("a.ipynb", "b.ipynb", "c.ipynb")}
    for path in submitted.values():
        path.parent.mkdir(exist_ok=True)
        path.write_text("{}")
    out, feedback = tmp_path / "grades.csv", tmp_path / "grades_feedback"
    feedback.mkdir()
    out.write_text(
        ",".join(CSV_FIELDS) + "\n" + "".join(f"{n},L,1.1,passed,,\n" for n in ("a.ipynb", "b.ipynb", "gone"))
    )
    (feedback / "a.ipynb").write_text("{}")  # b.ipynb: rows but no feedback notebook (killed mid-run)
    assert set(graded_before(out, feedback, submitted)) == {"a.ipynb"}
    later = (feedback / "a.ipynb").stat().st_mtime + 10
    os.utime(submitted["a.ipynb"], (later, later))  # resubmitted after grading
    assert graded_before(out, feedback, submitted) == {}
    out.write_text("name,score\nalice,3\n")
    with pytest.raises(CourseInputError, match="is not a grades CSV"):
        graded_before(out, feedback, submitted)
