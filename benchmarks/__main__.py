"""``python -m benchmarks`` (``make bench``): run every benchmark, write ``results.md`` and ``results.json``.

Options: ``--repeats N`` (at least 5), ``--quick`` (tiny sizes: checks that everything runs, measures nothing
useful; writes to ``benchmarks/out/`` instead), ``--only loading,lightning,horovod,course``,
``--notebook NAME`` (part 4: also execute this solution notebook once; ``none`` to skip).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

from benchmarks.common import BENCH_DIR, MIN_REPEATS, Comparison, Measurement, alternate, machine_info, write_report

REPO = BENCH_DIR.parent
PARTS = ("loading", "lightning", "horovod", "course")


def log(message: str) -> None:
    print(message, flush=True)


def _timed_command(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak resident memory (MiB, the largest single process in the tree) of a command."""
    time_bin = "/usr/bin/time" if Path("/usr/bin/time").exists() else shutil.which("time")
    started = time.perf_counter()
    result = subprocess.run([time_bin, "-f", "BENCH %M", *command], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    line = [x for x in result.stderr.splitlines() if x.startswith("BENCH ")][-1]
    return wall, int(line.split()[1]) / 1024


def course_part(repeats: int, notebook: str | None, out_dir: Path) -> list[Measurement]:
    """Part 4 (subset): a no-op ``make setup``, and optionally one solution notebook under papermill."""
    results = []
    walls, peaks = [], []
    first_wall, _ = _timed_command(["make", "-s", "setup"], REPO)  # unrecorded: brings .venv/.setup-done up to date
    log(f"    first make setup (unrecorded): {first_wall:.3g} s")
    for i in range(max(repeats, MIN_REPEATS)):
        wall, peak = _timed_command(["make", "-s", "setup"], REPO)
        walls.append(wall)
        peaks.append(peak)
        log(f"    rep {i + 1} make setup (no-op): {wall:.3g} s, {peak:.0f} MiB")
    results.append(Measurement("4a. make setup, nothing to do", {"wall_s": walls, "peak_rss_mib": peaks},
                               ["Wall time measured around the command (after one unrecorded call, which took "
                                f"{first_wall:.2g} s); peak memory is its maximum resident set size (the "
                                "largest single process of the tree)."]))
    if notebook:
        source = REPO / "solutions" / notebook
        out = out_dir / "notebooks"
        out.mkdir(parents=True, exist_ok=True)
        wall, peak = _timed_command([sys.executable, "-m", "papermill", "--kernel", "python3", "--log-level",
                                     "WARNING", str(source), str(out / notebook)], REPO)
        log(f"    {notebook}: {wall:.3g} s, {peak:.0f} MiB")
        results.append(Measurement(f"4b. {notebook} under papermill (one run)",
                                   {"wall_s": [wall], "peak_rss_mib": [peak]},
                                   ["One run, default parameters (the embedded digits); peak memory is the largest "
                                    "single process (the kernel, usually; Spark's JVM is a separate process and is "
                                    "counted only if it is larger)."]))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, results to benchmarks/out/")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--notebook", default="00_environment_check.ipynb",
                        help="solution notebook to time once in part 4 ('none' to skip)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    out_dir = BENCH_DIR / "out" if args.quick else BENCH_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "out").mkdir(exist_ok=True)

    started = time.perf_counter()
    machine = machine_info()
    log(f"machine: {machine['cores']} cores, {machine['cpu_model']}, load {machine['load_average_at_start']}, "
        f"python {machine['versions']['python']}, torch {machine['versions']['torch']}")
    results: list[Comparison | Measurement] = []
    features = labels = None
    q = args.quick

    if "loading" in parts:
        from benchmarks.loading import LoadingBench

        log("== 1. data loading")
        bench = LoadingBench(batches=10 if q else 150, warmup=2 if q else 10)
        results += bench.run(args.repeats, log=log)
        features, labels = bench.features, bench.labels
        bench.close()
    if "lightning" in parts:
        from benchmarks.lightning_overhead import LightningOverheadBench

        log("== 2. Lightning overhead")
        results += LightningOverheadBench(features, labels, epochs=1 if q else 8).run(args.repeats, log=log)
    if "horovod" in parts:
        from benchmarks.horovod_scaling import HorovodScalingBench

        log("== 3. Horovod scaling")
        bench = HorovodScalingBench(warmup=2 if q else 5, steps=4 if q else 40, large_batch=0 if q else 256)
        results += bench.run(args.repeats, log=log)
    missing = [
        "4. Wall time and peak memory of every solution notebook: only the no-op `make setup` and "
        f"{'one notebook (' + args.notebook + ')' if args.notebook != 'none' else 'no notebook'} are measured "
        "(all six take ~10 min, the whole `make bench` budget).",
    ]
    if "course" in parts:
        log("== 4. the course (subset)")
        notebook = None if args.notebook == "none" or q else args.notebook
        results += course_part(args.repeats, notebook, BENCH_DIR / "out")
    total = time.perf_counter() - started
    md, js = write_report(machine, results, total, missing, out_dir)
    log("")
    for r in results:
        if isinstance(r, Comparison):
            log(r.summary())
    log(f"whole run {total:.0f} s; wrote {md.relative_to(REPO)} and {js.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
