"""The lessons' pages: each diagram renders legibly, every image a notebook shows resolves inside it, the embedded
diagrams and stated run times are current (and a stale one is caught), and every lesson has its orientation,
recap, questions, reading and troubleshooting."""

from __future__ import annotations

import base64
import copy
import io
import itertools
import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Patch
from matplotlib.text import Text
from PIL import Image

from helpers.course import build, pages, run_times
from helpers.course.diagrams import DIAGRAMS

SOLUTIONS = build.solution_notebooks()
NOTEBOOKS = SOLUTIONS + [build.LESSONS_DIR / path.name for path in SOLUTIONS]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)[^)]*\)|<img[^>]*\bsrc=\"([^\"]+)\"")


def decoded(png: bytes) -> np.ndarray:
    """The image's RGB pixels (fails if the bytes are not a whole PNG)."""
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("diagram", DIAGRAMS, ids=lambda d: d.name)
def test_a_diagram_renders_to_a_legible_picture(diagram):
    pixels = decoded(pages.render_png(diagram))
    height, width, _ = pixels.shape
    assert 1000 <= width <= 1200 and 250 <= height <= 700  # a notebook cell shows it at about its own size
    drawn = (pixels < 250).any(axis=2).mean()  # boxes, arrows and text
    ink = (pixels < 128).any(axis=2).mean()  # text and lines only
    assert 0.05 < drawn < 0.9 and 0.005 < ink < 0.15, f"drawn {drawn:.1%}, dark {ink:.1%}"
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 8


def _extents(diagram):
    figure = diagram.draw()
    renderer = FigureCanvasAgg(figure).get_renderer()
    texts = [t for t in figure.findobj(Text) if t.get_text().strip() and t.get_visible()]
    patches = {p.get_gid(): p.get_window_extent(renderer) for p in figure.findobj(Patch) if p.get_gid()}
    return figure.bbox, [(t.get_text(), t.get_gid(), t.get_window_extent(renderer)) for t in texts], patches


@pytest.mark.parametrize("diagram", DIAGRAMS, ids=lambda d: d.name)
def test_no_text_overlaps_another_or_leaves_its_box(diagram):
    frame, texts, boxes = _extents(diagram)
    for text, gid, extent in texts:
        assert frame.contains(extent.x0, extent.y0) and frame.contains(extent.x1, extent.y1), text
        if gid in boxes:
            box = boxes[gid].padded(-2)
            assert box.contains(extent.x0, extent.y0) and box.contains(extent.x1, extent.y1), f"{text!r} leaves its box"
    for (a, _, first), (b, _, second) in itertools.combinations(texts, 2):
        assert not first.padded(-1).overlaps(second.padded(-1)), f"{a!r} overlaps {b!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_image_a_notebook_shows_resolves_inside_it(path):
    nb = build.read_notebook(path)
    shown = 0
    for cell in (c for c in nb.cells if c.cell_type == "markdown"):
        for match in IMAGE.finditer(cell.source):
            target = match.group(1) or match.group(2)
            name = target.removeprefix("attachment:")
            assert target.startswith("attachment:"), f"{target}: a relative path does not show on GitHub"
            decoded(base64.b64decode(cell.get("attachments", {})[name]["image/png"]))
            shown += 1
    assert shown >= 1, "every lesson shows at least one diagram"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_embedded_diagrams_and_stated_times_are_current(path):
    assert pages.problems(build.read_notebook(path), path.stem) == []


def test_a_stale_diagram_or_time_is_reported_and_refreshed():
    path = build.SOLUTIONS_DIR / "01_data_lake_petastorm.ipynb"
    nb = build.read_notebook(path)
    cell = next(c for c in nb.cells if "diagram" in c.metadata.get("course", {}))
    cell.metadata["course"]["source"] = "drawn-by-another"
    nb.metadata["course"][run_times.WARM] = 300
    found = build.problems(nb, path.stem)
    assert any("out of date with helpers/course/diagrams.py" in problem for problem in found)
    assert any("does not state the time" in problem for problem in found)
    del cell["attachments"]
    assert any("is not what it generates" in problem for problem in pages.problems(nb, path.stem))
    pages.update(nb, {run_times.COLD: 95, run_times.WARM: 290})
    assert pages.problems(nb, path.stem) == []
    assert nb.metadata["course"][run_times.COLD] == 95
    header = next(c for c in nb.cells if c.get("id") == pages.ORIENTATION_ID).source
    assert "about 1.5 min the first time after `make setup` and about 5 min after that" in header
    missing = copy.deepcopy(nb)
    missing.cells = [c for c in missing.cells if "diagram" not in c.metadata.get("course", {})]
    assert any("no cell shows the diagram" in problem for problem in pages.problems(missing, path.stem))


@pytest.mark.parametrize("seconds, said", [(17, "about 15 s"), (43, "about 45 s"), (92, "about 1.5 min")])
def test_the_time_line_says_the_measured_times_rounded_and_the_learner_s_time(seconds, said):
    nb = build.read_notebook(build.SOLUTIONS_DIR / "03_horovod_single_node.ipynb")
    line = run_times.time_line(nb, seconds, 30)
    assert line.startswith(f"**Time:** Run All takes {said} the first time after `make setup` and about 30 s after")
    exercises = len(build.structure(nb).exercises)
    assert f"and {exercises} exercises at about 5 min each, plan about " in line
    assert run_times.learner_minutes(nb, 30) >= exercises * 5 + 5  # a lesson has more than a few words to read
    assert run_times.learner_minutes(nb, 30 + 600) == run_times.learner_minutes(nb, 30) + 10


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_a_header_states_times_within_1_5x_of_the_latest_measured(path):
    measured = run_times.recorded().get(path.name)
    assert measured is not None, f"{path.name} has no measured times in benchmarks/course_times.json: make bench"
    cold, warm = run_times.stated(build.read_notebook(path))
    for said, latest in ((cold, measured[run_times.COLD]), (warm, measured[run_times.WARM])):
        assert latest / run_times.TOLERANCE <= said <= latest * run_times.TOLERANCE, (
            f"{path.name} states {said:.0f} s, measured {latest:.0f} s: run python -m helpers.course pages"
        )


def test_the_readme_states_the_course_s_totals():
    line = run_times.readme_line([build.read_notebook(path) for path in SOLUTIONS])
    assert line in run_times.README.read_text().splitlines(), "run python -m helpers.course pages"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_a_lesson_has_orientation_recap_questions_reading_and_troubleshooting(path):
    cells = {cell.get("id"): cell.source for cell in build.read_notebook(path).cells if cell.cell_type == "markdown"}
    order = [cell.get("id") for cell in build.read_notebook(path).cells]
    assert order.index("orientation") == 1 and order[-3:] == ["questions", "reading", "troubleshooting"]
    assert "**You will be able to:**" in cells["orientation"] and "**Before you start:**" in cells["orientation"]
    assert any(source.startswith("## Recap") for source in cells.values())
    answers = re.findall(r"<details><summary>(.+?)</summary>\s*\n\n(.+?)\n\n</details>", cells["questions"], re.S)
    assert 3 <= len(answers) <= 5 and len(answers) == cells["questions"].count("<details>")
    links = re.findall(r"\]\((https://[^)]+)\)", cells["reading"])
    assert len(links) >= 3
    rows = [line for line in cells["troubleshooting"].splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 3
