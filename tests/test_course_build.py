"""``helpers.course``: solutions are the single source, lessons are generated and checked for staleness."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import CourseInputError
from helpers.course.build import (
    SOLUTIONS_DIR,
    bound_names,
    build_lesson,
    check_ids,
    problems,
    read_notebook,
    strip_solutions,
    structure,
)
from helpers.course.cli import main
from helpers.workdir import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "solutions" / "99_course_fixture.ipynb"
NAME = FIXTURE.stem


@pytest.fixture
def course(tmp_path) -> tuple[Path, Path]:
    """A solutions folder holding the fixture, and an empty lessons folder."""
    solutions, lessons = tmp_path / "solutions", tmp_path / "lessons"
    solutions.mkdir()
    shutil.copy(FIXTURE, solutions)
    return solutions, lessons


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m helpers.course ...`` as CI runs it."""
    return subprocess.run(
        [sys.executable, "-m", "helpers.course", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )


def test_top_level_region_keeps_the_names_it_binds():
    source = (
        "x = 1\n### BEGIN SOLUTION\nimport numpy as np\na, (b, *c) = 1, (2, 3)\n"
        "for i in range(3):\n    pass\ndef f():\n    inner = 1\nclass K:\n    pass\n### END SOLUTION\nprint(a)"
    )
    assert strip_solutions(source, "cell") == (
        "x = 1\n# YOUR CODE HERE\nnp = ...\na = ...\nb = ...\nc = ...\ni = ...\nf = ...\nK = ...\nprint(a)"
    )


def test_region_binding_nothing_becomes_a_bare_ellipsis():
    assert strip_solutions("### BEGIN SOLUTION\nprint('hi')\ndf['x'] = 1\n### END SOLUTION", "c") == (
        "# YOUR CODE HERE\n..."
    )


def test_indented_region_keeps_its_indentation():
    head = 'class M:\n    def f(self):\n        """Doc."""\n'
    source = head + "        ### BEGIN SOLUTION\n        return 1\n        ### END SOLUTION"
    assert strip_solutions(source, "c") == head + "        # YOUR CODE HERE\n        ..."


@pytest.mark.parametrize(
    "source, message",
    [
        ("### BEGIN SOLUTION\nx = 1", "without an"),
        ("x = 1\n### END SOLUTION", "without a"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another"),
        ("### BEGIN SOLUTION\nx = (\n### END SOLUTION", "not valid Python"),
    ],
)
def test_bad_regions_are_reported_with_their_cell(source, message):
    with pytest.raises(CourseInputError, match=message) as error:
        strip_solutions(source, "01_x cell 4 (abc)")
    assert "01_x cell 4 (abc)" in str(error.value)


def test_bound_names_handles_compound_statements_and_magics():
    code = "%matplotlib inline\nwith open('f') as fh:\n    data = fh.read()\nif data:\n    from os import path as p\n"
    assert bound_names(code) == ["fh", "data", "p"]


def test_check_ids_in_source_order():
    assert check_ids('check("1.2", a)\nok = check("1.1", globals());\ncheck("1.2", b)') == ["1.2", "1.1"]
    assert check_ids("print('check(\"1.1\", x)')") == []


def test_lesson_from_the_fixture():
    solution = read_notebook(FIXTURE)
    lesson = build_lesson(solution, NAME)
    by_id = {cell.id: cell for cell in lesson.cells}
    kept = [c.id for c in solution.cells if "solution-only" not in c.metadata.get("tags", [])]
    assert [cell.id for cell in lesson.cells] == kept
    assert "ex991-solution-note" not in by_id
    assert by_id["ex991"].source == "# YOUR CODE HERE\ntotal = ..."
    assert by_id["ex992"].source.endswith('"""Return x squared."""\n    # YOUR CODE HERE\n    ...')
    assert by_id["ex993"].source == "# YOUR CODE HERE\nevens = ...\nodds = ..."
    assert all(c.outputs == [] and c.execution_count is None for c in lesson.cells if c.cell_type == "code")
    assert lesson.metadata["kernelspec"] == solution.metadata["kernelspec"]
    assert lesson.metadata["course"] == {"title": "Course fixture", "lesson": NAME}
    assert "BEGIN SOLUTION" not in nbformat.writes(lesson)
    nbformat.validate(lesson)


def test_fixture_structure_and_conventions():
    solution = read_notebook(FIXTURE)
    layout = structure(solution)
    assert [(e.cell_id, e.check_ids) for e in layout.exercises] == [
        ("ex991", ("99.1",)),
        ("ex992", ("99.2",)),
        ("ex993", ("99.3",)),
    ]
    assert layout.exercise_ids == ["99.1", "99.2", "99.3"]
    assert problems(solution, NAME) == []


def test_problems_name_each_broken_convention():
    solution = read_notebook(FIXTURE)
    solution.cells = [c for c in solution.cells if c.id not in ("check992", "parameters")]
    solution.cells.append(nbformat.v4.new_code_cell('check("5.1", x)'))
    del solution.cells[0]["id"]
    found = "\n".join(problems(solution, NAME))
    assert "cells without ids" in found
    assert "exercise cell ex992 is not followed by a check cell" in found
    assert "exactly one code cell tagged 'parameters'" in found
    assert "5.1 does not start with the lesson number 99" in found


def test_problems_name_exercises_out_of_reading_order_and_ids_that_do_not_say_what_they_hold():
    solution = read_notebook(FIXTURE)
    by_id = {cell.id: cell for cell in solution.cells}
    by_id["check992"].source, by_id["check993"].source = 'check("99.3", globals());', 'check("99.2", globals());'
    by_id["ex991-md"].id, by_id["setup"].id = "sum-md", "9bf2c3ad"
    by_id["ex993-md"].source = "**Exercise 99.4**: the shards."
    found = problems(solution, NAME)
    assert "exercise cell ex992 checks 99.3: in reading order it is exercise 99.2, renumber it" in found
    assert "exercise cell ex993 checks 99.2: in reading order it is exercise 99.3, renumber it" in found
    assert "the cell of exercise 99.1 with id sum-md should be ex991-md" in found
    assert "cell 9bf2c3ad has an id Jupyter generated: name what it holds" in found
    solution = read_notebook(FIXTURE)
    next(c for c in solution.cells if c.id == "ex993-md").source = "**Exercise 99.4**: the shards."
    next(c for c in solution.cells if c.id == "check991").id = "ex1-check"
    found = problems(solution, NAME)
    assert found == [
        "the cell of exercise 99.1 with id ex1-check should be check991",
        "the markdown before exercise cell ex993 does not say 'Exercise 99.3'",
    ]


def test_every_lesson_numbers_its_exercises_in_reading_order():
    for path in sorted(SOLUTIONS_DIR.glob("[0-9][0-9]_*.ipynb")):
        layout = structure(read_notebook(path))
        number = int(path.name[:2])
        assert layout.exercise_ids == [f"{number}.{k}" for k in range(1, len(layout.exercises) + 1)], path.name
        assert problems(read_notebook(path), path.stem) == [], path.name


def test_build_then_check_passes(course, capsys):
    solutions, lessons = course
    assert main(["build", "--solutions", str(solutions), "--lessons", str(lessons)]) == 0
    assert (lessons / FIXTURE.name).exists()
    assert main(["build", "--check", "--solutions", str(solutions), "--lessons", str(lessons)]) == 0
    assert "up to date (1 notebooks)" in capsys.readouterr().out


def test_editing_a_solution_without_rebuilding_fails_the_check(course):
    solutions, lessons = course
    assert main(["build", "--solutions", str(solutions), "--lessons", str(lessons)]) == 0
    solution = read_notebook(solutions / FIXTURE.name)
    solution.cells[0].source += "\n\nA new sentence."
    nbformat.write(solution, solutions / FIXTURE.name)
    result = run_cli("build", "--check", "--solutions", str(solutions), "--lessons", str(lessons))
    assert result.returncode == 1
    assert f"{FIXTURE.name} differs from what" in result.stderr
    assert main(["build", "--solutions", str(solutions), "--lessons", str(lessons)]) == 0
    assert main(["build", "--check", "--solutions", str(solutions), "--lessons", str(lessons)]) == 0


def test_a_lesson_with_solution_text_fails_the_check(course, capsys):
    solutions, lessons = course
    main(["build", "--solutions", str(solutions), "--lessons", str(lessons)])
    lesson = read_notebook(lessons / FIXTURE.name)
    next(c for c in lesson.cells if c.id == "ex991").source = "total = sum(range(1, N + 1))"
    nbformat.write(lesson, lessons / FIXTURE.name)
    assert main(["build", "--check", "--solutions", str(solutions), "--lessons", str(lessons)]) == 1
    assert "contains solution code" in capsys.readouterr().err


def test_missing_and_orphan_lessons_fail_the_check(course, capsys):
    solutions, lessons = course
    lessons.mkdir()
    (lessons / "07_gone.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    assert main(["build", "--check", "--solutions", str(solutions), "--lessons", str(lessons)]) == 1
    err = capsys.readouterr().err
    assert f"{FIXTURE.name} is missing" in err
    assert "07_gone.ipynb has no solution" in err


def test_a_lesson_that_is_not_json_fails_the_check(course, capsys):
    solutions, lessons = course
    lessons.mkdir()
    (lessons / FIXTURE.name).write_text("{ not json")
    assert main(["build", "--check", "--solutions", str(solutions), "--lessons", str(lessons)]) == 1
    assert f"{FIXTURE.name} is not a valid notebook" in capsys.readouterr().err


def test_a_broken_solution_is_named_and_not_built(course, capsys):
    solutions, lessons = course
    broken = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1")])
    nbformat.write(broken, solutions / "05_broken.ipynb")
    assert main(["build", "--solutions", str(solutions), "--lessons", str(lessons)]) == 1
    assert "05_broken.ipynb" in capsys.readouterr().err
    assert not (lessons / "05_broken.ipynb").exists()
    assert (lessons / FIXTURE.name).exists()


def test_bad_input_is_one_line(tmp_path):
    result = run_cli("build", "--check", "--solutions", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: no solutions folder at")
