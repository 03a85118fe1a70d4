"""How long each lesson takes, as the course states it: Run All on a cold start and warm, and a learner's time.

**Measured** by ``make bench`` (part 4b, :mod:`benchmarks.course_timing`): right after ``make setup``, every
solution notebook runs in course order in a fresh work folder (*cold*: the first Run All, which also pays for
building the Delta tables, Petastorm's caches and the first imports), then all of them again in the same folder
(*warm*: Run All once more). The figures go to :data:`RECORD` with the machine and the date; a run of some
notebooks (``--notebooks``) replaces theirs, measured the same way (a notebook run alone prepares its own data).

**Stated** in each solution's ``metadata.course`` (``cold_seconds``, ``warm_seconds``), copied from the record by
``python -m helpers.course pages``, which also renders the header's ``**Time:**`` line from them
(:func:`time_line`). The learner's time adds reading (the notebook's markdown at :data:`WORDS_PER_MINUTE`) and
:data:`MINUTES_PER_EXERCISE` per exercise to a warm Run All: an estimate, and the line says what it rests on. The
README's line for the whole course (:func:`readme_line`) sums the same figures.

``tests/test_lesson_pages.py`` fails when a stated figure is more than :data:`TOLERANCE` times off the record; no
test times a run.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from nbformat import NotebookNode

__all__ = [
    "COLD",
    "MINUTES_PER_EXERCISE",
    "RECORD",
    "TOLERANCE",
    "WARM",
    "WORDS_PER_MINUTE",
    "README",
    "README_PREFIX",
    "TIME_PREFIX",
    "learner_minutes",
    "readme_line",
    "recorded",
    "stated",
    "time_line",
    "write_record",
]

RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "course_times.json"
COLD, WARM = "cold_seconds", "warm_seconds"
TOLERANCE = 1.5  # a stated time may be this many times off the latest measured one
WORDS_PER_MINUTE = 200  # reading technical prose
MINUTES_PER_EXERCISE = 5  # reading the task, writing the answer, running its check once or twice
TIME_PREFIX = "**Time:**"
README = RECORD.parents[1] / "README.md"
README_PREFIX = "**Time for the course:**"


def recorded(record: Path = RECORD) -> dict[str, dict[str, float]]:
    """The latest measured times per solution file name (``{"01_....ipynb": {COLD: s, WARM: s}}``; empty if none)."""
    if not record.exists():
        return {}
    return json.loads(record.read_text(encoding="utf-8"))["notebooks"]


def write_record(times: dict[str, dict[str, float]], about: dict[str, Any], record: Path = RECORD) -> None:
    """Record measured times, replacing those of the same notebooks (``about``: the machine and the date, kept
    with each notebook's times)."""
    notebooks = recorded(record)
    for name, row in times.items():
        notebooks[name] = {**{key: round(value, 1) for key, value in row.items()}, **about}
    record.write_text(json.dumps({"notebooks": notebooks}, indent=1) + "\n", encoding="utf-8")


def stated(nb: NotebookNode) -> tuple[float, float] | None:
    """The cold and warm Run All seconds a solution states (None unless both are positive numbers)."""
    course = nb.metadata.get("course", {})
    values = [course.get(COLD), course.get(WARM)]
    if all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values):
        return float(values[0]), float(values[1])
    return None


def _said(seconds: float) -> str:
    """A duration the way a person says it: to 5 s under 90 s, else to half a minute."""
    if seconds < 90:
        return f"about {max(5, round(seconds / 5) * 5)} s"
    return f"about {max(2, round(seconds / 30)) / 2:g} min"


def _words(nb: NotebookNode) -> int:
    """The words of the notebook's markdown (images and links count as their text), the time line aside."""
    paragraphs = (p for cell in nb.cells if cell.cell_type == "markdown" for p in cell.source.split("\n\n"))
    text = " ".join(p for p in paragraphs if not p.startswith(TIME_PREFIX))
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)|\]\([^)]*\)|<[^>]+>", " ", text)
    return len(re.findall(r"\w+", text))


def _exercises(nb: NotebookNode) -> int:
    """The exercises the notebook sets (its markdown's ``Exercise N.k`` headings)."""
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    return len(set(re.findall(r"^#+ Exercise (\d+\.\d+)", text, re.MULTILINE)))


def learner_minutes(nb: NotebookNode, warm_seconds: float) -> int:
    """A learner's time for the lesson: reading, the exercises and a warm Run All, rounded up to 5 minutes."""
    exercises = _exercises(nb)
    minutes = _words(nb) / WORDS_PER_MINUTE + exercises * MINUTES_PER_EXERCISE + warm_seconds / 60
    return 5 * math.ceil(minutes / 5)


def time_line(nb: NotebookNode, cold_seconds: float, warm_seconds: float) -> str:
    """The header's time line: Run All cold and warm, measured, and the learner's time with what it rests on."""
    exercises = _exercises(nb)
    work = f"{exercises} exercise{'s' * (exercises != 1)} at about {MINUTES_PER_EXERCISE} min each"
    return (
        f"{TIME_PREFIX} Run All takes {_said(cold_seconds)} the first time after `make setup` and "
        f"{_said(warm_seconds)} after that, on a 2-core laptop (measured: `make bench`, part 4b). With reading "
        f"({_words(nb):,} words) and {work if exercises else 'no exercises'}, plan about "
        f"{learner_minutes(nb, warm_seconds)} min."
    )


def readme_line(notebooks: list[NotebookNode]) -> str:
    """The README's line for the whole course: the stated Run All times and learner's times of ``notebooks``,
    summed (a notebook that states no time counts nothing)."""
    timed = [(nb, pair) for nb, pair in zip(notebooks, map(stated, notebooks)) if pair is not None]
    cold, warm = (sum(pair[i] for _, pair in timed) / 60 for i in (0, 1))
    learner = sum(learner_minutes(nb, warm_seconds) for nb, (_, warm_seconds) in timed)
    return (
        f"{README_PREFIX} Run All of every lesson takes ~{cold:.0f} min the first time after `make setup` and "
        f"~{warm:.0f} min after that on 2 cores (measured: `make bench`, part 4b); with reading and the exercises, "
        f"plan ~{learner / 60:.1f} h (each lesson's header gives its own)."
    )
