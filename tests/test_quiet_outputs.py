"""What the libraries print that a learner cannot act on stays out of the notebooks; their errors, and warnings about
the learner's own code, still show."""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.logs import dropped_records, python_warnings
from helpers.workdir import REPO_ROOT

# a warning of the learner's own code, which must still show next to the libraries' silenced ones
_OWN_WARNING = "warnings.warn('the learner s own deprecation', FutureWarning)"
_LIBRARY_IMPORTS = """
import warnings
import petastorm.spark  # warns that pyarrow.LocalFileSystem is deprecated
from tqdm import TqdmWarning
warnings.warn_explicit("IProgress not found. Please update jupyter and ipywidgets.", TqdmWarning, "auto.py", 21,
                       module="tqdm.auto")  # what tqdm.auto says in a kernel without ipywidgets
"""


_SPARK_JVM_OPTIONS = ("SPARK_LAUNCHER_OPTS", "SPARK_SUBMIT_OPTS")  # bin/spark-class's launcher JVM; the driver's


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment, from the repository, without an inherited
    PYTHONWARNINGS (unless ``env`` gives one)."""
    base = {name: value for name, value in os.environ.items() if name not in ("PYTHONWARNINGS", "JAVA_TOOL_OPTIONS")}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def _assert_only_own_warning(stderr: str) -> None:
    assert "LocalFileSystem is deprecated" not in stderr
    assert "IProgress not found" not in stderr
    assert "the learner s own deprecation" in stderr


def test_importing_helpers_first_silences_the_libraries_warnings_in_this_process():
    done = _python("import helpers\n" + _LIBRARY_IMPORTS + _OWN_WARNING)
    assert done.returncode == 0, done.stderr
    _assert_only_own_warning(done.stderr)


def test_processes_started_with_the_course_s_pythonwarnings_silence_them_without_importing_helpers():
    done = _python(_LIBRARY_IMPORTS + _OWN_WARNING, env={"PYTHONWARNINGS": python_warnings()})
    assert done.returncode == 0, done.stderr
    _assert_only_own_warning(done.stderr)


def test_spark_s_python_workers_get_the_filters_and_keep_an_existing_pythonwarnings(monkeypatch):
    from helpers.spark import configure_python_env

    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    configure_python_env()
    configure_python_env()  # twice: nothing added twice
    assert os.environ["PYTHONWARNINGS"] == python_warnings("error::DeprecationWarning")
    assert os.environ["PYTHONWARNINGS"].startswith("error::DeprecationWarning,ignore:pyarrow.LocalFileSystem")


def test_ray_s_missing_ipywidgets_note_is_not_logged_but_its_warnings_are():
    done = _python(
        "import helpers, logging, ray\n"
        "from ray.widgets.util import _has_missing\n"
        "_has_missing(('ipywidgets', None), message='Run pip install ipywidgets')\n"
        "logging.getLogger('ray.widgets.util').warning('a real warning of ray.widgets')\n"
    )
    assert done.returncode == 0, done.stderr
    assert "Missing packages" not in done.stderr
    assert "a real warning of ray.widgets" in done.stderr


@pytest.mark.slow
def test_the_driver_s_jvm_prints_no_banner_and_no_native_hadoop_warning_but_errors_still_show(tmp_path):
    done = _python(
        "from helpers.spark import get_spark\n"
        "spark = get_spark(cores=1)\n"
        "spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger('course').error('a real error')\n"
        "assert spark.range(3).count() == 3\n"
        "spark.stop()\n",
        # a learner's JVM: no JAVA_TOOL_OPTIONS (which prints its own banner); the suite's JVMs still write no
        # hsperfdata folder into the machine's /tmp: through Spark's own options for its launcher and driver JVMs
        env={"COURSE_WORK_DIR": str(tmp_path), **{name: "-XX:-UsePerfData" for name in _SPARK_JVM_OPTIONS}},
    )
    assert done.returncode == 0, done.stderr
    assert "Setting default log level" not in done.stderr
    assert "NativeCodeLoader" not in done.stderr
    assert "ERROR course: a real error" in done.stderr


def test_dropped_records_drop_only_the_named_starts_and_only_in_the_block(caplog):
    caplog.set_level(logging.INFO)
    logger = logging.getLogger("course-test-dropped")
    with dropped_records("course-test-dropped", "advice:", "more advice"):
        logger.warning("advice: use 4 CPUs")
        logger.warning("more advice\nin two lines")
        logger.error("a worker node failed")
    logger.warning("advice: after the block")
    assert [r.getMessage() for r in caplog.records] == ["a worker node failed", "advice: after the block"]


def test_ray_on_spark_s_sizing_advice_is_what_its_source_says():
    from ray.util.spark import cluster_init

    from helpers.ray_on_spark import _SIZING_ADVICE

    source = inspect.getsource(cluster_init)
    assert all(f'"{start}' in source for start in _SIZING_ADVICE)
    assert callable(cluster_init._start_ray_head_node)  # what helpers.ray_on_spark replaces while Ray starts


def _relayed(lines: list[str], capsys) -> tuple[str, list[str]]:
    """What :func:`helpers.ray_on_spark._start_head` prints of a head node that prints ``lines``, and its tail."""
    from helpers.ray_on_spark import _start_head

    code = "import sys; sys.stdout.write(" + repr("".join(lines)) + ")"
    process, tail = _start_head([sys.executable, "-c", code], synchronous=False, extra_env={"COURSE_TEST": "1"})
    assert process.wait(timeout=60) == 0
    for thread in threading.enumerate():
        if thread.name == "ray-head-output":
            thread.join(timeout=10)
    deadline = time.monotonic() + 10
    while len(tail) < len(lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    return capsys.readouterr().out, list(tail)


def test_the_ray_head_s_banner_is_not_printed_but_its_errors_are_and_ray_keeps_every_line(capsys):
    lines = [
        "2026-12-04 17:53:32,546\tSUCC scripts.py:898 -- \x1b[32mRay runtime started.\x1b[39m\n",
        "2026-12-04 17:53:32,546\tINFO scripts.py:901 -- \x1b[36mNext steps\x1b[39m\n",
        "2026-12-04 17:55:00,000\tERROR scripts.py:1100 -- Some Ray subprocesses exited unexpectedly:\n",
        "Traceback (most recent call last):\n",
    ]
    printed, tail = _relayed(lines, capsys)
    assert printed == lines[2] + lines[3]
    assert tail == lines  # Ray quotes them if the head fails to start


def test_deepspeed_s_op_announcement_is_dropped_and_the_rest_of_what_it_prints_kept(capsys):
    from helpers.deepspeed_launcher import _quiet_build

    def build():
        print("a compiler warning")
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        return "op"

    assert _quiet_build(build)() == "op"
    assert capsys.readouterr().out == "a compiler warning\n"


@pytest.mark.slow
def test_a_deepspeed_job_prints_neither_torchrun_s_thread_banner_nor_the_op_announcement(spark, capfd):
    from helpers.deepspeed_launcher import run_with_deepspeed
    from helpers.zero import zero_config
    from helpers.zero_measured import model_states_of_rank

    before = os.environ.get("OMP_NUM_THREADS")
    config = zero_config(2, micro_batch_size=2, world_size=2, optimizer="adam", learning_rate=1e-3)
    measured = run_with_deepspeed(model_states_of_rank, config, num_processes=2, spark=spark, width=8, layers=1)
    assert [row["rank"] for row in measured] == [0, 1]
    printed = "".join(capfd.readouterr())
    assert "Setting OMP_NUM_THREADS" not in printed
    assert "built successfully" not in printed
    assert os.environ.get("OMP_NUM_THREADS") == before  # the driver's environment as it was


def test_the_course_kernel_ignores_the_library_warnings_from_its_first_import():
    """A learner's own cell may import mlflow, ray or petastorm before helpers (the lessons no longer do): the
    kernel ``make setup`` registers sets ``PYTHONWARNINGS``, so the warnings are ignored before any import."""
    spec = Path(sys.prefix, "share", "jupyter", "kernels", "scaling-dl-spark", "kernel.json")
    env = json.loads(spec.read_text()).get("env", {})
    assert env.get("PYTHONWARNINGS") == python_warnings()
    assert env.get("PYDEVD_DISABLE_FILE_VALIDATION") == "1"  # no debugger note about frozen modules per kernel


@pytest.mark.parametrize("notebook", sorted((REPO_ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.stem)
def test_a_lesson_imports_helpers_before_the_libraries_that_warn(notebook):
    """Importing helpers quiets LIBRARY_WARNINGS and Ray's ipywidgets note, and switches Ray Train to its V2 API:
    a lesson that imports mlflow, petastorm, ray or Lightning first printed their warnings (lesson 2's setup cell
    tqdm's, lesson 6's the note twice) in the kernel the notebooks name, which has no PYTHONWARNINGS of its own."""
    lines = [
        line.strip()
        for cell in json.loads(notebook.read_text())["cells"]
        if cell["cell_type"] == "code"
        for line in "".join(cell["source"]).splitlines()
    ]
    libraries = tuple(f"{verb} {name}" for verb in ("import", "from") for name in WARNING_LIBRARIES)
    first_library = next((i for i, line in enumerate(lines) if line.startswith(libraries)), None)
    helpers_at = [i for i, line in enumerate(lines) if line.startswith(("import helpers", "from helpers"))]
    if first_library is not None:
        said = f"{notebook.name}: import helpers before {lines[first_library]!r}"
        assert helpers_at and helpers_at[0] < first_library, said


WARNING_LIBRARIES = ("mlflow", "petastorm", "ray", "pytorch_lightning")  # what they import raises LIBRARY_WARNINGS
