"""The generated parts of the solutions' markdown: each lesson's diagram, and the run time its header states.

**Diagrams** are drawn by :mod:`helpers.course.diagrams` and embedded as PNG *cell attachments* of a markdown cell
(``![alt](attachment:NAME.png)``), the one way an image in a notebook shows in JupyterLab, VS Code, nbviewer and
GitHub alike and travels with the notebook when a student copies it (a relative path breaks in some viewers and
when the file moves). The cell's metadata ``course.diagram`` names the diagram and ``course.source`` holds the
hash of the drawing module it was rendered from; the lesson build copies the cell as it is.

**The run time**: ``metadata.course.run_seconds`` is how long Run All takes on a 2-core laptop, measured
(``make bench``, part 4b); the header cell (id ``orientation``) states it in its ``**Time:**`` line, generated
from that number. ``tests/test_notebooks.py`` compares it with the time the notebook takes in the test run.

``python -m helpers.course pages`` (:mod:`helpers.course.refresh`) re-renders what is out of date into
``solutions/`` (then run ``build``); :func:`problems` says what is out of date, and ``build`` and ``build --check``
report it.
"""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path

from nbformat import NotebookNode

from helpers.course import diagrams

__all__ = [
    "ORIENTATION_ID",
    "RUN_SECONDS",
    "diagram_source",
    "problems",
    "render_png",
    "run_seconds",
    "time_line",
    "update",
]

ORIENTATION_ID = "orientation"
RUN_SECONDS = "run_seconds"
TIME_PREFIX = "**Time:**"
PNG = "image/png"


def source_hash() -> str:
    """The hash of the drawing module's text (line endings normalised): a diagram rendered from another is stale."""
    text = Path(diagrams.__file__).read_text(encoding="utf-8").replace("\r\n", "\n")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def render_png(diagram: diagrams.Diagram) -> bytes:
    """One diagram as PNG bytes (no timestamp or software tag in them)."""
    buffer = io.BytesIO()
    diagram.draw().savefig(buffer, format="png", dpi=diagrams.DPI, metadata={"Software": None})
    return buffer.getvalue()


def diagram_source(diagram: diagrams.Diagram) -> str:
    """The markdown of a diagram's cell: the image, with its description as alt text."""
    return f"![{diagram.alt}](attachment:{diagram.name}.png)"


def run_seconds(nb: NotebookNode) -> float | None:
    """The measured Run All time in ``metadata.course.run_seconds`` (None if missing or not a positive number)."""
    value = nb.metadata.get("course", {}).get(RUN_SECONDS)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def time_line(seconds: float) -> str:
    """The header's time line for a notebook whose Run All takes ``seconds`` on a 2-core laptop."""
    if seconds < 90:
        said = f"about {max(5, round(seconds / 5) * 5)} s"
    else:
        said = f"about {round(seconds / 30) / 2:g} min"
    return (
        f"{TIME_PREFIX} Run All takes {said} on a 2-core laptop (measured: `make bench`, part 4b), plus the time "
        "you spend reading and on the exercises."
    )


def _diagram_cells(nb: NotebookNode) -> dict[str, NotebookNode]:
    return {
        cell.metadata["course"]["diagram"]: cell
        for cell in nb.cells
        if cell.cell_type == "markdown" and "diagram" in cell.get("metadata", {}).get("course", {})
    }


def _diagram_problems(nb: NotebookNode, name: str) -> list[str]:
    found = []
    cells = _diagram_cells(nb)
    current = source_hash()
    for diagram in (d for d in diagrams.DIAGRAMS if d.lesson == name):
        cell = cells.pop(diagram.name, None)
        if cell is None:
            found.append(f"no cell shows the diagram {diagram.name!r} (a markdown cell with course.diagram)")
        elif cell.source != diagram_source(diagram) or PNG not in cell.get("attachments", {}).get(
            f"{diagram.name}.png", {}
        ):
            found.append(f"the cell of diagram {diagram.name!r} is not what it generates")
        elif cell.metadata["course"].get("source") != current:
            found.append(f"diagram {diagram.name!r} is out of date with helpers/course/diagrams.py")
    found += [f"cell {cell.get('id')} shows an unknown diagram {unknown!r}" for unknown, cell in cells.items()]
    return found


def _time_problems(nb: NotebookNode) -> list[str]:
    seconds = run_seconds(nb)
    if seconds is None:
        return [f"metadata.course.{RUN_SECONDS} is missing: the measured Run All time, in seconds"]
    header = next((cell for cell in nb.cells if cell.get("id") == ORIENTATION_ID), None)
    if header is None or time_line(seconds) not in header.source.splitlines():
        return [f"the {ORIENTATION_ID!r} cell does not state the time generated from {RUN_SECONDS}"]
    return []


def problems(nb: NotebookNode, name: str) -> list[str]:
    """What is out of date in solution ``name``'s generated markdown; each says ``python -m helpers.course pages``.

    Only the notebooks that :data:`helpers.course.diagrams.DIAGRAMS` names a diagram for (the course's lessons) are
    held to it: other notebooks (the tests' fixture) have none to show.

    Args:
        nb: the solution notebook.
        name: its file stem (``01_data_lake_petastorm``).

    Returns:
        One line per problem, empty when everything is current.
    """
    if all(diagram.lesson != name for diagram in diagrams.DIAGRAMS):
        return []
    found = _diagram_problems(nb, name) + _time_problems(nb)
    return [f"{problem}: run `python -m helpers.course pages`" for problem in found]


def _refresh_diagrams(nb: NotebookNode) -> None:
    cells, current = _diagram_cells(nb), source_hash()
    for diagram in diagrams.DIAGRAMS:
        cell = cells.get(diagram.name)
        if cell is None:
            continue
        attachment = cell.get("attachments", {}).get(f"{diagram.name}.png", {})
        if cell.metadata["course"].get("source") != current or PNG not in attachment:
            png = base64.b64encode(render_png(diagram)).decode("ascii")
            cell["attachments"] = {f"{diagram.name}.png": {PNG: png}}
            cell.metadata["course"]["source"] = current
        cell.source = diagram_source(diagram)


def _refresh_time(nb: NotebookNode) -> None:
    seconds = run_seconds(nb)
    header = next((cell for cell in nb.cells if cell.get("id") == ORIENTATION_ID), None)
    if seconds is None or header is None:
        return
    paragraphs = header.source.split("\n\n")  # the time line's paragraph is replaced whole, however it was wrapped
    header.source = "\n\n".join(time_line(seconds) if p.startswith(TIME_PREFIX) else p for p in paragraphs)


def update(nb: NotebookNode) -> None:
    """Re-render the stale diagrams of a solution, in place, and regenerate its header's time line.

    Args:
        nb: the solution notebook; only its diagram cells and the header's time line change.
    """
    _refresh_diagrams(nb)
    _refresh_time(nb)
