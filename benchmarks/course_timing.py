"""Part 4, the course itself: wall time and peak memory of every solution notebook under papermill, and of a
``make setup`` that has nothing to do.

Each command runs as a child process; a sampler thread reads the resident memory of the child and all of its
descendants (the Jupyter kernel, Spark's JVMs, Horovod and TorchDistributor workers) every 0.1 s with psutil.
Two peaks are reported: the largest sum over the whole process tree at one moment (what the machine must hold),
and the largest single process. Notebooks run once each with their default parameters (the embedded digits), in
course order, each in a fresh kernel; ``make setup`` runs 5 times after one unrecorded call.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil

from benchmarks.common import MIN_REPEATS, Measurement
from helpers.course.build import SOLUTIONS_DIR
from helpers.course.run import papermill_command
from helpers.processes import tree_memory

REPO = Path(__file__).resolve().parent.parent
SAMPLE_EVERY_S = 0.1


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

    def notebook(self, name: str, log=print) -> dict[str, float]:
        out = self.out_dir / "notebooks"
        out.mkdir(parents=True, exist_ok=True)
        run = run_sampled(papermill_command(SOLUTIONS_DIR / name, out / name))
        log(
            f"    {name}: {run['wall_s']:.0f} s, peak {run['peak_tree_mib']:.0f} MiB (tree), "
            f"{run['peak_process_mib']:.0f} MiB (one process)"
        )
        return run

    def run(self, log=print) -> list[Measurement]:
        results = [self.setup_noop(log)]
        if not self.notebooks:
            return results
        runs = {name: self.notebook(name, log) for name in self.notebooks}
        for i, (name, run) in enumerate(runs.items()):
            notes = []
            if i == 0:
                notes.append(
                    f"One run of each notebook, default parameters (the embedded digits, local Spark; lesson 4 "
                    f"starts and stops its own 2-worker standalone cluster). All {len(runs)} took "
                    f"{sum(r['wall_s'] for r in runs.values()):.0f} s; the largest process tree held "
                    f"{max(r['peak_tree_mib'] for r in runs.values()):.0f} MiB. `peak_tree_mib`: the kernel, "
                    "Spark's JVMs and the training workers together; `peak_process_mib`: the largest one. "
                    "Sampled every 0.1 s, so a shorter spike can be missed."
                )
            results.append(Measurement(f"4b. {name} under papermill", {k: [v] for k, v in run.items()}, notes))
        return results
