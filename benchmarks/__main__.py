"""``python -m benchmarks`` (``make bench``): run every benchmark, write ``results.md`` and ``results.json``.

Parts: 1 ``loading`` (the Petastorm loaders at 32 and 224 px), 2 ``lightning``, 3 ``horovod``, 4 ``course``,
5 ``grading``, 6 ``launchers`` (Ray Train, TorchDistributor and Horovod on a 2-worker local cluster), 7 ``multihost``
(lesson 4's TorchDistributor training on a cluster of separate hosts vs the local cluster; needs root).

Options: ``--repeats N`` (at least 5), ``--quick`` (tiny sizes, and one repetition of part 6: checks that everything
runs, measures nothing useful; writes to ``benchmarks/out/`` instead),
``--only loading,lightning,horovod,course,grading,launchers,multihost`` (default all),
``--notebooks all|none|NAME,NAME`` (part 4: the solution notebooks to execute cold and warm, whose times are
recorded for the lessons' headers; default all),
``--class-size N`` (part 5: how many lesson-1 submissions are graded, sequentially and with ``--jobs 2``; default 20).
A run with ``--only`` writes a report of those parts alone: merge it into ``results.md`` by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

from benchmarks.common import BENCH_DIR, MIN_REPEATS, Comparison, Measurement, machine_info, write_report

REPO = BENCH_DIR.parent
PARTS = ("loading", "lightning", "horovod", "course", "grading", "launchers", "multihost")


def log(message: str) -> None:
    print(message, flush=True)


def part(title: str) -> None:
    """Log a part's title with the machine's load average when it starts."""
    log(f"{title} (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, results to benchmarks/out/")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument(
        "--notebooks",
        default="all",
        help="part 4: 'all' (default), 'none', or solution notebook names separated by commas",
    )
    parser.add_argument("--class-size", type=int, default=20, help="part 5: submissions in the graded class")
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
    log(
        f"machine: {machine['cores']} cores, {machine['cpu_model']}, load {machine['load_average_at_start']}, "
        f"python {machine['versions']['python']}, torch {machine['versions']['torch']}"
    )
    results: list[Comparison | Measurement] = []
    features = labels = None
    q = args.quick

    if "loading" in parts:
        from benchmarks.loading import run_loading

        part("== 1. data loading")
        loading, features, labels = run_loading(args.repeats, q, log=log)
        results += loading
    if "lightning" in parts:
        from benchmarks.lightning_overhead import LightningOverheadBench

        part("== 2. Lightning overhead")
        results += LightningOverheadBench(features, labels, epochs=1 if q else 8).run(args.repeats, log=log)
    if "horovod" in parts:
        from benchmarks.horovod_scaling import HorovodScalingBench

        part("== 3. Horovod scaling")
        bench = HorovodScalingBench(warmup=2 if q else 5, steps=4 if q else 40, large_batch=0 if q else 256)
        results += bench.run(args.repeats, log=log)
    missing = []
    if "course" in parts:
        from benchmarks.course_timing import CourseBench
        from helpers.course.build import solution_notebooks

        part("== 4. the course")
        available = [path.name for path in solution_notebooks()]
        if args.notebooks == "all":
            notebooks = available
        elif args.notebooks == "none":
            notebooks = []
        else:
            notebooks = [n.strip() for n in args.notebooks.split(",") if n.strip()]
            unknown_nb = sorted(set(notebooks) - set(available))
            if unknown_nb:
                parser.error(f"--notebooks: no solution notebook named {unknown_nb}; choose from {available}")
        if q:
            notebooks = []
        skipped = [n for n in available if n not in notebooks]
        if skipped:
            missing.append("4. Notebooks not executed in this run: " + ", ".join(skipped) + ".")
        results += CourseBench(notebooks, BENCH_DIR / "out", args.repeats).run(log=log)
    if "grading" in parts:
        from benchmarks.grading import GradingBench

        part("== 5. grading a class")
        results += GradingBench(2 if q else args.class_size, BENCH_DIR / "out").run(log=log)
    if "launchers" in parts:
        from benchmarks.launchers import LaunchersBench

        part("== 6. launchers")
        bench = LaunchersBench(epochs=1 if q else 3, image_size=16 if q else 32, work=BENCH_DIR / "out", quick=q)
        try:
            results += bench.run(args.repeats, log=log)
        finally:
            bench.close()
        missing += bench.missing
    if "multihost" in parts:
        from benchmarks.cluster_path import ClusterPathBench

        part("== 7. the cluster path across hosts")
        bench = ClusterPathBench(1 if q else args.repeats, 1 if q else 3, BENCH_DIR / "out")
        results += bench.run(log=log)
        missing += bench.missing
    total = time.perf_counter() - started
    machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    md, js = write_report(machine, results, total, missing, out_dir)
    log("")
    for r in results:
        if isinstance(r, Comparison):
            log(r.summary())
    log(f"whole run {total:.0f} s; wrote {md.relative_to(REPO)} and {js.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
