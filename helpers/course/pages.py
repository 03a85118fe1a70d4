"""The generated parts of the solutions' markdown: each lesson's diagram, and the run time its header states.

**Diagrams** are drawn by :mod:`helpers.course.diagrams` and embedded as PNG *cell attachments* of a markdown cell
(``![alt](attachment:NAME.png)``), the one way an image in a notebook shows in JupyterLab, VS Code, nbviewer and
GitHub alike and travels with the notebook when a student copies it (a relative path breaks in some viewers and
when the file moves). The cell's metadata ``course.diagram`` names the diagram and ``course.source`` holds the
hash of the drawing module it was rendered from; the lesson build copies the cell as it is.

**The run time**: the header cell (id ``orientation``) states, in its ``**Time:**`` line, the Run All times
measured by ``make bench`` and the learner's time (:mod:`helpers.course.run_times`).

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

from helpers.course import diagrams, run_times

__all__ = [
    "ORIENTATION_ID",
    "diagram_source",
    "problems",
    "render_png",
    "update",
]

ORIENTATION_ID = "orientation"
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
    times = run_times.stated(nb)
    if times is None:
        return [f"metadata.course.{run_times.COLD} and {run_times.WARM} are missing: the measured Run All times"]
    header = next((cell for cell in nb.cells if cell.get("id") == ORIENTATION_ID), None)
    if header is None or run_times.time_line(nb, *times) not in header.source.splitlines():
        return [f"the {ORIENTATION_ID!r} cell does not state the time generated from its metadata"]
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


def _refresh_time(nb: NotebookNode, measured: dict[str, float] | None) -> None:
    if measured is not None:
        nb.metadata.setdefault("course", {}).update({key: measured[key] for key in (run_times.COLD, run_times.WARM)})
    times = run_times.stated(nb)
    header = next((cell for cell in nb.cells if cell.get("id") == ORIENTATION_ID), None)
    if times is None or header is None:
        return
    line = run_times.time_line(nb, *times)
    paragraphs = header.source.split("\n\n")  # the time line's paragraph is replaced whole, however it was wrapped
    header.source = "\n\n".join(line if p.startswith(run_times.TIME_PREFIX) else p for p in paragraphs)


def update(nb: NotebookNode, measured: dict[str, float] | None = None) -> None:
    """Re-render the stale diagrams of a solution, in place, and regenerate its header's time line.

    Args:
        nb: the solution notebook; only its diagram cells, its stated times and the header's time line change.
        measured: the notebook's latest measured times (:func:`helpers.course.run_times.recorded`), which become
            the stated ones; None keeps those it states.
    """
    _refresh_diagrams(nb)
    _refresh_time(nb, measured)
