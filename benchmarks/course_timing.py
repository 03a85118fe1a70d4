"""Part 4, the course itself: wall time and peak memory of every solution notebook under papermill, and of a
``make setup`` that has nothing to do.

Each command runs as a child process; a sampler thread reads the resident memory of the child and all of its
descendants (the Jupyter kernel, Spark's JVMs, Horovod and TorchDistributor workers) every 0.1 s with psutil.
Two peaks are reported: the largest sum over the whole process tree at one moment (what the machine must hold),
and the largest single process. Notebooks run with their default parameters (the embedded digits), in course order,
each in a fresh kernel, in a fresh work folder (cold, as a learner's first Run All after ``make setup``) and then
again in that folder (warm); both are recorded in :data:`helpers.course.run_times.RECORD`.
``make setup`` runs 5 times after one unrecorded call.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import psutil

from benchmarks.common import MIN_REPEATS, Measurement, machine_info
from helpers.course.build import SOLUTIONS_DIR
from helpers.course.run import papermill_command
from helpers.course.run_times import COLD, RECORD, WARM, write_record
from helpers.processes import tree_memory

REPO = Path(__file__).resolve().parent.parent
SAMPLE_EVERY_S = 0.1
RUNS = ("cold", "warm")


def run_sampled(command: list[str], cwd: Path = REPO, timeout: float = 600) -> dict[str, float]:
    """Run ``command``; return its wall seconds and peak memory (MiB) of the process tree and of one process.

    Raises ``RuntimeError`` with the output's tail if the command fails or runs past ``timeout``.
    """
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(child.pid)
    peaks = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total, largest = tree_memory(root.pid)
            peaks[0], peaks[1] = max(peaks[0], total), max(peaks[1], largest)
            done.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        raise RuntimeError(f"{' '.join(command)} ran past {timeout:.0f} s:\n{output[-2000:]}") from None
    finally:
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {child.returncode}):\n{output[-2000:]}")
    mib = 1024 * 1024
    return {"wall_s": wall, "peak_tree_mib": peaks[0] / mib, "peak_process_mib": peaks[1] / mib}


class CourseBench:
    """Part 4: ``make setup`` with nothing to do, and each solution's Run All cold and warm.

    Args:
        notebooks: the solution file names to run, in course order.
        out_dir: where the executed copies and the work folder go.
        repeats: runs of the no-op ``make setup``.

    The notebooks' times are written to :data:`helpers.course.run_times.RECORD`.
    """

    def __init__(self, notebooks: list[str], out_dir: Path, repeats: int = MIN_REPEATS) -> None:
        self.notebooks, self.out_dir, self.repeats = notebooks, out_dir, max(repeats, MIN_REPEATS)

    def setup_noop(self, log=print) -> Measurement:
        first = run_sampled(["make", "-s", "setup"])  # brings .venv/.setup-done up to date; not recorded
        log(f"    first make setup (unrecorded): {first['wall_s']:.3g} s")
        values: dict[str, list[float]] = {"wall_s": [], "peak_tree_mib": []}
        for i in range(self.repeats):
            run = run_sampled(["make", "-s", "setup"])
            values["wall_s"].append(run["wall_s"])
            values["peak_tree_mib"].append(run["peak_tree_mib"])
            log(f"    rep {i + 1} make setup (no-op): {run['wall_s']:.3g} s")
        return Measurement(
            "4a. make setup, nothing to do",
            values,
            [
                f"Wall time around the command, after one unrecorded call ({first['wall_s']:.2g} s). A command this "
                "short may end before the first memory sample, so its peak can read 0."
            ],
        )

    def notebook(self, name: str, work: Path, run: str, log=print) -> dict[str, float]:
        """One Run All of solution ``name`` under papermill in work folder ``work`` (``run``: "cold" or "warm")."""
        out = self.out_dir / "notebooks" / run
        out.mkdir(parents=True, exist_ok=True)
        sampled = run_sampled(papermill_command(SOLUTIONS_DIR / name, out / name, parameters={"WORK_DIR": str(work)}))
        log(
            f"    {name} ({run}): {sampled['wall_s']:.0f} s, peak {sampled['peak_tree_mib']:.0f} MiB (tree), "
            f"{sampled['peak_process_mib']:.0f} MiB (one process)"
        )
        return sampled

    def run(self, log=print) -> list[Measurement]:
        results = [self.setup_noop(log)]
        if not self.notebooks:
            return results
        work = self.out_dir / "course-work"  # fresh: the cold pass builds the tables and caches a learner's would
        shutil.rmtree(work, ignore_errors=True)
        passes = {run: {name: self.notebook(name, work, run, log) for name in self.notebooks} for run in RUNS}
        times = {name: {COLD: passes["cold"][name]["wall_s"], WARM: passes["warm"][name]["wall_s"]}
                 for name in self.notebooks}  # fmt: skip
        machine = machine_info()
        write_record(times, {"date": time.strftime("%Y-%m-%d"), "cores": machine["cores"],
                             "cpu_model": machine["cpu_model"]})  # fmt: skip
        log(f"    recorded in {RECORD.relative_to(REPO)}: run `python -m helpers.course pages` to state them")
        for i, name in enumerate(self.notebooks):
            notes = []
            if i == 0:
                cold, warm = (sum(r["wall_s"] for r in passes[run].values()) for run in RUNS)
                notes.append(
                    f"Every notebook in course order, default parameters (the embedded digits, local Spark; lesson 4 "
                    f"starts and stops its own 2-worker standalone cluster), in a fresh work folder (cold: "
                    f"{cold:.0f} s for all {len(self.notebooks)}), then all again in that folder (warm: {warm:.0f} s). "
                    f"The largest process tree held "
                    f"{max(r['peak_tree_mib'] for p in passes.values() for r in p.values()):.0f} MiB. "
                    "`peak_tree_mib`: the kernel, Spark's JVMs and the training workers together; `peak_process_mib`: "
                    "the largest one. Sampled every 0.1 s, so a shorter spike can be missed."
                )
            values = {f"{run}_{key}": [passes[run][name][key]] for run in RUNS for key in passes[run][name]}
            results.append(Measurement(f"4b. {name} under papermill", values, notes))
        return results
