"""``python -m helpers.course pages``: bring the generated parts of every solution up to date.

Re-renders the diagrams that are out of date with :mod:`helpers.course.diagrams`, states the latest measured run
times (:mod:`helpers.course.run_times`) and regenerates each header's time line (:mod:`helpers.course.pages`) and
the README's course totals; with ``--outputs NN``, also executes those solutions once and records the outputs
that nbval compares (cells starting ``# NBVAL_CHECK_OUTPUT``) from that run. Then ``python -m helpers.course build``
carries the changes to ``lessons/``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from helpers import CourseInputError
from helpers.course import build, pages, run, run_times

__all__ = ["COMPARED", "add_arguments", "command", "record_outputs", "refresh"]

COMPARED = "# NBVAL_CHECK_OUTPUT"  # the first line of a cell whose outputs nbval compares


def refresh(path: Path) -> bool:
    """:func:`helpers.course.pages.update` one solution file, and write it back if anything changed.

    The notebook is read right before it is written, and only its diagram cells and time line change, so edits
    others make to its other cells at the same time survive.

    Args:
        path: the solution notebook.

    Returns:
        True if the file was rewritten.

    Raises:
        CourseInputError: the file is not a readable notebook.
    """
    nb = build.read_notebook(path)
    before = build.serialize(nb)
    pages.update(nb, run_times.recorded().get(path.name))
    after = build.serialize(nb)
    if after != before:
        path.write_text(after, encoding="utf-8")
    return after != before


def record_outputs(path: Path) -> int:
    """Execute solution ``path`` once (papermill, a scratch work directory) and store, in the solution, the outputs
    of its compared cells from that run.

    Only the compared cells' outputs change, and the notebook is read right before it is written.

    Args:
        path: the solution notebook.

    Returns:
        How many compared cells' outputs changed.

    Raises:
        CourseInputError: the notebook failed to run (the message ends with papermill's last lines).
    """
    with tempfile.TemporaryDirectory(prefix="course-outputs-") as scratch:
        executed_path = Path(scratch) / path.name
        done = run.execute(path, executed_path, parameters={"WORK_DIR": str(Path(scratch) / "work")})
        if done.failed:
            raise CourseInputError(f"{build.display_path(path)} failed to run: {done.log_tail[-500:]}")
        executed = {cell.get("id"): cell for cell in build.read_notebook(executed_path).cells}
    nb = build.read_notebook(path)
    changed = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(COMPARED) and cell.get("id") in executed:
            fresh = executed[cell.get("id")]
            if fresh.outputs != cell.outputs:
                cell.outputs, cell.execution_count = fresh.outputs, fresh.execution_count
                changed += 1
    path.write_text(build.serialize(nb), encoding="utf-8")
    return changed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pages`` subcommand's options.

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument("--solutions", type=Path, default=build.SOLUTIONS_DIR, help="solution notebooks folder")
    parser.add_argument(
        "--outputs",
        nargs="+",
        default=[],
        metavar="NN",
        help="also run these solutions (by number, e.g. 05) and record the outputs nbval compares",
    )


def command(args: argparse.Namespace) -> int:
    """Run the ``pages`` subcommand on every solution.

    Args:
        args: the options :func:`add_arguments` declared, parsed.

    Returns:
        0 (then run ``python -m helpers.course build`` to carry the changes to ``lessons/``).

    Raises:
        CourseInputError: a missing solutions folder or an unreadable notebook.
    """
    notebooks = build.solution_notebooks(args.solutions)
    for path in notebooks:
        print(f"{'wrote' if refresh(path) else 'unchanged'} {build.display_path(path)}")
    if args.solutions.resolve() == build.SOLUTIONS_DIR.resolve():
        readme = run_times.README
        totals = run_times.readme_line([build.read_notebook(path) for path in notebooks])
        lines = readme.read_text(encoding="utf-8").splitlines(keepends=True)
        text = "".join(totals + "\n" if line.startswith(run_times.README_PREFIX) else line for line in lines)
        print(f"{'wrote' if text != readme.read_text(encoding='utf-8') else 'unchanged'} README.md")
        readme.write_text(text, encoding="utf-8")
    for path in run.select(notebooks, args.outputs, option="--outputs") if args.outputs else []:
        print(f"{record_outputs(path)} compared outputs changed in {build.display_path(path)}")
    return 0
