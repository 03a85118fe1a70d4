"""Part 5, grading a class: ``python -m helpers.course grade`` on N copies of a lesson-1 submission, one at a time
and with ``--jobs 2``.

The submission is the lesson 1 solution itself (every exercise answered), copied N times under student names, so
every copy does the same work: a fresh kernel, a local Spark session, the Delta table, Petastorm loaders. Each
variant grades the whole class into a fresh output folder (nothing to resume) as one child process, sampled by
:func:`benchmarks.course_timing.run_sampled` (wall time, peak memory of the whole process tree); CPU seconds are the
``RUSAGE_CHILDREN`` time of the grader and the processes it waited for (a lower bound: a daemon that is not
waited for is not counted). A class takes minutes, so each variant runs once, sequential first: the ratio is
reported, with the machine's load, and has no target.
"""

from __future__ import annotations

import csv
import os
import resource
import shutil
import sys
from pathlib import Path

from benchmarks.common import Comparison
from benchmarks.course_timing import run_sampled
from helpers.course.build import SOLUTIONS_DIR

LESSON = "01_data_lake_petastorm"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class GradingBench:
    def __init__(self, copies: int, out_dir: Path, jobs: int = 2) -> None:
        self.copies, self.jobs, self.out_dir = copies, jobs, out_dir / "grading"

    def _class(self) -> Path:
        """The submissions folder: ``studentNN__01_data_lake_petastorm.ipynb``, N copies of the solution."""
        folder = self.out_dir / "submissions"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for number in range(1, self.copies + 1):
            shutil.copyfile(SOLUTIONS_DIR / f"{LESSON}.ipynb", folder / f"student{number:02d}__{LESSON}.ipynb")
        return folder

    def _grade(self, submissions: Path, jobs: int, log=print) -> dict[str, float]:
        """Grade the class with ``--jobs jobs`` into a fresh folder; wall, CPU and memory, and the statuses."""
        out = self.out_dir / f"jobs{jobs}"
        shutil.rmtree(out, ignore_errors=True)
        command = [sys.executable, "-m", "helpers.course", "grade", str(submissions), "--out", str(out / "grades.csv")]
        load = os.getloadavg()[0]
        cpu = _cpu_seconds()
        run = run_sampled([*command, "--jobs", str(jobs)], timeout=3600)
        run["cpu_s"] = _cpu_seconds() - cpu
        run["load_1min_at_start"] = load
        with (out / "grades.csv").open(newline="", encoding="utf-8") as handle:
            statuses = [row["status"] for row in csv.DictReader(handle) if row["optional"] != "yes"]
        run["required_passed"] = statuses.count("passed") / len(statuses)
        log(
            f"    --jobs {jobs}: {run['wall_s']:.0f} s for {self.copies} submissions, {run['cpu_s']:.0f} CPU s, "
            f"peak {run['peak_tree_mib']:.0f} MiB, load {load:.1f} at start, "
            f"{run['required_passed']:.0%} of required checks passed"
        )
        return run

    def run(self, log=print) -> list[Comparison]:
        submissions = self._class()
        runs = {"sequential": self._grade(submissions, 1, log)}
        runs[f"jobs_{self.jobs}"] = self._grade(submissions, self.jobs, log)
        values = {name: [run["wall_s"]] for name, run in runs.items()}
        per = {name: run["wall_s"] / self.copies for name, run in runs.items()}
        notes = [
            f"{self.copies} copies of the lesson 1 solution graded once per variant (sequential first). Per "
            "submission: "
            + "; ".join(
                f"{name} {per[name]:.1f} s wall, {run['cpu_s'] / self.copies:.1f} CPU s counted (a lower bound), "
                f"peak tree {run['peak_tree_mib']:.0f} MiB, 1-minute load {run['load_1min_at_start']:.1f} at start, "
                f"{run['required_passed']:.0%} of required checks passed"
                for name, run in runs.items()
            )
            + ". A ratio below 1 means --jobs is faster. The machine is shared: a load above its core count "
            "means other work was running."
        ]
        return [
            Comparison(
                f"5. Grading {self.copies} lesson-1 submissions, --jobs {self.jobs} vs sequential",
                "s",
                f"jobs_{self.jobs}",
                "sequential",
                1.0,
                "<=",
                values,
                notes,
                report_only=True,
            )
        ]
