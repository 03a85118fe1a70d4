"""The environment: pins agree everywhere, the key packages import at the pinned versions, Horovod is built."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from tests.processes import installed_versions

ROOT = Path(__file__).resolve().parent.parent


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, pinned = line.split("==")
            pins[name.strip().lower()] = pinned.strip()  # with its extras, e.g. ray[default,train]
    return pins


def test_every_requirement_is_pinned_exactly():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[0-9][A-Za-z0-9_.+]*", line.strip()), line


def test_environment_yml_pins_equal_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "python=3.11" in deps and any(str(d).startswith("openjdk=17") for d in deps) and "pip" in deps
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict))
    yml_pins = {}
    for entry in pip_section:
        if entry.startswith("-e"):
            continue
        name, pinned = entry.split("==")
        yml_pins[name.lower()] = pinned
    assert yml_pins == requirement_pins()


def test_installed_versions_match_the_pins():
    installed = installed_versions([name.split("[")[0] for name in requirement_pins()])  # as pip sees them
    for name, pinned in requirement_pins().items():
        here = installed[name.split("[")[0]]
        assert here and here.split("+")[0] == pinned, f"{name}: installed {here}, pinned {pinned}"


def test_stack_constraints_from_the_brief():
    pins = requirement_pins()
    major = {name: int(pins[name].split(".")[0]) for name in ("pyarrow", "numpy")}
    assert major["pyarrow"] <= 14 and major["numpy"] < 2 and pins["pyspark"].startswith("3.5.")


@pytest.mark.parametrize("cores", [0, True, "2"])
def test_get_spark_refuses_bad_cores_before_starting(cores):
    from helpers import CourseInputError
    from helpers.spark import get_spark

    with pytest.raises(CourseInputError, match=r"^cores=.*: pass a whole number of at least 1\. Or None"):
        get_spark(cores=cores)


def test_horovod_is_built_with_pytorch_and_gloo():
    horovodrun = Path(sys.executable).parent / "horovodrun"
    result = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("[X] PyTorch" in line for line in lines)
    assert any("[X] Gloo" in line for line in lines)
    pinned = re.search(r"^# build: horovod==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert version("horovod") == pinned


@pytest.mark.parametrize(
    "module", ["petastorm.spark", "pytorch_lightning", "mlflow.pytorch", "deltalake", "horovod.torch"]
)
def test_course_modules_import(module):
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)
