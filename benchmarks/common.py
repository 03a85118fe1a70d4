"""The benchmarks' harness: alternating repetitions, medians, ratios against a target, the machine, the report.

Every benchmark compares variants measured in the same run: ``alternate`` calls them in turn (A, B, A, B, ...)
so that a change in the machine's load affects all of them alike, and the comparison is the ratio of the medians.
Nothing here is imported by the course or its tests (apart from the pure math, tested in
``tests/test_bench_harness.py``).
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
MIN_REPEATS = 5


def profile_stats(fn: Callable[[], Any]) -> pstats.Stats:
    """Run ``fn`` under cProfile and return its statistics."""
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    return pstats.Stats(profiler)


def stats_text(stats: pstats.Stats, rows: int) -> str:
    """The ``rows`` functions with the most own time, as the stats table's text."""
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats("tottime").print_stats(rows)
    text = out.getvalue()
    start = text.find("   ncalls")
    return _short_paths(text[start:] if start >= 0 else text)


def _short_paths(text: str) -> str:
    """Profile text without this machine's paths: ``site-packages/...``, ``stdlib/...``, repository-relative."""
    import site
    import sysconfig

    prefixes = [(d, "site-packages") for d in {*site.getsitepackages(), sysconfig.get_paths()["purelib"]}]
    prefixes += [(sysconfig.get_paths()["stdlib"], "stdlib"), (str(BENCH_DIR.parent), ".")]
    for prefix, label in sorted(prefixes, key=lambda item: -len(item[0])):  # longest first: venv inside repo
        text = text.replace(prefix.rstrip("/") + "/", label + "/")
    return text


def profile_text(fn: Callable[[], Any], rows: int) -> str:
    """Run ``fn`` under cProfile; the ``rows`` functions with the most own time, as the stats table's text."""
    return stats_text(profile_stats(fn), rows)


def cumulative_seconds(stats: pstats.Stats, path_suffix: str, function: str) -> float:
    """Cumulative seconds of the profiled functions named ``function`` in files ending with ``path_suffix``."""
    return sum(
        entry[3]
        for (path, _, name), entry in stats.stats.items()  # type: ignore[attr-defined]
        if name == function and path.replace("\\", "/").endswith(path_suffix)
    )


def median(values: list[float]) -> float:
    """The median of a non-empty list (mean of the two middle values for an even count)."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def ratio(numerator: list[float], denominator: list[float]) -> float:
    """median(numerator) / median(denominator)."""
    bottom = median(denominator)
    if bottom == 0:
        raise ZeroDivisionError("the denominator's median is 0")
    return median(numerator) / bottom


def meets(value: float, target: float, direction: str) -> bool:
    """True when ``value`` meets ``target``: ``">="`` (at least) or ``"<="`` (at most)."""
    if direction == ">=":
        return value >= target
    if direction == "<=":
        return value <= target
    raise ValueError(f"direction={direction!r}: use '>=' or '<='")


def shortfall(value: float, target: float, direction: str) -> float:
    """How far ``value`` misses ``target``, as a fraction of the target (0.0 when it is met)."""
    if meets(value, target, direction):
        return 0.0
    return abs(value - target) / target


def alternate(
    variants: dict[str, Callable[[], float | dict[str, float]]],
    repeats: int = MIN_REPEATS,
    warmup: bool = True,
    log: Callable[[str], None] = print,
    minimum: int = MIN_REPEATS,
) -> dict[str, list[float]]:
    """Call every variant ``repeats`` times, in turn (A, B, C, A, B, C, ...); return each one's measurements.

    Each callable returns its own measurement (seconds, or a rate), or several measurements of one call as a
    dict, recorded as ``"<variant>@<key>"``. ``warmup`` first calls each once, unrecorded (imports, caches, JIT).
    ``repeats`` below ``minimum`` (``MIN_REPEATS``; lower it only for ``--quick``, which measures nothing) is
    raised to it.
    """
    repeats = max(repeats, minimum)
    if warmup:
        for fn in variants.values():
            fn()
    results: dict[str, list[float]] = {}
    for i in range(repeats):
        for name, fn in variants.items():
            value = fn()
            measured = {f"{name}@{key}": v for key, v in value.items()} if isinstance(value, dict) else {name: value}
            for key, v in measured.items():
                results.setdefault(key, []).append(v)
                log(f"    rep {i + 1}/{repeats} {key}: {v:.4g}")
    return results


@dataclass
class Comparison:
    """One measured ratio: ``numerator``'s median over ``denominator``'s, against a target."""

    name: str
    metric: str  # what the measurements are, e.g. "images/s" or "s"
    numerator: str
    denominator: str
    target: float
    direction: str  # ">=" or "<="
    values: dict[str, list[float]]
    notes: list[str] = field(default_factory=list)
    profile: str = ""
    report_only: bool = False  # no target of its own: the ratio is reported, the target shown for scale

    @property
    def ratio(self) -> float:
        return ratio(self.values[self.numerator], self.values[self.denominator])

    @property
    def passed(self) -> bool:
        return meets(self.ratio, self.target, self.direction)

    @property
    def verdict(self) -> str:
        if self.report_only:
            return "reported"
        return "PASS" if self.passed else "MISS"

    @property
    def gap(self) -> float:
        return 0.0 if self.report_only else shortfall(self.ratio, self.target, self.direction)

    def medians(self) -> dict[str, float]:
        return {name: median(values) for name, values in self.values.items()}

    def summary(self) -> str:
        miss = f" (misses by {self.gap:.1%} of the target)" if self.gap else ""
        target = "no target" if self.report_only else f"target {self.direction} {self.target}"
        return f"{self.name}: {self.numerator} / {self.denominator} = {self.ratio:.3f} ({target}) {self.verdict}{miss}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            ratio=self.ratio,
            passed=None if self.report_only else self.passed,
            medians=self.medians(),
            shortfall=self.gap,
        )
        return data


@dataclass
class Measurement:
    """A reported value without a comparator (part 4: wall time and peak memory)."""

    name: str
    values: dict[str, list[float]]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["medians"] = {k: median(v) for k, v in self.values.items() if v}
        return data


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, memory, versions and the load average when called."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError):
        mem_gb = float("nan")
    versions = {"python": platform.python_version()}
    for module in ("torch", "pytorch_lightning", "horovod", "pyspark", "petastorm", "pyarrow"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - a missing package is just reported as missing
            versions[module] = "missing"
    return {
        "when_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(mem_gb, 1),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "executable": _short_paths(sys.executable),  # no machine paths in the committed results
    }


class Timer:
    """``with Timer() as t: ...``; then ``t.seconds``."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start


def write_report(
    machine: dict[str, Any],
    results: list[Comparison | Measurement],
    total_s: float,
    missing: list[str],
    out_dir: Path = BENCH_DIR,
) -> tuple[Path, Path]:
    """Write ``results.json`` and ``results.md`` (a table, then each benchmark's notes and profile)."""
    data = {
        "machine": machine,
        "total_wall_s": round(total_s, 1),
        "not_measured": missing,
        "results": [r.to_json() for r in results],
    }
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(data, indent=2) + "\n")

    v = machine["versions"]
    lines = [
        "# Benchmark results (`make bench`)",
        "",
        f"Measured {machine['when_utc']} UTC on {machine['cores']} cores ({machine['cpu_model']}), "
        f"{machine['memory_gb']} GB, load average at start {machine['load_average_at_start']}"
        + (f", at end {machine['load_average_at_end']}" if "load_average_at_end" in machine else "")
        + "; "
        f"Python {v['python']}, torch {v['torch']}, Lightning {v['pytorch_lightning']}, horovod {v['horovod']}, "
        f"pyspark {v['pyspark']}, petastorm {v['petastorm']}. Whole run: {total_s:.0f} s.",
        "",
        "Each ratio is of medians over alternating repetitions (A, B, A, B, ...; at least "
        f"{MIN_REPEATS} each, after one unrecorded warm-up of each variant).",
        "",
        "| benchmark | compared | medians | ratio | target | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if isinstance(r, Comparison):
            med = r.medians()
            shown = ", ".join(f"{k}: {med[k]:.4g} {r.metric}" for k in r.values)
            verdict = r.verdict + (f" (by {r.gap:.1%})" if r.gap else "")
            target = "none" if r.report_only else f"{r.direction} {r.target}"
            lines.append(
                f"| {r.name} | {r.numerator} / {r.denominator} | {shown} | {r.ratio:.3f} | {target} | {verdict} |"
            )
        else:
            shown = ", ".join(f"{k}: {median(vals):.4g}" for k, vals in r.values.items() if vals)
            lines.append(f"| {r.name} | (no comparator) | {shown} | | | reported |")
    lines.append("")
    for r in results:
        lines += [f"## {r.name}", ""]
        if isinstance(r, Comparison):
            lines += [r.summary() + ".", ""]
            for name, vals in r.values.items():
                lines.append(f"- `{name}` ({r.metric}): " + ", ".join(f"{x:.4g}" for x in vals))
            lines.append("")
        else:
            for name, vals in r.values.items():
                lines.append(f"- `{name}`: " + ", ".join(f"{x:.4g}" for x in vals))
            lines.append("")
        lines += [f"{note}" for note in r.notes] + ([""] if r.notes else [])
        if isinstance(r, Comparison) and r.profile:
            lines += ["Profile:", "", "```", r.profile.rstrip(), "```", ""]
    if missing:
        lines += ["## Not measured", ""] + [f"- {m}" for m in missing] + [""]
    md_path = out_dir / "results.md"
    md_path.write_text("\n".join(lines))
    return md_path, json_path
