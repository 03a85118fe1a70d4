"""The course tooling's one command line: ``python -m helpers.course {build,grade,pages,preflight,run} ...``.

Each subcommand's module declares its options (``add_arguments``) and does the work (``command``); bad input
(a :class:`~helpers.CourseInputError`) prints one ``error:`` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from helpers import CourseInputError
from helpers.course import build, grade, preflight, refresh, run

__all__ = ["SUBCOMMANDS", "main"]

SUBCOMMANDS = {
    "build": (build, "write lessons/ from solutions/ (--check: only verify they are up to date)"),
    "grade": (grade, "grade a folder of submitted notebooks into a CSV and feedback notebooks"),
    "preflight": (preflight, "check from the driver that a cluster will run the course: a table and an exit status"),
    "pages": (refresh, "re-render the solutions' diagrams and run-time lines that are out of date (then run build)"),
    "run": (run, "run the solution notebooks with a parameter file (laptop, GPU cluster, Databricks)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the subcommand.

    Args:
        argv: the arguments after ``python -m helpers.course`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when the subcommand found problems (stale lessons, failed notebooks),
        2 on bad input.
    """
    parser = argparse.ArgumentParser(prog="python -m helpers.course", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (module, summary) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=module.__doc__.splitlines()[0])
        module.add_arguments(sub)
        sub.set_defaults(handler=module.command)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except CourseInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
