"""A real Spark standalone cluster on this machine, for lesson 4 (multi-node scaling) without a cloud account.

``LocalCluster`` starts one Spark master and N workers as separate JVM processes on 127.0.0.1 (with the
``spark-class`` script of the pip package of pyspark), waits until every worker has registered and the application
has one executor per worker, and hands out a SparkSession connected to it::

    with LocalCluster(workers=2) as cluster:
        spark = cluster.spark            # tasks run in 2 executor JVMs, one per worker
        print(cluster.ui_url)            # the master's web UI
        cluster.kill_worker(1)           # lesson 4's fault demonstration: a worker machine dies ...
        cluster.restart_worker(1)        # ... and a replacement joins

Given the ``master_url`` of an instructor's cluster it starts nothing and only connects. On exit (also after an
error, at interpreter exit and on SIGTERM/SIGHUP) it stops the session and every process it started, so no JVM of
ours is left running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers import CourseInputError
from helpers.processes import clean_up_at_exit, kill_tree, process_tree, stop_processes
from helpers.shared_storage import check_shared_folder
from helpers.spark import QUICK_JVM_OPTIONS, configure_python_env, executor_count, find_java_home, get_spark
from helpers.validation import whole_number
from helpers.workdir import work_dir, work_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ClusterStartError",
    "LocalCluster",
    "alive_workers",
    "executor_memory_mb",
    "free_ports",
    "master_state",
    "parse_memory_mb",
    "slot_executor_size",
    "spark_class",
]

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Spark refuses executors below 1.5 x its 300 MiB reserved memory; a worker must hold one such executor.
MIN_EXECUTOR_MB = 450
MIN_WORKER_MB = 512
# Heap of the master and worker daemons themselves (not of the executors they launch): they only keep the
# cluster's state, and 3 of them run next to the driver, the executors and the training processes.
DAEMON_MEMORY = "256m"
# Heap of the driver (this process's JVM) on a cluster: the tasks run in the executors; it plans jobs and collects
# small results.
DRIVER_MEMORY = "1g"
_MEMORY_RE = re.compile(r"^\s*(\d+)\s*([kmgt])b?\s*$", re.IGNORECASE)
_MB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
# Clusters started by this process and not yet stopped: cleaned up at exit and on SIGTERM/SIGHUP.
_LIVE: set[LocalCluster] = set()


class ClusterStartError(RuntimeError):
    """The local cluster did not come up: the message names the log file to read."""


def parse_memory_mb(memory: str) -> int:
    """Megabytes in a Spark memory string such as ``"1g"``, ``"512m"`` or ``"2048MB"``.

    Args:
        memory: the size, a number and a unit (k, m, g or t, optionally followed by b).

    Returns:
        The size in whole megabytes.

    Raises:
        CourseInputError: anything else (a bare number too: Spark would read it as bytes).
    """
    match = _MEMORY_RE.match(memory) if isinstance(memory, str) else None
    if match is None:
        raise CourseInputError(f"memory_per_worker={memory!r} is not a memory size: use a string like '1g' or '512m'.")
    return int(int(match.group(1)) * _MB_PER_UNIT[match.group(2).lower()])


def executor_memory_mb(worker_mb: int) -> int:
    """Executor heap for a worker: three quarters of its memory (room for the Python workers), at least 450 MB.

    Args:
        worker_mb: the worker's memory in MB.

    Returns:
        The executor heap in MB (Spark refuses less than 450).
    """
    return max(MIN_EXECUTOR_MB, worker_mb * 3 // 4)


def free_ports(count: int) -> list[int]:
    """Distinct TCP ports that are free on 127.0.0.1 now (bound to port 0 together, then released).

    Args:
        count: how many ports.

    Returns:
        The port numbers.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def master_state(ui_url: str, timeout: float = 2.0) -> dict[str, Any]:
    """The master's state as its web UI reports it at ``<ui_url>/json/``.

    Args:
        ui_url: the master's web UI, ``http://HOST:PORT``.
        timeout: seconds to wait for the answer.

    Returns:
        The decoded JSON: ``workers``, ``activeapps``, ``status``...

    Raises:
        urllib.error.URLError: the web UI does not answer (not up yet, or gone).
    """
    with urllib.request.urlopen(f"{ui_url.rstrip('/')}/json/", timeout=timeout) as response:
        return json.load(response)


def _default_ui_url(master_url: str) -> str:
    """The web UI of a standalone master at ``spark://HOST:PORT``: Spark's default port, 8080."""
    return f"http://{master_url.removeprefix('spark://').rsplit(':', 1)[0]}:8080"


def alive_workers(state: dict[str, Any]) -> int:
    """How many workers a master counts as ALIVE.

    Args:
        state: a :func:`master_state` answer.

    Returns:
        The number of workers in state ALIVE.
    """
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


def spark_class() -> Path:
    """The ``bin/spark-class`` launcher shipped in the pyspark package.

    Returns:
        Its path.
    """
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"


@dataclass
class _Daemon:
    """One JVM this cluster started: its role, process and log file."""

    name: str
    process: subprocess.Popen
    log: Path

    def exit_message(self) -> str | None:
        """None while running; otherwise one line saying it exited and where its log is, with the log's last line."""
        code = self.process.poll()
        if code is None:
            return None
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
        last = f" (last line: {lines[-1].strip()})" if lines else ""
        return f"Spark {self.name} exited with code {code}; see {self.log}{last}"


class LocalCluster:
    """A Spark standalone cluster of ``workers`` worker JVMs on this machine, or a connection to an existing one.

    Use it as a context manager; ``__enter__`` returns the cluster, whose ``spark`` is the connected SparkSession
    (a SparkContext already active in this process is stopped first: there can be only one per process). The
    application gets one executor per worker with ``cores_per_worker`` cores and three quarters of
    ``memory_per_worker`` as heap, ``workers * cores_per_worker`` cores in all, and ``__enter__`` returns only once
    all those executors have registered (or raises ``ClusterStartError`` after ``start_timeout`` seconds).

    With ``master_url`` (``spark://HOST:PORT``, an instructor's cluster) nothing is started and on exit only the
    session is stopped; ``workers`` executors are asked of that cluster, each one task slot (one core, or one GPU
    and its share of the cores) as its master reports the workers (``master_ui_url``, by default port 8080 of the
    master's host: :func:`slot_executor_size`), the driver advertises the address that routes to the master
    (:mod:`helpers.network`), and before ``start()`` returns every executor's host has been seen to share the work
    folder (:func:`helpers.shared_storage.check_shared_folder`; ``check_shared=False`` leaves that to the caller,
    as the preflight does). ``spark_conf`` adds
    Spark properties to the application (and may override the executor sizing): failure handling such as
    ``spark.task.maxFailures``, GPU scheduling such as ``spark.task.resource.gpu.amount``, shared storage.

    The master, workers, and the executors and Python workers under them are stopped on ``__exit__``, at interpreter
    exit, on SIGTERM/SIGHUP (when no other handler is installed), and, where ``setpriv`` exists, by the kernel if
    this process is killed outright (parent-death signal: the JVMs die with the thread that started them, so start
    the cluster from the main thread).
    """

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "512m",
        master_url: str | None = None,
        app_name: str = "scaling-dl-on-spark-cluster",
        work: str | os.PathLike | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 15.0,
        spark_conf: dict[str, str] | None = None,
        master_ui_url: str | None = None,
        check_shared: bool = True,
    ) -> None:
        workers = whole_number("workers", workers)
        cores_per_worker = whole_number("cores_per_worker", cores_per_worker)
        self.worker_mb = parse_memory_mb(memory_per_worker)
        if self.worker_mb < MIN_WORKER_MB:
            raise CourseInputError(
                f"memory_per_worker={memory_per_worker!r} is below Spark's minimum for a worker: use at least '512m'."
            )
        if master_url is not None and not re.match(r"^spark://[^/:]+:\d+$", master_url):
            raise CourseInputError(
                f"master_url={master_url!r} is not a standalone master: use 'spark://HOST:PORT' (on YARN or Kubernetes "
                "start the kernel with a session on the cluster and leave SPARK_MASTER None: docs/instructor.md)."
            )
        self.workers = workers
        self.cores_per_worker = cores_per_worker
        self.app_name = app_name
        self.work = work
        self.spark_conf = {key: str(value) for key, value in (spark_conf or {}).items()}
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.connect_only = master_url is not None
        self.check_shared = check_shared
        self.master_url: str | None = master_url
        self.ui_url: str | None = master_ui_url or (_default_ui_url(master_url) if master_url else None)
        self.log_dir: Path | None = None
        self.spark: SparkSession | None = None
        self._daemons: list[_Daemon] = []

    # -- life cycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start the master and workers (unless connecting to ``master_url``), then connect ``self.spark``.

        Returns:
            This cluster.

        Raises:
            CourseInputError: it is already running.
            ClusterStartError: a daemon exited, or the cluster was not complete after ``start_timeout``.
        """
        if self.spark is not None:
            raise CourseInputError("This LocalCluster is already running: use its .spark, or stop() it first.")
        self._daemons = []
        _LIVE.add(self)
        clean_up_at_exit(_kill_all)
        try:
            if not self.connect_only:
                self._start_processes()
            self.spark = self._connect()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the session, then every process this cluster started (SIGTERM, SIGKILL after ``stop_timeout``)."""
        try:
            if self.spark is not None:
                self.spark.stop()
        finally:
            self.spark = None
            self._kill_processes()
            _LIVE.discard(self)

    # -- what tests and lessons look at -------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """Process ids of the JVMs the last ``start()`` launched, the master first, then the workers (kept after
        ``stop()`` so that one can check they are gone; empty when connected to ``master_url``)."""
        return [daemon.process.pid for daemon in self._daemons]

    def heaps_mb(self) -> dict[str, int]:
        """The most heap each JVM of this cluster may take, in MB: what it asks of the machine beyond Python.

        Returns:
            ``{"driver": ..., "master": ..., "worker-0": ..., "executor-0": ..., ...}``; without the master and
            workers when connected to ``master_url`` (they run elsewhere, and so do the executors).
        """
        heaps = {"driver": parse_memory_mb(self.spark_conf.get("spark.driver.memory", DRIVER_MEMORY))}
        if self.connect_only:
            return heaps
        executor = self.spark_conf.get("spark.executor.memory")
        heaps["master"] = parse_memory_mb(DAEMON_MEMORY)
        for i in range(self.workers):
            heaps[f"worker-{i}"] = parse_memory_mb(DAEMON_MEMORY)
            heaps[f"executor-{i}"] = parse_memory_mb(executor) if executor else executor_memory_mb(self.worker_mb)
        return heaps

    def worker_pids(self) -> list[int]:
        """Process ids of the worker JVMs, in worker index order."""
        return [daemon.process.pid for daemon in self._daemons if daemon.name.startswith("worker")]

    def alive_workers(self) -> int:
        """How many workers the master currently counts as ALIVE.

        Returns:
            The number of live workers.

        Raises:
            CourseInputError: the cluster is not started.
        """
        if self.ui_url is None:
            raise CourseInputError("alive_workers() needs a started cluster: call start() first.")
        return alive_workers(master_state(self.ui_url))

    def kill_worker(self, index: int) -> int:
        """SIGKILL a worker with its executor JVM and Python workers, as a crashed machine would die.

        The master notices the lost connection and marks the worker DEAD.

        Args:
            index: the worker, 0-based.

        Returns:
            The killed worker's pid.

        Raises:
            CourseInputError: no such worker, or it is not running.
        """
        worker_pids = self.worker_pids()
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(worker_pids):
            raise CourseInputError(
                f"kill_worker({index!r}): this cluster started {len(worker_pids)} workers, "
                f"use 0 to {len(worker_pids) - 1}."
            )
        daemon = next(d for d in self._daemons if d.process.pid == worker_pids[index])
        if daemon.process.poll() is not None:
            raise CourseInputError(
                f"kill_worker({index}): that worker is not running (killed before, or the cluster stopped)."
            )
        kill_tree(daemon.process.pid, timeout=self.stop_timeout)
        daemon.process.wait(timeout=self.stop_timeout)
        return daemon.process.pid

    def restart_worker(self, index: int) -> int:
        """Start a worker again after ``kill_worker(index)``, as a replacement machine joins.

        Returns once it has registered and the application has its executor on it again.

        Args:
            index: the worker, 0-based.

        Returns:
            The new worker's pid.

        Raises:
            CourseInputError: the cluster is not running, there is no such worker, or it is still running.
            ClusterStartError: the worker or its executor did not come up within ``start_timeout``.
        """
        worker_pids = self.worker_pids()
        valid = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(worker_pids)
        if self.spark is None or not valid:
            raise CourseInputError(
                f"restart_worker({index!r}): needs a running cluster this LocalCluster started, and an index from 0 "
                f"to {len(worker_pids) - 1}."
            )
        old = next(d for d in self._daemons if d.process.pid == worker_pids[index])
        if old.process.poll() is None:
            raise CourseInputError(
                f"restart_worker({index}): that worker is still running; kill_worker({index}) first."
            )
        position = self._daemons.index(old)
        daemon = self._launch_worker(index, self._daemon_env())  # its log continues the old one's
        self._daemons.remove(daemon)
        self._daemons[position] = daemon  # keeps worker_pids() in index order
        self._wait_until(lambda state: alive_workers(state) >= self.workers, f"worker {index} to register", [daemon])
        self._wait_for_executors(self.spark)
        return daemon.process.pid

    # -- internals ----------------------------------------------------------------------------------------------

    def _start_processes(self) -> None:
        """Start the master, wait for its web UI, start the workers and wait until all have registered."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        run = f"{stamp}-{os.getpid()}-{id(self):x}"
        self.log_dir = work_path("cluster", run, "master.log", override=self.work).parent
        master_port, master_ui = free_ports(2)
        self.master_url = f"spark://{HOST}:{master_port}"
        self.ui_url = f"http://{HOST}:{master_ui}"
        env = self._daemon_env()
        master = self._launch(
            "master", [MASTER_CLASS, "--host", HOST, "--port", str(master_port), "--webui-port", str(master_ui)], env
        )
        self._wait_until(lambda state: state.get("status") == "ALIVE", "the master to come up", [master])
        for i in range(self.workers):
            self._launch_worker(i, env)
        self._wait_until(
            lambda state: alive_workers(state) >= self.workers, f"{self.workers} workers to register", self._daemons
        )
        print(f"Spark master {self.master_url} with {self.workers} workers; web UI {self.ui_url}; logs {self.log_dir}")

    def _launch_worker(self, index: int, env: dict[str, str]) -> _Daemon:
        """Start worker ``index`` (its work folder and log under ``log_dir``) on a free web UI port."""
        assert self.log_dir is not None and self.master_url is not None
        worker_dir = self.log_dir / f"worker-{index}"
        worker_dir.mkdir(parents=True, exist_ok=True)
        (ui_port,) = free_ports(1)
        return self._launch(
            f"worker-{index}",
            [
                WORKER_CLASS,
                self.master_url,
                "--cores",
                str(self.cores_per_worker),
                "--memory",
                f"{self.worker_mb}m",
                "--host",
                HOST,
                "--webui-port",
                str(ui_port),
                "--work-dir",
                str(worker_dir),
            ],
            env,
        )

    def _daemon_env(self) -> dict[str, str]:
        """Environment of the master and workers: Java, loopback only, this interpreter for Python workers, and the
        course's JVM options (inherited by the executors the workers start)."""
        configure_python_env()
        env = dict(os.environ)
        env.update(
            JAVA_TOOL_OPTIONS=" ".join(filter(None, [env.get("JAVA_TOOL_OPTIONS"), QUICK_JVM_OPTIONS])),
            JAVA_HOME=str(find_java_home()),
            SPARK_HOME=str(spark_class().parent.parent),
            SPARK_LOCAL_IP=HOST,
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> _Daemon:
        """Start one daemon JVM in its own process group, its output appended to ``<log_dir>/<name>.log``."""
        assert self.log_dir is not None
        log = self.log_dir / f"{name}.log"
        command = [str(spark_class()), *args]
        setpriv = shutil.which("setpriv")
        if setpriv:
            command = [setpriv, "--pdeathsig", "TERM", "--", *command]
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        daemon = _Daemon(name, process, log)
        self._daemons.append(daemon)
        return daemon

    def _wait_until(self, ready: Callable[[dict[str, Any]], bool], what: str, daemons: list[_Daemon]) -> None:
        """Poll the master's JSON until ``ready(state)``; raise ``ClusterStartError`` naming the log files if one
        of ``daemons`` exits or ``start_timeout`` runs out."""
        assert self.ui_url is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            for daemon in daemons:
                message = daemon.exit_message()
                if message:
                    raise ClusterStartError(f"{message}. Waiting for {what}.")
            try:
                if ready(master_state(self.ui_url)):
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass  # the web UI is not up yet
            if time.monotonic() > deadline:
                logs = ", ".join(str(d.log) for d in daemons)
                raise ClusterStartError(f"Timed out after {self.start_timeout:g} s waiting for {what}; see {logs}.")
            time.sleep(0.25)

    def _connect(self) -> SparkSession:
        """A SparkSession on ``master_url`` whose executors fit the workers, once all of them have registered; on
        a running cluster, once every executor's host has been seen to share the work folder."""
        from pyspark import SparkContext

        active = SparkContext._active_spark_context
        if active is not None:
            print(f"Stopping the active SparkContext ({active.master}): a process can have only one.")
            active.stop()
        cores, memory_mb, gpus = self._executor_size()
        executor_conf = {
            "spark.driver.memory": DRIVER_MEMORY,
            "spark.executor.cores": str(cores),
            "spark.executor.memory": f"{memory_mb}m",
            "spark.task.cpus": "1",
            "spark.cores.max": str(self.workers * cores),
            **({"spark.executor.resource.gpu.amount": str(gpus)} if gpus else {}),
        }
        spark = get_spark(
            app_name=self.app_name,
            master=self.master_url,
            work=self.work,
            extra_conf={**executor_conf, **self.spark_conf},
        )
        try:
            self._wait_for_executors(spark)
            if self.connect_only and self.check_shared:
                check_shared_folder(spark, work_dir(self.work))
        except BaseException:
            spark.stop()
            raise
        return spark

    def _executor_size(self) -> tuple[int, int, int]:
        """Cores, heap (MB) and GPUs of each executor.

        Our own workers get one executor each, of ``cores_per_worker`` and ``memory_per_worker``. On a running
        cluster every executor is one task slot, one training process: one core (one GPU and its share of the cores
        with GPU scheduling), and the heap that lets the smallest worker hold one executor per slot; so a worker
        with 4 GPUs runs 4 training processes, and one with 2 cores beside a 1-core worker runs 2. The workers are
        read from the master (``master_ui_url``); if it cannot be read, the arguments are used, with a warning.
        """
        if not self.connect_only:
            return self.cores_per_worker, executor_memory_mb(self.worker_mb), 0
        try:
            workers = [w for w in master_state(self.ui_url)["workers"] if w.get("state") == "ALIVE"]
        except (OSError, ValueError, KeyError) as exc:
            workers, reason = [], f"its web UI {self.ui_url} cannot be read ({exc})"
        else:
            reason = f"its web UI {self.ui_url} lists no alive worker"
        if not workers:
            warnings.warn(
                f"Sizing executors for {self.master_url}: {reason}; using cores_per_worker={self.cores_per_worker} and "
                f"{self.worker_mb} MB per worker (pass master_ui_url=... or the workers' size).",
                stacklevel=4,
            )
            return self.cores_per_worker, executor_memory_mb(self.worker_mb), 0
        return slot_executor_size(workers, float(self.spark_conf.get("spark.task.resource.gpu.amount", "0")) > 0)

    def _wait_for_executors(self, spark: SparkSession) -> None:
        """Wait until the application has one executor per worker (per task slot on a running cluster), so the
        first job already spreads over all."""
        deadline = time.monotonic() + self.start_timeout
        while executor_count(spark) < self.workers:
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"Timed out after {self.start_timeout:g} s: {executor_count(spark)} of {self.workers} executors "
                    f"registered with the driver on {self.master_url}. {self._missing_executors_hint(spark)}"
                )
            time.sleep(0.25)

    def _missing_executors_hint(self, spark: SparkSession) -> str:
        """What to check when executors do not register: the driver's address, or the cluster's free slots."""
        if not self.connect_only:
            return f"Check the executor logs under {self.log_dir}."
        driver = f"{spark.conf.get('spark.driver.host')}:{spark.conf.get('spark.driver.port', '?')}"
        try:
            free = [(w["host"], w["coresfree"]) for w in master_state(self.ui_url)["workers"] if w["state"] == "ALIVE"]
        except (OSError, ValueError, KeyError):
            free = []
        where = f"its alive workers have free cores {free}" if free else f"its web UI {self.ui_url} cannot be read"
        return (
            f"Executors call the driver back at {driver}: every worker must reach that address (set "
            f"COURSE_DRIVER_HOST or COURSE_NETWORK_INTERFACE in runner.env to choose another); {where}, and each "
            "executor needs one core and its memory (the workers' logs say which)."
        )

    def _kill_processes(self) -> None:
        """SIGTERM every started process group and descendant, SIGKILL what is left after ``stop_timeout``, reap.

        Groups are signalled only while their leader is unreaped, so a reused pid can never be hit.
        """
        daemons = [daemon for daemon in self._daemons if daemon.process.returncode is None]
        tree = [proc for daemon in reversed(daemons) for proc in process_tree(daemon.process.pid)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for daemon in reversed(daemons):
                if daemon.process.poll() is None:
                    _signal_group(daemon.process.pid, sig)
            tree = stop_processes(tree, self.stop_timeout, (sig,))
        for daemon in daemons:
            daemon.process.wait(timeout=self.stop_timeout)


def slot_executor_size(workers: list[dict[str, Any]], by_gpu: bool) -> tuple[int, int, int]:
    """The size of an executor that is one task slot of a running cluster: cores, heap (MB) and GPUs.

    Every worker then holds one executor per slot it offers: per core, or with GPU scheduling per GPU (with that
    GPU's share of the worker's cores), and no more than its memory holds at Spark's minimum executor heap. The heap
    lets the smallest share of memory hold one executor.

    Args:
        workers: the alive workers as the master's JSON lists them (``cores``, ``memory`` in MB, ``resources``).
        by_gpu: whether each task takes a GPU.

    Returns:
        ``(cores, memory_mb, gpus)`` of each executor.
    """
    gpus = [len(w.get("resources", {}).get("gpu", {}).get("addresses", [])) for w in workers]
    slots = [max(1, min(g if by_gpu else w["cores"], w["memory"] // MIN_EXECUTOR_MB)) for w, g in zip(workers, gpus)]
    cores = min(max(1, w["cores"] // n) for w, n in zip(workers, slots)) if by_gpu else 1  # one task each
    memory = min(w["memory"] // n for w, n in zip(workers, slots))
    return cores, executor_memory_mb(memory), 1 if by_gpu else 0


def _signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid`` unless no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _kill_all() -> None:
    """Kill the processes of every cluster not stopped yet (at interpreter exit, where pyspark's own exit hook has
    already shut the driver's JVM down, so the sessions go with it)."""
    for cluster in list(_LIVE):
        cluster._kill_processes()


clean_up_at_exit(_kill_all)  # at import: runs after pyspark's own exit hook, which shuts the driver's JVM down
