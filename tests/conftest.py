"""Shared fixtures: a throw-away work directory for the whole run, a local SparkSession, image folders; the run's
temporary files kept in one session folder, deleted at the end, and a check that nothing is left in /tmp."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

# Everything the test run writes goes under one session folder, deleted at the end: the course's work directory
# (COURSE_WORK_DIR: tables, checkpoints, MLflow stores) and the temporary folder of every process the suite starts
# (TMPDIR for Python's tempfile, pytest's basetemp, torch elastic, Horovod, Jupyter kernels; SPARK_LOCAL_DIRS for
# Spark's block managers; java.io.tmpdir for the JVMs' native libraries, and no hsperfdata files). Set before any
# helper runs or any JVM starts; child processes inherit it.
_TMP_ROOT = Path(tempfile.gettempdir())
_TMP_BEFORE = set(os.listdir(_TMP_ROOT))
_SESSION = Path(tempfile.mkdtemp(prefix="course-tests-"))
_SESSION_WORK = _SESSION / "work"
_SESSION_TMP = _SESSION / "tmp"
_SESSION_WORK.mkdir()
_SESSION_TMP.mkdir()
os.environ["COURSE_WORK_DIR"] = str(_SESSION_WORK)
os.environ["TMPDIR"] = tempfile.tempdir = str(_SESSION_TMP)
os.environ["SPARK_LOCAL_DIRS"] = str(_SESSION_TMP)
os.environ["JAVA_TOOL_OPTIONS"] = " ".join(
    filter(None, [os.environ.get("JAVA_TOOL_OPTIONS"), f"-Djava.io.tmpdir={_SESSION_TMP}", "-XX:-UsePerfData"])
)

# What the tools the suite runs leave in the temporary folder when they are not redirected (or are killed).
TEMP_LITTER = (
    "blockmgr-",
    "spark-",
    "liblz4-java",
    "snappy-",
    "hsperfdata_",
    "torchelastic_",
    "torchinductor_",
    "pytest-of-",
    "pymp-",
    "tmp",
    _SESSION.name,
)


# Where the time goes: seconds per test module and phase, summed over every test (each xdist worker's reports reach
# the controller, which prints the table at the end; a shared fixture's start counts in the setup of its first test).
_SECONDS: Counter[tuple[str, str]] = Counter()
# and how long each check of the executed solutions took (a test's ``record_property("check_seconds", [(id, s)])``):
# feedback should come within FAST_CHECK_S on 2 cores; the slower ones are listed, as the module table is, not failed
CHECK_SECONDS = "check_seconds"
FAST_CHECK_S = 20
_CHECKS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[(report.nodeid.split("::")[0], report.when)] += report.duration
    for name, value in report.user_properties:
        if name == CHECK_SECONDS:
            _CHECKS.update(value)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    modules = Counter()
    for (module, _), seconds in _SECONDS.items():
        modules[module] += seconds
    if not modules:
        return
    terminalreporter.write_sep("=", f"seconds per test module, {sum(modules.values()):.0f} s in all")
    terminalreporter.write_line(f"{'total':>7} {'setup':>7}  module")
    for module, seconds in modules.most_common():
        terminalreporter.write_line(f"{seconds:7.0f} {_SECONDS[(module, 'setup')]:7.0f}  {module}")
    slow = sorted(
        ((seconds, exercise) for exercise, seconds in _CHECKS.items() if seconds > FAST_CHECK_S), reverse=True
    )
    if _CHECKS:
        terminalreporter.write_sep("=", f"checks over {FAST_CHECK_S} s: {len(slow)} of the {len(_CHECKS)} run")
        for seconds, exercise in slow:
            terminalreporter.write_line(f"{seconds:7.1f}  {exercise}")


def litter(before: set[str], after: set[str]) -> list[str]:
    """The entries of the temporary folder that are new since ``before`` and named like the suite's tools' files
    (entries of unrelated processes on the machine do not count)."""
    return sorted(name for name in after - before if name.startswith(TEMP_LITTER))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After the session fixtures are torn down, delete the session folder; then fail the run if anything the
    suite started still wrote into the machine's temporary folder."""
    shutil.rmtree(_SESSION, ignore_errors=True)
    left = litter(_TMP_BEFORE, set(os.listdir(_TMP_ROOT)))
    if left:
        session.config.get_terminal_writer().line(
            f"the test run left {len(left)} entries in {_TMP_ROOT}: {', '.join(left[:20])} "
            "(the suite's processes write temporary files under tempfile.gettempdir(), its session folder; on a shared "
            "machine another process may have made them: run the suite alone to be sure)",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# `make test` runs the multi-host tests alone (`-m multihost`), then the rest on 2 pytest-xdist workers (`-n 2 --dist
# loadgroup`): while one waits on a JVM, a process start or a timeout, the other computes. A module's tests stay on
# one worker, so its module fixtures (trainings, MLflow stores, a cluster) are built once; the modules of independent
# notebook runs spread over both. The costly groups go first, so that no worker is left with one long group at the end.
SPREAD = ("test_notebooks.py", "test_without_horovod.py")
COSTLY_FIRST = (
    "test_notebooks.py",
    "test_without_horovod.py",
    "multihost",
    "cluster_session",
    "test_analysis.py",
    "test_answers_lesson3.py",
    "test_answers_lesson4.py",
    "test_answers_lesson5.py",
    "test_grade.py",
    "test_browser.py",
)


SESSIONS = ("multihost", "cluster_session")  # session fixtures whose tests span modules


def xdist_group(item: pytest.Item) -> str:
    """The worker group of a test: the session it judges (a cluster, a Ray cluster), its module, or its own (a
    notebook run)."""
    fixtures = getattr(item, "fixturenames", ())
    session = next((name for name in SESSIONS if name in fixtures), None)
    if session:
        return session
    return item.nodeid if item.path.name in SPREAD else item.path.name


# `pytest --lesson N` (`make test-lesson L=N`): one lesson's tests for the inner loop: its notebook's runs, its answer
# corpus and the tests of the helpers and launchers it teaches with.
LESSON_TESTS = {
    "0": ("test_environment.py",),
    "1": ("test_answers_lesson1.py", "test_lake.py", "test_loaders.py", "test_datamodule.py"),
    "2": ("test_answers_lesson2.py", "test_model_training.py", "test_tracking.py", "test_devices.py"),
    "3": ("test_answers_lesson3.py", "test_horovod_runner.py", "test_horovod_strategy.py", "test_horovod_training.py",
          "test_stalls.py", "test_jobs.py"),
    "4": ("test_answers_lesson4.py", "test_cluster.py", "test_distributor.py", "test_multi_node_faults.py",
          "test_lost_hosts.py", "test_network.py", "test_multihost.py", "test_preflight.py"),
    "5": ("test_answers_lesson5.py", "test_analysis.py", "test_step_scaling.py"),
    "6": ("test_answers_lesson6.py", "test_ray_on_spark.py", "test_deepspeed_launcher.py", "test_zero.py"),
}  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lesson", choices=sorted(LESSON_TESTS), help="run only the tests of this lesson (0-6)")


def of_lesson(item: pytest.Item, lesson: str) -> bool:
    """Whether ``item`` tests lesson ``lesson``: a run of its notebook (``[0N_...]``) or a module of its own."""
    notebook = item.path.name in SPREAD and (f"[0{lesson}" in item.nodeid or f"lesson_{lesson}_" in item.name)
    return notebook or item.path.name in LESSON_TESTS[lesson]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids it schedules by
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def cost_rank(item: pytest.Item) -> int:
        names = (xdist_group(item), item.path.name)
        return next((i for i, name in enumerate(COSTLY_FIRST) if name in names), len(COSTLY_FIRST))

    lesson = config.getoption("--lesson")
    if lesson is not None:
        config.hook.pytest_deselected(items=[item for item in items if not of_lesson(item, lesson)])
        items[:] = [item for item in items if of_lesson(item, lesson)]
    items.sort(key=cost_rank)  # stable: each module keeps its own order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


@pytest.fixture(autouse=True)
def no_exported_mlflow_uri():
    """A test leaves ``MLFLOW_TRACKING_URI`` as it found it: ``mlflow.set_tracking_uri`` exports it, and every later
    process of this xdist worker (a notebook's kernel, a launcher's ranks) would inherit another test's store."""
    exported = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if exported is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = exported


@pytest.fixture(scope="session")
def session_work_dir() -> Path:
    """The work directory shared by the whole test run."""
    return _SESSION_WORK


@pytest.fixture
def work_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's work directory: course code (and the worker processes it starts, through ``COURSE_WORK_DIR``)
    writes its checkpoints, MLflow store and job reports under the test's ``tmp_path``."""
    monkeypatch.setenv("COURSE_WORK_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def multihost():
    """The cluster of separate hosts (helpers.multihost: spark-master, worker-1 with 2 cores, worker-2 with 1, driver,
    mlflow), started once on the xdist worker that runs the tests needing it and torn down at the end, also when a
    test fails; skipped, with the reason, where namespaces cannot be made (not root)."""
    from helpers.multihost import MultiHostCluster, namespaces_available

    reason = namespaces_available()
    if reason:
        pytest.skip(reason)
    shared = _SESSION / "multihost-shared"
    shared.mkdir()
    with MultiHostCluster(worker_cores=(2, 1), shared=shared) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession (2 cores) for the whole run."""
    from helpers.spark import get_spark

    session = get_spark(cores=2)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's trainings: on a shared 2-core machine, OpenMP threads fighting other
    processes stall (use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def digits_dir(session_work_dir: Path) -> Path:
    """The embedded default data set, written once."""
    from helpers.data import embedded_digits

    return embedded_digits(session_work_dir)


@pytest.fixture(scope="session")
def digits_data(spark, digits_dir: Path):
    """The embedded digits prepared once for 2 devices: ``(df, train_converter, val_converter, class_names)``."""
    from helpers.loaders import prepare_data

    return prepare_data(digits_dir, num_devices=2, spark=spark)


@pytest.fixture(scope="session")
def cluster_session(tmp_path_factory) -> tuple[dict, str, Path]:
    """The suite's one 2-worker cluster session, for test_cluster.py, test_ray_on_spark.py, lesson 6's 6.2 answers and
    test_multi_node_faults.py (a cluster and a Ray start are the slow part): tests/scripts/cluster_session.py run to
    its end; its report, its output and its work folder."""
    import json

    from tests.image_folders import make_image_folder
    from tests.processes import run_driver

    work = tmp_path_factory.mktemp("cluster-work")
    data = make_image_folder(tmp_path_factory.mktemp("cluster-data"), {"dark": 60, "light": 60}, size=(16, 16))
    # generous: a cluster starts in 15-40 s and Ray in 50-180 s on 2 busy cores
    start_timeout, training_timeout, ray_timeout = 180, 300, 900
    report, stdout = run_driver(
        "cluster_session", work, 2 * start_timeout + training_timeout + ray_timeout, data, start_timeout,
        training_timeout,
    )  # fmt: skip
    ray = report["ray"]
    print(f"\nRay on Spark session: {json.dumps(ray['timings_s'])}, peak {ray['peak_rss_mb']} MB")
    return report, stdout, work


@pytest.fixture(scope="session")
def ray_session(cluster_session) -> dict:
    """The Ray part of the cluster session (tests/scripts/ray_session.py): its report."""
    return cluster_session[0]["ray"]
