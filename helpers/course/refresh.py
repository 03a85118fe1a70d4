"""``python -m helpers.course pages``: bring the generated markdown of every solution up to date.

Re-renders the diagrams that are out of date with :mod:`helpers.course.diagrams` and regenerates each header's time
line (:mod:`helpers.course.pages`); then ``python -m helpers.course build`` carries them to ``lessons/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from helpers.course import build, pages

__all__ = ["add_arguments", "command", "refresh"]


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
    pages.update(nb)
    after = build.serialize(nb)
    if after != before:
        path.write_text(after, encoding="utf-8")
    return after != before


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pages`` subcommand's options.

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument("--solutions", type=Path, default=build.SOLUTIONS_DIR, help="solution notebooks folder")


def command(args: argparse.Namespace) -> int:
    """Run the ``pages`` subcommand on every solution.

    Args:
        args: the options :func:`add_arguments` declared, parsed.

    Returns:
        0 (then run ``python -m helpers.course build`` to carry the changes to ``lessons/``).

    Raises:
        CourseInputError: a missing solutions folder or an unreadable notebook.
    """
    for path in build.solution_notebooks(args.solutions):
        print(f"{'wrote' if refresh(path) else 'unchanged'} {build.display_path(path)}")
    return 0
