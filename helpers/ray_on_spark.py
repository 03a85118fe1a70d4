"""A Ray cluster on the Spark workers (Ray on Spark), on loopback only when Spark runs on loopback, with no dashboard.

``ray.util.spark.setup_ray_cluster`` starts a Ray head node next to the Spark driver and one Ray worker node in a
long-running task of each Spark executor. :func:`ray_cluster` wraps it for the course::

    with LocalCluster(workers=2) as cluster, ray_cluster(cluster.spark) as ray_on_spark:
        print(ray_on_spark.nodes())          # the head and 2 worker nodes, all on 127.0.0.1
        result = train_with_ray(...)         # Ray Train on the Ray worker nodes (helpers.worker)

It sizes the Ray cluster from the Spark cluster (one worker node per ``cpus_per_worker`` cores of each executor),
refuses what cannot fit in one line, and fixes what Ray 2.44 gets wrong here:

* **The ``ray`` command.** Every Ray node is started with ``shutil.which("ray")``: this interpreter's ``bin/`` goes
  first on the nodes' PATH (else "Start Ray head node failed!").
* **Loopback.** Ray turns ``127.0.0.1`` into the machine's network address (``resolve_ip_for_localhost``,
  ray-project/ray#59110), so its nodes register under that address, and its servers bind to every interface. When
  Spark's driver is on loopback (``LocalCluster``, ``get_spark``), every Ray node is started with a ``RAY_START_HOOK``
  that keeps ``127.0.0.1`` (Ray then binds each of its servers to loopback only), and so is this process's Ray
  driver. On a real multi-machine cluster nothing of this applies, and the nodes use their network addresses.
* **No dashboard, no job API.** Ray on Spark starts the dashboard on ``0.0.0.0``, and Ray's dashboard and job API run
  code for anyone who reaches them (ShadowRay, CVE-2023-48022): it is not started at all. Every node's dashboard
  agent also serves a job API (its job agent) over HTTP: the agents start minimal, without that server.
* **Quiet.** This process's Ray driver does not print what the Ray workers write (``log_to_driver=False``): their
  logs (Ray Train's, Lightning's) stay in the cluster's temporary folder while it runs. A failed job still says
  which rank failed and why (the course's launchers read it from the job folder, :mod:`helpers.jobs`). Of the head
  node's ``ray start`` only what is not its INFO or SUCC chatter is printed (its banner, "Next steps", "This command
  will now block forever" are not; its errors are, and Ray quotes its last lines if it fails to start); Ray on
  Spark's advice for production clusters (4 CPUs and 10 GB per worker node, 80 % of a worker's memory), which the
  course's one-core workers cannot follow, is not printed.
* **Clean exit.** Leaving the block (also by an exception) shuts the Ray cluster down, waits for every Ray process
  on this machine to exit (killing what is left) and removes Ray's temporary folder. The Spark executors' task slots
  are free again.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from ray.util.spark.start_hook_base import RayOnSparkStartHook

from helpers import CourseInputError
from helpers.logs import dropped_records, logger_levels
from helpers.processes import process_tree, stop_processes
from helpers.shared_storage import check_shared_folder
from helpers.spark import active_session, executor_count, task_slots
from helpers.validation import whole_number
from helpers.workdir import work_dir

__all__ = ["Listener", "RayOnSpark", "RayStartError", "listening_sockets", "ray_cluster"]

LOOPBACK = "127.0.0.1"
NODE_LAUNCHER = "ray.util.spark.start_ray_node"  # the module Ray on Spark runs for every node (head and workers)
STOP_TIMEOUT_S = 20.0  # a node's launcher waits about 1.5 s for its processes, then removes its temporary files
HEAD_START_BOUND_S = 90.0  # how long the head node may take to open its port (3-5 s idle, over 20 s on a busy machine)
_SPARK_HOOK_ENV = "RAY_ON_SPARK_START_HOOK"  # Ray on Spark's hook class (read on the driver while it starts)
_NODE_HOOK_ENV = "RAY_START_HOOK"  # run by every `ray start` with its parameters, before it starts anything
_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's one-machine addressing (loopback everywhere)
_JOB_SERVER_LOGGER = "ray.autoscaler._private.spark.spark_job_server"  # Ray on Spark's job server (level WARN)
_LOOPBACK_ENV = "COURSE_RAY_LOOPBACK"  # "1": every node on 127.0.0.1 (read by _course_node)
_SPARK_LOGGER = "ray.util.spark"  # Ray on Spark's driver side (cluster_init)
_WORKER_LOGGER = "ray._private.worker"  # ray.init's
_CONNECTING = ("Connecting to existing Ray cluster", "Connected to Ray cluster")  # worker.py:1660, 1839, at INFO
# the starts of Ray on Spark's sizing advice (cluster_init.py:1033, 1094, 1108): for production clusters
_SIZING_ADVICE = ("In each spark worker node, we recommend", "The provided CPU resources for each ray worker",
                  "The provided memory resources for each ray worker")  # fmt: skip
# `ray start`'s own progress lines ("<date> <time>\tINFO scripts.py:898 -- Ray runtime started."); not its errors
_RAY_START_CHATTER = re.compile(r"^\S+ \S+\t(INFO|SUCC) ")
# Ray's Unix sockets lie about 85 characters below its temporary root and their paths are capped at 107 bytes.
_MAX_TEMP_ROOT_CHARS = 20


class RayStartError(RuntimeError):
    """Ray on Spark did not start every Ray worker node it was asked for."""


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: the process holding it, and the address and port it accepts connections on."""

    pid: int
    process: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect (``127.0.0.0/8``, also as ``::ffff:127.0.0.1``, or ``::1``)."""
        address = ipaddress.ip_address(self.address.split("%")[0])
        return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def listening_sockets(processes: list[psutil.Process]) -> list[Listener]:
    """The TCP sockets that ``processes`` listen on.

    Args:
        processes: the processes to look at (those that exited meanwhile are skipped).

    Returns:
        One :class:`Listener` per listening socket.
    """
    found = []
    for process in processes:
        try:
            name = process.name()
            sockets = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        listening = [s for s in sockets if s.status == psutil.CONN_LISTEN]
        found += [Listener(process.pid, name, s.laddr.ip, s.laddr.port) for s in listening]
    return found


@dataclass
class RayOnSpark:
    """A running Ray cluster on Spark (what :func:`ray_cluster` yields).

    Attributes:
        address: the head node's address (``HOST:PORT``), which ``ray.init`` and Ray Train connect to.
        workers: the number of Ray worker nodes.
        cpus_per_worker: the CPUs each worker node offers Ray.
        temp_root: the folder under which every node keeps its sockets, logs and spilled objects.
    """

    address: str
    workers: int
    cpus_per_worker: int
    temp_root: Path

    def nodes(self) -> list[dict[str, Any]]:
        """The live Ray nodes as ``ray.nodes()`` reports them (the head and the workers), with ``"head"`` added."""
        import ray

        alive = [node for node in ray.nodes() if node["Alive"]]
        return [{**node, "head": "node:__internal_head__" in node["Resources"]} for node in alive]

    def launchers(self) -> list[psutil.Process]:
        """The processes on this machine that started this cluster's nodes (``start_ray_node``, one per node)."""
        found = []
        for process in psutil.process_iter(["cmdline"]):
            command = process.info["cmdline"] or []
            if NODE_LAUNCHER in command and any(str(self.temp_root) in arg for arg in command):
                found.append(process)
        return found

    def processes(self) -> list[psutil.Process]:
        """This cluster's Ray processes on this machine: every node's launcher and all the processes under it."""
        found = {p.pid: p for launcher in self.launchers() for p in process_tree(launcher.pid)}
        return list(found.values())

    def listeners(self) -> list[Listener]:
        """The sockets this cluster's processes on this machine listen on, and this process's (the Ray driver and
        Ray on Spark's job server): see :func:`listening_sockets`."""
        return listening_sockets([psutil.Process(), *self.processes()])


def _on_loopback(spark) -> bool:
    """Whether Spark's driver, where Ray on Spark puts the head node, has a loopback address."""
    return socket.gethostbyname(spark.conf.get("spark.driver.host")) == LOOPBACK


def _keep_address(address: str) -> str:
    """Replaces Ray's ``resolve_ip_for_localhost``: an address stays what it is (``127.0.0.1`` included)."""
    return address


def _no_dashboard_dependencies() -> bool:
    """Replaces Ray's ``check_dashboard_dependencies_installed`` in a node's ``ray start``: its agent starts minimal."""
    return False


def _course_node(ray_params, head: bool) -> None:
    """Run by every ``ray start`` of the course's Ray on Spark (``RAY_START_HOOK``), before it starts anything.

    The node's dashboard agent starts minimal, without its HTTP server: that server holds Ray's job agent
    (``POST /api/job_agent/jobs/`` runs any command it is sent, like the dashboard's job API). On a loopback cluster
    the node also takes ``127.0.0.1``, joins the head at ``127.0.0.1`` and its processes use Ray's one-machine
    addressing, so every server binds to loopback.
    """
    from ray._private import services, utils

    utils.check_dashboard_dependencies_installed = _no_dashboard_dependencies
    if os.environ.get(_LOOPBACK_ENV) == "1":
        ray_params.update(node_ip_address=LOOPBACK, node_name=LOOPBACK)
        services.resolve_ip_for_localhost = _keep_address
        os.environ[_CLUSTERS_ENV] = "0"


class _CourseStartHook(RayOnSparkStartHook):
    """Ray on Spark's start hook (``RAY_ON_SPARK_START_HOOK``): the environment of every Ray node it starts."""

    def __init__(self, is_global: bool = False):  # Ray makes it without arguments
        super().__init__(is_global)

    def custom_environment_variables(self) -> dict[str, str]:
        """This interpreter's ``bin/`` first on PATH, no usage reports, and :func:`_course_node` in ``ray start``."""
        from pyspark.sql import SparkSession

        return {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "RAY_USAGE_STATS_ENABLED": "0",
            _NODE_HOOK_ENV: f"{__name__}.{_course_node.__name__}",
            _LOOPBACK_ENV: "1" if _on_loopback(SparkSession.getActiveSession()) else "0",
        }


def _session(spark):
    """``spark`` or the process's session, made this thread's active one (Ray on Spark starts on that one)."""
    chosen = active_session(spark)
    if chosen is None:
        raise CourseInputError("ray_cluster() needs a SparkSession: start the cluster (LocalCluster) first.")
    return chosen


def _worker_count(spark, workers: int | None, cpus_per_worker: int) -> int:
    """How many Ray worker nodes of ``cpus_per_worker`` CPUs the Spark executors hold (``workers`` checked)."""
    executors = executor_count(spark)
    if executors < 1:
        raise CourseInputError(
            "ray_cluster() starts Ray's worker nodes in Spark executors, and this session has none (local mode): "
            "start a LocalCluster (lesson 4) or connect to a Spark cluster first."
        )
    conf = spark.sparkContext.getConf()
    derived = task_slots(spark) * int(conf.get("spark.task.cpus", "1")) // executors
    cores = int(conf.get("spark.executor.cores", str(max(1, derived))))
    fit = executors * (cores // cpus_per_worker)
    if workers is None and fit > 0:
        return fit
    if workers is None or workers > fit:
        change = f"use workers={fit} or fewer" if fit else f"use cpus_per_worker={cores} or fewer"
        raise CourseInputError(
            f"ray_cluster(workers={workers}, cpus_per_worker={cpus_per_worker}): the Spark cluster's {executors} "
            f"executors of {cores} cores hold {fit} Ray worker nodes of that size: {change}, or add Spark workers."
        )
    return workers


def _temp_root() -> Path:
    """A new folder for Ray's files with a short path: in the temporary folder if its path is short, else /tmp."""
    base = tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix="ray-", dir=base if len(base) <= _MAX_TEMP_ROOT_CHARS else "/tmp"))


@contextlib.contextmanager
def _driver_setup(loopback: bool) -> Iterator[None]:
    """While the cluster runs: Ray on Spark uses :class:`_CourseStartHook` (not on Databricks, which has its own and
    ``ray`` on the PATH); on loopback this process's Ray driver keeps ``127.0.0.1`` (see :func:`_course_node`).
    The autoscaler's events ("Adding 2 node(s)", "Resized to 1 CPUs") are not printed: they would land, late, in
    whatever notebook cell runs then (Ray's own switch is ``RAY_SCHEDULER_EVENTS=0``, read once at import)."""
    from ray._private import ray_constants, services
    from ray.util.spark.utils import is_in_databricks_runtime

    resolve, events = services.resolve_ip_for_localhost, ray_constants.AUTOSCALER_EVENTS
    ray_constants.AUTOSCALER_EVENTS = False
    previous = os.environ.get(_SPARK_HOOK_ENV)
    if not is_in_databricks_runtime():
        os.environ[_SPARK_HOOK_ENV] = f"{__name__}.{_CourseStartHook.__name__}"
    if loopback:
        services.resolve_ip_for_localhost = _keep_address
    try:
        yield
    finally:
        services.resolve_ip_for_localhost, ray_constants.AUTOSCALER_EVENTS = resolve, events
        if previous is None:
            os.environ.pop(_SPARK_HOOK_ENV, None)
        else:
            os.environ[_SPARK_HOOK_ENV] = previous


def _start_head(cmd: list[str], synchronous: bool, extra_env: dict[str, str]):
    """Ray on Spark's ``_start_ray_head_node`` (in the background, as Ray on Spark always asks), but for what it
    prints: the lines of ``ray start``'s output go to the tail that Ray quotes if the head fails to start, and to
    this process's stdout unless they are its INFO or SUCC chatter (:data:`_RAY_START_CHATTER`); Ray's prints every
    line and offers no other place for them."""
    assert not synchronous, "Ray on Spark starts its head node in the background"
    process = subprocess.Popen(
        cmd, env={**os.environ, **extra_env}, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        process_group=0,  # as Ray's: a kernel's interrupt (SIGINT to its group) must not stop the head node
    )  # fmt: skip
    tail: collections.deque[str] = collections.deque(maxlen=100)

    def relay() -> None:
        for line in process.stdout:
            tail.append(line)
            if not _RAY_START_CHATTER.match(line):
                sys.stdout.write(line)

    threading.Thread(target=relay, name="ray-head-output", daemon=True).start()
    return process, tail


@contextlib.contextmanager
def _quiet_start() -> Iterator[None]:
    """While Ray on Spark starts: the head node's output through :func:`_start_head`, no sizing advice and no
    notice of the connection."""
    from ray.util.spark import cluster_init

    start_head = cluster_init._start_ray_head_node
    cluster_init._start_ray_head_node = _start_head
    try:
        # Ray on Spark's own ray.init (in wait_until_ready) sets the "ray" logger back to INFO and announces it
        with dropped_records(_SPARK_LOGGER, *_SIZING_ADVICE), dropped_records(_WORKER_LOGGER, *_CONNECTING):
            yield
    finally:
        cluster_init._start_ray_head_node = start_head


def _port_opens(host: str, port: int) -> bool:
    """Replaces Ray on Spark's one look at the head node's port (``cluster_init.is_port_in_use``): whether it opens
    within :data:`HEAD_START_BOUND_S`, looked at every tenth of a second."""
    from ray.util.spark import utils

    deadline = time.monotonic() + HEAD_START_BOUND_S
    while not utils.is_port_in_use(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def _head_start_awaited() -> Iterator[None]:
    """While Ray on Spark starts: it waits for its head node by polling its port (:func:`_port_opens`). Its own way
    is a fixed 20 s sleep (``_RAY_HEAD_STARTUP_TIMEOUT``) and one look at the port, which fails a head that a busy
    machine starts in more than 20 s ("Start Ray head node failed!") and keeps an idle one waiting for nothing."""
    from ray.util.spark import cluster_init

    saved = cluster_init._RAY_HEAD_STARTUP_TIMEOUT, cluster_init.is_port_in_use
    cluster_init._RAY_HEAD_STARTUP_TIMEOUT, cluster_init.is_port_in_use = 0, _port_opens
    try:
        yield
    finally:
        cluster_init._RAY_HEAD_STARTUP_TIMEOUT, cluster_init.is_port_in_use = saved


def _not_a_stopped_node(record: logging.LogRecord) -> bool:
    """False for the job server's notice that a worker node's Spark job ended, where the course stopped that
    cluster: its threads say so after the shutdown returns, as a warning that asks to debug it."""
    message = record.getMessage()
    return not (message.startswith(tuple(_STOPPED)) and "hosting Ray worker node exit" in message)


_STOPPED: set[str] = set()  # the job server's message starts for the clusters the course shut down
logging.getLogger(_JOB_SERVER_LOGGER).addFilter(_not_a_stopped_node)


def _shutdown(cluster: RayOnSpark) -> None:
    """Shut Ray on Spark down; once every node's launcher has exited, kill what is left of its processes (a worker
    node's agents outlive their raylet by 15 s or more); remove Ray's folder."""
    from ray.util.spark import cluster_init, shutdown_ray_cluster

    launchers, processes = cluster.launchers(), cluster.processes()
    try:
        active = cluster_init._active_ray_cluster
        if active is not None:
            # the job server names each worker node's Spark job after the head's port and the cluster's id
            port = cluster.address.rsplit(":", 1)[-1]
            _STOPPED.add(f"Spark job ray-cluster-{port}-{active.cluster_unique_id}-")
            shutdown_ray_cluster()
    finally:
        psutil.wait_procs(launchers, timeout=STOP_TIMEOUT_S)
        left = stop_processes(processes, timeout=5.0, signals=(signal.SIGKILL,))
        shutil.rmtree(cluster.temp_root, ignore_errors=True)
    if left:
        warnings.warn(f"Ray processes still running after SIGKILL: {[p.pid for p in left]}", stacklevel=3)


@contextlib.contextmanager
def ray_cluster(
    spark=None, workers: int | None = None, cpus_per_worker: int = 1, gpus_per_worker: int = 0
) -> Iterator[RayOnSpark]:
    """A Ray cluster on the Spark workers for the duration of the block, with this process connected to it.

    Args:
        spark: the SparkSession, a cluster's (default: this thread's active one).
        workers: how many Ray worker nodes (default: as many as the executors hold).
        cpus_per_worker: the CPUs of each worker node (one Spark task of that many cores holds it).
        gpus_per_worker: the GPUs of each worker node (the executors need that many).

    Yields:
        The :class:`RayOnSpark` cluster (``ray.init`` already called).

    Raises:
        CourseInputError: no cluster session, the worker nodes do not fit in its executors, a bad count, or Ray
            already running in this process.
        RayStartError: fewer worker nodes started than asked for.
    """
    import ray
    from ray.util.spark import cluster_init, setup_ray_cluster

    cpus_per_worker = whole_number("cpus_per_worker", cpus_per_worker)
    gpus_per_worker = whole_number("gpus_per_worker", gpus_per_worker, minimum=0)
    if workers is not None:
        whole_number("workers", workers)
    spark = _session(spark)
    workers = _worker_count(spark, workers, cpus_per_worker)
    if ray.is_initialized() or cluster_init._active_ray_cluster is not None:
        raise CourseInputError("Ray is already running in this process: leave its block (or ray.shutdown()) first.")
    check_shared_folder(spark, work_dir())  # Ray Train's rank 0 leaves its result there; Ray then holds the slots
    cluster = RayOnSpark("", workers, cpus_per_worker, _temp_root())
    # no info lines of its own ("Ray worker nodes are starting"); those of its ray.init: see _quiet_start
    with logger_levels({"ray": logging.WARNING, _SPARK_LOGGER: logging.WARNING}):
        try:
            with _driver_setup(_on_loopback(spark)), _quiet_start(), _head_start_awaited():
                cluster.address, _ = setup_ray_cluster(
                    max_worker_nodes=workers,
                    num_cpus_worker_node=cpus_per_worker,
                    num_gpus_worker_node=gpus_per_worker,
                    num_cpus_head_node=0,
                    head_node_options={"include_dashboard": False, "disable_usage_stats": None},
                    ray_temp_root_dir=str(cluster.temp_root),
                )
                ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
                started = sum(not node["head"] for node in cluster.nodes())
                if started < workers:
                    raise RayStartError(f"Ray on Spark started {started} of {workers} worker nodes; see the log above.")
                yield cluster
        finally:
            _shutdown(cluster)
