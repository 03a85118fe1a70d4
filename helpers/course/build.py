"""Single source for the course's notebooks: ``solutions/`` are written by hand, ``lessons/`` are generated.

Conventions for a solution notebook ``solutions/NN_name.ipynb`` (nbformat 4.5, so every cell has a stable id that
the build keeps and the grader matches on):

- **Exercise cells**: the code students write sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines.
  A region at top level becomes ``# YOUR CODE HERE`` plus ``name = ...`` for every name it binds (a bare ``...``
  if none); an indented region (a whole function or method body, after its docstring) becomes
  ``# YOUR CODE HERE`` and ``...`` at that indentation, which the checks recognise as "not attempted".
- **Check cells**: after every exercise cell, a cell of its own that calls ``check("N.x", answer_or_namespace);``
  (N is the lesson number; tag it ``check`` if you like). The trailing ``;`` hides the returned bool.
- **Reading order and names**: a lesson's exercises are N.1, N.2, ... in the order they appear. Exercise N.k's
  instructions are the markdown cell right before its exercise cell and say ``Exercise N.k``; the three cells have
  the ids ``exNk-md``, ``exNk`` and ``checkNk``. Every other cell has an id that names what it holds (not one that
  Jupyter generated).
- **Parameters**: one code cell tagged ``parameters`` assigns at least ``DATA_DIR`` (None: the embedded data),
  ``WORK_DIR`` and ``SEED``, plus the lesson's own; the defaults are the small CI settings. Keep ``=`` out of its
  comments (papermill parses them).
- **Instructor-only cells** are tagged ``solution-only`` and left out of the lesson.
- **A stretch exercise** (optional, one per lesson) has its exercise cell tagged ``stretch``; it is checked like
  the others and graded as optional.
- **Generated markdown**: each lesson's diagram and its header's run time, from :mod:`helpers.course.pages`
  (``python -m helpers.course pages`` brings them up to date).
- **Outputs that nbval compares** are in cells whose first line is ``# NBVAL_CHECK_OUTPUT``, saved with the
  solution. Not on check cells: nbval ignores the ``;``, and the notebook tests already require every check to pass.

``python -m helpers.course build`` writes ``lessons/NN_name.ipynb`` from each solution (outputs cleared,
``solution-only`` cells dropped, ids and kernelspec kept, ``course.lesson`` in the metadata); ``build --check``
exits non-zero, naming the notebook, when a committed lesson is stale, missing, has no solution, or leaks solution
text, or a solution breaks these conventions.
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from helpers import CourseInputError
from helpers.course import pages
from helpers.workdir import REPO_ROOT

__all__ = [
    "BEGIN",
    "CELL_METADATA_DROPPED",
    "END",
    "Exercise",
    "LESSONS_DIR",
    "PARAMETERS_TAG",
    "REQUIRED_PARAMETERS",
    "Region",
    "SOLUTIONS_DIR",
    "SOLUTION_ONLY_TAG",
    "STRETCH_TAG",
    "Structure",
    "YOUR_CODE",
    "add_arguments",
    "bound_names",
    "build",
    "build_lesson",
    "check",
    "check_ids",
    "command",
    "display_path",
    "has_solution",
    "leaks",
    "lesson_number",
    "problems",
    "read_notebook",
    "serialize",
    "solution_notebooks",
    "split_cell",
    "strip_solutions",
    "structure",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
YOUR_CODE = "# YOUR CODE HERE"
SOLUTION_ONLY_TAG = "solution-only"
STRETCH_TAG = "stretch"
PARAMETERS_TAG = "parameters"
REQUIRED_PARAMETERS = ("DATA_DIR", "WORK_DIR", "SEED")
CELL_METADATA_DROPPED = ("papermill", "execution", "ExecuteTime", "scrolled", "collapsed")

SOLUTIONS_DIR = REPO_ROOT / "solutions"
LESSONS_DIR = REPO_ROOT / "lessons"

_LESSON_NUMBER = re.compile(r"^(\d+)_")
_GENERATED_ID = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){0,3}(-[0-9a-f]{12})?")


def display_path(path: Path) -> str:
    """A path as messages show it.

    Args:
        path: any path.

    Returns:
        ``path`` relative to the repository when it is inside it, else as given.
    """
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def read_notebook(path: Path) -> NotebookNode:
    """Read a notebook as nbformat 4.

    Args:
        path: the ``.ipynb`` file.

    Returns:
        The notebook.

    Raises:
        CourseInputError: the file is missing or is not a valid notebook.
    """
    try:
        return nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise CourseInputError(f"{display_path(path)}: no such notebook") from None
    except Exception as error:  # noqa: BLE001 - nbformat raises several kinds for a bad file
        raise CourseInputError(f"{display_path(path)} is not a valid notebook: {error}") from None


def serialize(nb: NotebookNode) -> str:
    """The notebook as the course writes it to disk (the one serializer for solutions and lessons).

    Args:
        nb: the notebook.

    Returns:
        nbformat's JSON with a final newline.
    """
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def lesson_number(name: str) -> int | None:
    """The lesson number of a notebook named ``NN_name``.

    Args:
        name: the notebook's file stem.

    Returns:
        ``NN`` as an int, or None if the name does not start with digits.
    """
    match = _LESSON_NUMBER.match(name)
    return int(match.group(1)) if match else None


def solution_notebooks(solutions_dir: Path = SOLUTIONS_DIR) -> list[Path]:
    """The course's notebooks, in course order: every ``*.ipynb`` of the solutions folder.

    The one definition of "the solution notebooks" (the runner, the grader, the tests and the benchmarks use it).

    Args:
        solutions_dir: the folder (default ``solutions/``).

    Returns:
        Their paths, sorted by name.

    Raises:
        CourseInputError: there is no such folder.
    """
    if not solutions_dir.is_dir():
        raise CourseInputError(f"no solutions folder at {display_path(solutions_dir)}")
    return sorted(solutions_dir.glob("*.ipynb"))


def _python_source(source: str) -> str:
    """Cell source as plain Python: IPython magics (``%time``, ``!ls``) are turned into function calls."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _parse(source: str) -> ast.Module | None:
    """The cell's AST, or None when the cell is not valid Python (even after IPython's transforms)."""
    try:
        return ast.parse(_python_source(source))
    except SyntaxError:
        return None


def has_solution(source: str) -> bool:
    """Whether a cell holds a solution region.

    Args:
        source: the cell's source.

    Returns:
        True if a line is a ``### BEGIN SOLUTION`` or ``### END SOLUTION`` marker.
    """
    return any(line.strip() in (BEGIN, END) for line in source.splitlines())


def _target_names(target: ast.expr) -> Iterable[str]:
    """Names bound by an assignment target (``a``, ``a, (b, *c)``); attributes and subscripts bind none."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _statement_names(statement: ast.stmt) -> Iterable[str]:
    """Module-level names bound by one statement, including inside if/for/while/with/try blocks."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield statement.name
        return
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            yield from _target_names(target)
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        yield from _target_names(statement.target)
    elif isinstance(statement, (ast.For, ast.AsyncFor)):
        yield from _target_names(statement.target)
    elif isinstance(statement, (ast.With, ast.AsyncWith)):
        for item in statement.items:
            if item.optional_vars is not None:
                yield from _target_names(item.optional_vars)
    elif isinstance(statement, ast.Import):
        for alias in statement.names:
            yield alias.asname or alias.name.split(".")[0]
    elif isinstance(statement, ast.ImportFrom):
        for alias in statement.names:
            if alias.name != "*":
                yield alias.asname or alias.name
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(statement, field, []):
            if isinstance(child, ast.stmt):
                yield from _statement_names(child)
            else:  # except handlers and match cases hold statements in their own body
                for grandchild in child.body:
                    yield from _statement_names(grandchild)


def bound_names(code: str) -> list[str]:
    """The names that top-level code binds (assignments, imports, definitions, loop targets...).

    Args:
        code: a cell's source (IPython magics are read as function calls).

    Returns:
        The names, in order of first binding.

    Raises:
        SyntaxError: ``code`` is not valid Python.
    """
    names: list[str] = []
    for statement in ast.parse(_python_source(code)).body:
        for name in _statement_names(statement):
            if name not in names:
                names.append(name)
    return names


def _stub(region: Region, where: str) -> list[str]:
    """The lines that replace a solution region.

    Indented (inside a function or class body): ``# YOUR CODE HERE`` and ``...`` at that indentation. At top level:
    ``# YOUR CODE HERE`` and ``name = ...`` for every name the region binds (a bare ``...`` if none), so later
    cells never hit a NameError and checks see ``...``.
    """
    if region.indent:
        return [f"{region.indent}{YOUR_CODE}", f"{region.indent}..."]
    try:
        names = bound_names("\n".join(region.lines))
    except SyntaxError as error:
        raise CourseInputError(
            f"{where}: the solution region is not valid Python ({error.msg}, line {error.lineno})"
        ) from None
    return [YOUR_CODE, *(f"{name} = ..." for name in names)] if names else [YOUR_CODE, "..."]


@dataclass(frozen=True)
class Region:
    """One solution region: the indentation of its ``### BEGIN SOLUTION`` line and the lines in between."""

    indent: str
    lines: tuple[str, ...]


def split_cell(source: str, where: str) -> list[str | Region]:
    """A cell's source as plain lines and solution regions, in order.

    Args:
        source: the cell's source.
        where: names the cell in error messages.

    Returns:
        Each line outside a region as a str, each region as a :class:`Region`.

    Raises:
        CourseInputError: unbalanced or nested markers.
    """
    parts: list[str | Region] = []
    current: list[str] | None = None
    indent = ""
    for line in source.splitlines():
        marker = line.strip()
        if marker == BEGIN:
            if current is not None:
                raise CourseInputError(f"{where}: '{BEGIN}' inside another solution region")
            current, indent = [], line[: len(line) - len(line.lstrip())]
        elif marker == END:
            if current is None:
                raise CourseInputError(f"{where}: '{END}' without a '{BEGIN}'")
            parts.append(Region(indent, tuple(current)))
            current = None
        elif current is not None:
            current.append(line)
        else:
            parts.append(line)
    if current is not None:
        raise CourseInputError(f"{where}: '{BEGIN}' without an '{END}'")
    return parts


def strip_solutions(source: str, where: str) -> str:
    """The cell's source with every solution region replaced by its stub.

    Args:
        source: the cell's source.
        where: names the cell in error messages.

    Returns:
        The lesson's version of the cell.

    Raises:
        CourseInputError: unbalanced or nested markers.
    """
    out: list[str] = []
    for part in split_cell(source, where):
        out.extend(_stub(part, where) if isinstance(part, Region) else [part])
    return "\n".join(out)


def check_ids(source: str) -> list[str]:
    """The exercise ids a cell checks.

    Args:
        source: the cell's source.

    Returns:
        The first arguments of its ``check("N.x", ...)`` calls, in order (none if it is not Python).
    """
    tree = _parse(source)
    if tree is None:
        return []
    calls: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        first = node.args[0]
        if name == "check" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            calls.append((node.lineno, node.col_offset, first.value))
    return list(dict.fromkeys(exercise_id for _, _, exercise_id in sorted(calls)))


def _tags(cell: NotebookNode) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


@dataclass(frozen=True)
class Exercise:
    """One exercise cell of a solution, the exercise ids its following check cell(s) check, and whether it is an
    optional stretch exercise."""

    cell_id: str
    check_ids: tuple[str, ...]
    stretch: bool = False


@dataclass(frozen=True)
class Structure:
    """Which cells of a notebook are exercises and which are checks (``solution-only`` cells excluded)."""

    exercises: tuple[Exercise, ...]
    check_cells: dict[str, tuple[str, ...]]

    @property
    def exercise_ids(self) -> list[str]:
        """Every exercise id checked after an exercise cell, in notebook order."""
        return [exercise_id for exercise in self.exercises for exercise_id in exercise.check_ids]


def structure(solution: NotebookNode) -> Structure:
    """The exercise layout of a solution.

    Args:
        solution: the solution notebook.

    Returns:
        Its exercise cells (those with solution regions) and check cells (those calling ``check(``).
    """
    exercises: list[tuple[str, list[str], bool]] = []
    check_cells: dict[str, tuple[str, ...]] = {}
    for cell in solution.cells:
        if cell.cell_type != "code" or SOLUTION_ONLY_TAG in _tags(cell):
            continue
        if has_solution(cell.source):
            exercises.append((cell.get("id", ""), [], STRETCH_TAG in _tags(cell)))
            continue
        ids = check_ids(cell.source)
        if ids:
            check_cells[cell.get("id", "")] = tuple(ids)
            if exercises:
                exercises[-1][1].extend(i for i in ids if i not in exercises[-1][1])
    return Structure(tuple(Exercise(cell_id, tuple(ids), stretch) for cell_id, ids, stretch in exercises), check_cells)


def _marker_problems(cells: list[NotebookNode]) -> list[str]:
    found = []
    for index, cell in enumerate(cells):
        where = f"cell {index} ({cell.get('id', 'no id')})"
        if not has_solution(cell.source):
            continue
        if cell.cell_type != "code":
            found.append(f"{where}: solution markers are only supported in code cells")
            continue
        try:
            strip_solutions(cell.source, where)
        except CourseInputError as error:
            found.append(str(error))
    return found


def _naming_problems(cells: list[NotebookNode], layout: Structure, number: int | None) -> list[str]:
    """Exercises out of reading order, and cell ids that do not say what the cells hold."""
    found = [
        f"cell {cell.get('id')} has an id Jupyter generated: name what it holds"
        for cell in cells
        if _GENERATED_ID.fullmatch(str(cell.get("id", ""))) and re.search(r"\d", str(cell.get("id", "")))
    ]
    if number is None:
        return found
    position = {cell.get("id"): index for index, cell in enumerate(cells)}
    for k, exercise in enumerate(layout.exercises, start=1):
        label = f"{number}.{k}"
        if exercise.check_ids != (label,):
            found.append(
                f"exercise cell {exercise.cell_id} checks {', '.join(exercise.check_ids) or 'nothing'}: in "
                f"reading order it is exercise {label}, renumber it"
            )
            continue
        index = position[exercise.cell_id]
        instructions = next((c for c in reversed(cells[:index]) if c.cell_type == "markdown"), None)
        named = {exercise.cell_id: f"ex{number}{k}", _id(instructions): f"ex{number}{k}-md"}
        named.update({cell_id: f"check{number}{k}" for cell_id, ids in layout.check_cells.items() if label in ids})
        found += [
            f"the cell of exercise {label} with id {old} should be {new}" for old, new in named.items() if old != new
        ]
        if instructions is not None and f"Exercise {label}" not in instructions.source:
            found.append(f"the markdown before exercise cell {exercise.cell_id} does not say 'Exercise {label}'")
    return found


def _id(cell: NotebookNode | None) -> str:
    return str(cell.get("id", "")) if cell is not None else "(no markdown cell)"


def _parameter_problems(cells: list[NotebookNode]) -> list[str]:
    parameters = [cell for cell in cells if cell.cell_type == "code" and PARAMETERS_TAG in _tags(cell)]
    if len(parameters) != 1:
        return [f"needs exactly one code cell tagged '{PARAMETERS_TAG}' (found {len(parameters)})"]
    try:
        assigned = bound_names(parameters[0].source)
    except SyntaxError as error:
        return [f"the '{PARAMETERS_TAG}' cell is not valid Python ({error.msg})"]
    missing = [name for name in REQUIRED_PARAMETERS if name not in assigned]
    return [f"the '{PARAMETERS_TAG}' cell does not assign {', '.join(missing)}"] if missing else []


def _check_problems(layout: Structure, number: int | None) -> list[str]:
    found = []
    seen: dict[str, str] = {}
    for exercise in layout.exercises:
        if not exercise.check_ids:
            found.append(f"exercise cell {exercise.cell_id} is not followed by a check cell")
        for exercise_id in exercise.check_ids:
            if exercise_id in seen:
                found.append(
                    f"check id {exercise_id} follows two exercise cells: {seen[exercise_id]}, {exercise.cell_id}"
                )
            seen[exercise_id] = exercise.cell_id
            if number is not None and exercise_id.split(".")[0] != str(number):
                found.append(f"check id {exercise_id} does not start with the lesson number {number}")
    early = [exercise_id for ids in layout.check_cells.values() for exercise_id in ids if exercise_id not in seen]
    if early:
        found.append(f"check ids {', '.join(early)} are not after an exercise cell")
    return found


def problems(solution: NotebookNode, name: str) -> list[str]:
    """What is wrong with a solution's structure.

    Args:
        solution: the solution notebook.
        name: its file stem (``NN_name``), for the lesson number and the messages.

    Returns:
        One message per problem; empty when it follows the conventions above.
    """
    found = []
    if any("id" not in cell for cell in solution.cells):
        found.append("cells without ids: save it with JupyterLab >= 3 (nbformat 4.5) so cell ids are stable")
    found += _marker_problems(solution.cells)
    found += _parameter_problems(solution.cells)
    layout, number = structure(solution), lesson_number(name)
    found += _check_problems(layout, number)
    found += _naming_problems(solution.cells, layout, number)
    found += pages.problems(solution, name)
    return found


def build_lesson(solution: NotebookNode, name: str) -> NotebookNode:
    """The student's notebook: stubs for solutions, no outputs, no solution-only cells.

    Args:
        solution: the solution notebook.
        name: its file stem, recorded as ``course.lesson`` in the metadata.

    Returns:
        The lesson notebook.

    Raises:
        CourseInputError: a cell's solution markers are unbalanced or nested.
    """
    lesson = nbformat.v4.new_notebook()
    lesson.nbformat, lesson.nbformat_minor = 4, 5
    if "kernelspec" in solution.metadata:
        lesson.metadata["kernelspec"] = copy.deepcopy(solution.metadata["kernelspec"])
    lesson.metadata["course"] = {**solution.metadata.get("course", {}), "lesson": name}
    for index, cell in enumerate(solution.cells):
        if SOLUTION_ONLY_TAG in _tags(cell):
            continue
        new = copy.deepcopy(cell)
        new.metadata = {k: v for k, v in new.get("metadata", {}).items() if k not in CELL_METADATA_DROPPED}
        if cell.cell_type == "code":
            new.source = strip_solutions(cell.source, f"{name} cell {index} ({cell.get('id', 'no id')})")
            new.outputs = []
            new.execution_count = None
        lesson.cells.append(new)
    return lesson


def _normalized(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def leaks(solution: NotebookNode, lesson: NotebookNode) -> list[str]:
    """Why a lesson still contains solution text.

    Args:
        solution: the solution notebook.
        lesson: the lesson built from it (or committed).

    Returns:
        One message per leak: a region marker, or a solution region's code; empty if none.
    """
    found: list[str] = []
    regions = [
        _normalized("\n".join(part.lines))
        for cell in solution.cells
        if cell.cell_type == "code" and has_solution(cell.source)
        for part in split_cell(cell.source, "solution")
        if isinstance(part, Region)
    ]
    for index, cell in enumerate(lesson.cells):
        where = f"cell {index} ({cell.get('id', 'no id')})"
        if has_solution(cell.source):
            found.append(f"{where} contains solution markers")
        elif cell.cell_type == "code":
            text = _normalized(cell.source)
            if any(region and region in text for region in regions):
                found.append(f"{where} contains solution code")
    return found


def build(solutions_dir: Path = SOLUTIONS_DIR, lessons_dir: Path = LESSONS_DIR) -> list[str]:
    """Write every lesson from its solution (a lesson whose solution has problems is not written).

    Args:
        solutions_dir: the solution notebooks' folder.
        lessons_dir: the lessons' folder (created if missing).

    Returns:
        The problems found, one message each.

    Raises:
        CourseInputError: there is no solutions folder.
    """
    errors: list[str] = []
    lessons_dir.mkdir(parents=True, exist_ok=True)
    for path in solution_notebooks(solutions_dir):
        try:
            solution = read_notebook(path)
            found = problems(solution, path.stem)
            if found:
                errors.extend(f"{display_path(path)}: {problem}" for problem in found)
                continue
            text = serialize(build_lesson(solution, path.stem))
        except CourseInputError as error:
            errors.append(str(error))
            continue
        target = lessons_dir / path.name
        if target.exists() and target.read_text(encoding="utf-8") == text:
            print(f"unchanged {display_path(target)}")
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {display_path(target)}")
    return errors


def _check_lesson(solution_path: Path, lesson_path: Path) -> list[str]:
    """Problems with one committed lesson (and its solution)."""
    solution = read_notebook(solution_path)
    found = problems(solution, solution_path.stem)
    if found:
        return [f"{display_path(solution_path)}: {problem}" for problem in found]
    if not lesson_path.exists():
        return [f"{display_path(lesson_path)} is missing: run `python -m helpers.course build`"]
    committed = read_notebook(lesson_path)
    errors = [f"{display_path(lesson_path)}: {leak}" for leak in leaks(solution, committed)]
    if serialize(committed) != serialize(build_lesson(solution, solution_path.stem)):
        errors.append(
            f"{display_path(lesson_path)} differs from what {display_path(solution_path)} builds: "
            "run `python -m helpers.course build`"
        )
    return errors


def check(solutions_dir: Path = SOLUTIONS_DIR, lessons_dir: Path = LESSONS_DIR) -> list[str]:
    """Check the committed lessons against the solutions, writing nothing.

    Args:
        solutions_dir: the solution notebooks' folder.
        lessons_dir: the lessons' folder.

    Returns:
        One message per lesson that is stale, missing, without a solution, or leaking solution text.

    Raises:
        CourseInputError: there is no solutions folder.
    """
    errors: list[str] = []
    solutions = solution_notebooks(solutions_dir)
    for path in solutions:
        try:
            errors.extend(_check_lesson(path, lessons_dir / path.name))
        except CourseInputError as error:
            errors.append(str(error))
    names = {path.name for path in solutions}
    for lesson in sorted(lessons_dir.glob("*.ipynb")):
        if lesson.name not in names:
            errors.append(f"{display_path(lesson)} has no solution in {display_path(solutions_dir)}")
    return errors


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``build`` subcommand's options (``python -m helpers.course build --help``).

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument("--check", action="store_true", help="only verify that lessons/ is up to date")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS_DIR, help="solution notebooks folder")
    parser.add_argument("--lessons", type=Path, default=LESSONS_DIR, help="generated lessons folder")


def command(args: argparse.Namespace) -> int:
    """Run the ``build`` subcommand: write the lessons, or with ``--check`` only report what is wrong.

    Args:
        args: the options :func:`add_arguments` declared, parsed.

    Returns:
        The exit status: 0, or 1 if a problem was printed.

    Raises:
        CourseInputError: a missing solutions folder or an unreadable notebook.
    """
    errors = check(args.solutions, args.lessons) if args.check else build(args.solutions, args.lessons)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if args.check and not errors:
        print(f"lessons are up to date ({len(solution_notebooks(args.solutions))} notebooks)")
    return 1 if errors else 0
