"""scripts/databricks_setup.py: on an ML runtime, keep what the runtime ships and install only what it lacks."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from helpers.workdir import REPO_ROOT
from tests.processes import installed_versions

spec = importlib.util.spec_from_file_location("databricks_setup", REPO_ROOT / "scripts" / "databricks_setup.py")
setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup)

REQUIREMENTS = REPO_ROOT / "requirements.txt"
# Databricks Runtime 16 ML as far as the course is concerned: its own torch, pyspark, mlflow, numpy, pyarrow,
# pandas, ... and no Petastorm, deltalake, Lightning or Horovod
RUNTIME = {"torch": "2.5.1", "pyspark": "3.5.2", "mlflow": "2.19.0", "numpy": "1.26.4", "pyarrow": "15.0.2"}


def test_the_runtimes_packages_are_kept_and_only_what_it_lacks_is_installed():
    constraints, to_install, missing = setup.plan(REQUIREMENTS, RUNTIME.get)
    assert sorted(constraints) == sorted(f"{name}=={version}" for name, version in RUNTIME.items())
    names = [line.split("==")[0] for line in to_install]
    assert {"petastorm", "deltalake", "pytorch-lightning"} <= set(names)
    assert not set(names) & set(RUNTIME)  # nothing the runtime has is replaced
    assert not set(names) & set(setup.DEV_ONLY)  # no test or lint tools on a cluster
    assert missing == []


def test_a_machine_without_the_runtimes_essentials_is_refused():
    _, _, missing = setup.plan(REQUIREMENTS, {"torch": "2.5.1"}.get)
    assert missing == ["pyspark", "mlflow", "numpy"]


def test_the_command_writes_the_files_and_prints_the_pip_line(tmp_path: Path):
    out = tmp_path / "setup"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "databricks_setup.py"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "kept the runtime's torch==" in done.stdout and f"%pip install -c {out / 'constraints.txt'}" in done.stdout
    assert (out / "constraints.txt").read_text().startswith("torch==")


def test_a_pin_with_extras_is_kept_by_its_name_or_installed_with_its_extras():
    with_ray = setup.plan(REQUIREMENTS, {**RUNTIME, "ray": "2.37.0"}.get)
    assert "ray==2.37.0" in with_ray[0] and not [line for line in with_ray[1] if line.startswith("ray")]
    without = setup.plan(REQUIREMENTS, RUNTIME.get)
    assert "ray[default,train]==2.44.1" in without[1]


def test_the_course_pins_resolve_beside_the_runtimes_versions_without_replacing_any(tmp_path: Path):
    """This venv stands in for a runtime that lacks the course's data and training libraries: pip, given the plan's
    files, resolves them beside the kept versions and plans to install or replace nothing (they are here)."""
    lacking = {"petastorm", "deltalake", "pytorch-lightning", "scikit-learn"}
    names = [line.split("==")[0].split("[")[0] for line in REQUIREMENTS.read_text().splitlines() if "==" in line]
    installed = installed_versions([*names, *setup.NEVER_REPLACED])  # as pip sees them (see installed_versions)

    def runtime(name: str) -> str | None:
        return None if name in lacking else installed.get(name)

    constraints, to_install, _ = setup.plan(REQUIREMENTS, runtime)
    assert {line.split("==")[0] for line in to_install} == lacking
    (tmp_path / "constraints.txt").write_text("\n".join(constraints) + "\n")
    (tmp_path / "requirements.txt").write_text("\n".join(to_install) + "\n")
    report = tmp_path / "report.json"
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--report", str(report), "--quiet"]
    files = ["-c", str(tmp_path / "constraints.txt"), "-r", str(tmp_path / "requirements.txt")]
    resolved = subprocess.run([*pip, *files], capture_output=True, text=True)
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(report.read_text())["install"] == []
