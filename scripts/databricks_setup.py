"""Install the course on a Databricks ML runtime without replacing what the runtime ships.

The runtime's own pyspark, torch, mlflow, numpy (and every other package of ``requirements.txt`` it already has) are
kept at its versions: they go into a constraints file, and only the packages the runtime lacks are installed, at the
course's pins. Horovod is never built here: Databricks Runtime 15.4 LTS ML ships it, 16.0 ML and later do not, and
the lessons pick TorchDistributor by themselves where it is missing (``LAUNCHER="auto"``).

Usage, from the repository's Git folder (a notebook cell, or a cluster-scoped init script for every node)::

    %sh python scripts/databricks_setup.py --out /local_disk0/course-setup
    %pip install -c /local_disk0/course-setup/constraints.txt -r /local_disk0/course-setup/requirements.txt .

or ``python scripts/databricks_setup.py --install`` to run that pip command itself. Development tools (tests, lint,
the browser, JupyterLab) are left out: Databricks has its own notebooks.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["DEV_ONLY", "NEVER_REPLACED", "main", "plan"]

REPO = Path(__file__).resolve().parent.parent
NEVER_REPLACED = ("pyspark", "torch", "mlflow", "numpy")  # a runtime without them is not an ML runtime
DEV_ONLY = (
    "papermill",
    "nbval",
    "nbformat",
    "jupyterlab",
    "ipykernel",
    "pytest",
    "pytest-timeout",
    "playwright",
    "ruff",
)
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[A-Za-z0-9_,\-]+\])?==(\S+)$")  # name, [extras], version


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def plan(requirements: Path, installed=_installed) -> tuple[list[str], list[str], list[str]]:
    """What to keep and what to install, from the course's pins and what is installed here.

    Args:
        requirements: the course's ``requirements.txt`` (``name==version`` lines).
        installed: gives a package's installed version, or None (default: this Python's packages).

    Returns:
        ``(constraints, to_install, missing_essentials)``: ``name==installed version`` for every course package
        already installed (kept as it is); the course's pins of the packages that are not (installed); and the
        names in :data:`NEVER_REPLACED` that are missing (this is not an ML runtime).
    """
    constraints, to_install = [], []
    for line in requirements.read_text().splitlines():
        match = _PIN.match(line.strip())
        if not match or match.group(1).lower() in DEV_ONLY:
            continue
        name = match.group(1)
        have = installed(name)
        if have is not None:  # kept as it is, extras and all (ray[default,train]: the runtime's Ray)
            constraints.append(f"{name}=={have}")
        else:
            to_install.append(line.strip())
    missing = [name for name in NEVER_REPLACED if installed(name) is None]
    return constraints, to_install, missing


def main(argv: list[str] | None = None) -> int:
    """Write ``constraints.txt`` and ``requirements.txt`` into ``--out`` (and with ``--install``, run pip)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/local_disk0/course-setup"), help="where the files go")
    parser.add_argument("--install", action="store_true", help="also run pip with them (and install the course)")
    args = parser.parse_args(argv)
    constraints, to_install, missing = plan(REPO / "requirements.txt")
    if missing:
        print(
            f"error: {', '.join(missing)} not installed: this is not a Databricks ML runtime; use `make setup` "
            "on a plain machine instead.",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "constraints.txt").write_text("\n".join(constraints) + "\n")
    (args.out / "requirements.txt").write_text("\n".join(to_install) + "\n")
    horovod = _installed("horovod")
    launcher = (
        f"Horovod {horovod} is installed (lessons 3-5 use it)"
        if horovod
        else "no Horovod: LAUNCHER='auto' picks TorchDistributor, lesson 3 stops"
    )
    kept = ", ".join(c for c in constraints if c.split("==")[0] in NEVER_REPLACED)
    more = len(constraints) - len(NEVER_REPLACED)
    print(f"kept the runtime's {kept} and {more} more; to install: {', '.join(to_install) or 'nothing'}; {launcher}")
    if not args.install:
        print(f"%pip install -c {args.out / 'constraints.txt'} -r {args.out / 'requirements.txt'} {REPO}")
        return 0
    pip = [sys.executable, "-m", "pip", "install", "-c", str(args.out / "constraints.txt")]
    return subprocess.call([*pip, "-r", str(args.out / "requirements.txt"), str(REPO)])


if __name__ == "__main__":
    sys.exit(main())
