"""A Spark cluster of separate hosts on one Linux machine, built from namespaces: for tests, benchmarks and rehearsal.

An instructor's cluster has a driver, a master, workers and an MLflow server on different machines, each with its own
address, hostname, ``/tmp`` and processes, and one shared file system. :class:`MultiHostCluster` makes each of them a
host of its own on this machine (needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)::

    with MultiHostCluster(worker_cores=(2, 1)) as cluster:
        cluster.run("driver", [python, "-m", "helpers.course", "run", "--params", "params/multihost.yaml"])

* **Network.** One network namespace per host, joined by veth pairs to a bridge that lives in a namespace of its
  own: every host has one address on a private ``/24`` with no route anywhere else, and ``/etc/hosts`` entries
  (``ip netns exec`` binds ``/etc/netns/<ns>/hosts`` over ``/etc/hosts``) for every host's name. Every host's
  ephemeral ports are :data:`EPHEMERAL_PORTS`, as an instructor pins them for a firewall (:mod:`helpers.ports`);
  :meth:`MultiHostCluster.firewall` puts one between the hosts.
* **A host.** A process that is PID 1 of its own PID, mount and UTS namespaces inside that network namespace: its own
  hostname, its own ``/proc`` (only its processes), its own ``/tmp`` (a tmpfs), and the shared folder bind-mounted at
  :data:`SHARED_MOUNT` (the same path on every host, as an NFS mount would be). Every other path, the checkout and
  its ``.venv`` included, is this machine's, as if installed identically on every node.
* **Services.** A Spark standalone master (``spark-master``, port 7077, web UI 8080), one worker per entry of
  ``worker_cores`` (``worker-1``, ``worker-2``, ...), an MLflow tracking server (``mlflow``, port 5000, its store on
  its own ``/tmp``) and an empty ``driver`` host for the notebook.
* **Clean-up.** :meth:`MultiHostCluster.stop` (also on an exception in the block, at interpreter exit and on
  SIGTERM) kills every host's PID 1, which makes the kernel kill every process of that host, then deletes the
  namespaces (and with them the veth pairs and the bridge) and the ``/etc/netns`` entries.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers import CourseInputError
from helpers.cluster import spark_class
from helpers.processes import clean_up_at_exit
from helpers.spark import QUICK_JVM_OPTIONS, find_java_home
from helpers.validation import whole_number

__all__ = [
    "EPHEMERAL_PORTS",
    "Firewall",
    "Host",
    "MultiHostCluster",
    "NamespaceUnavailable",
    "leftovers",
    "namespaces_available",
]

SHARED_MOUNT = "/mnt/shared"  # the shared folder's path on every host (params/multihost.yaml names it)
MASTER_PORT, MASTER_UI_PORT, MLFLOW_PORT = 7077, 8080, 5000
EPHEMERAL_PORTS = (40000, 44999)  # every host's net.ipv4.ip_local_port_range: where "any free port" comes from
PREFIX = "sdl"  # every namespace this module makes starts with it, followed by a cluster id
NETNS_ETC = Path("/etc/netns")
REPO = Path(__file__).resolve().parent.parent

# PID 1 of a host: makes its hostname and mounts, then reaps orphans until it is killed (SIGKILL from outside).
_INIT = r"""
import os, socket, subprocess, sys, time
name, shared, mount = sys.argv[1:4]
socket.sethostname(name)
def sh(*args):
    subprocess.run(args, check=True)
sh("mount", "-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs", "/mnt")
os.makedirs(mount)
sh("mount", "--bind", shared, mount)
sh("mount", "-t", "tmpfs", "-o", "size=4g,mode=1777", "tmpfs", "/tmp")
print("ready", flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""


class NamespaceUnavailable(RuntimeError):
    """This machine cannot make hosts from namespaces (not root, no ``ip``/``nsenter``, or the kernel refuses)."""


def namespaces_available() -> str | None:
    """Why :class:`MultiHostCluster` cannot run here, in one line, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "multi-host cluster: needs Linux network namespaces"
    if os.geteuid() != 0:
        return "multi-host cluster: needs root (ip netns, mount namespaces); CI runs as root"
    missing = [tool for tool in ("ip", "nsenter", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"multi-host cluster: {', '.join(missing)} not installed (Debian: iproute2, util-linux)"
    for inside in (REPO, Path(sys.executable)):
        if str(inside).startswith(("/tmp/", "/mnt/")):
            return f"multi-host cluster: {inside} is under /tmp or /mnt, which every host replaces with its own"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"multi-host cluster: ip netns add failed ({made.stderr.strip()})"
    return None


def leftovers(cluster_id: str | None = None) -> list[str]:
    """Namespaces, ``/etc/netns`` entries and host processes of this module's clusters still on the machine.

    Args:
        cluster_id: one cluster's id (default: every cluster's).

    Returns:
        One line per thing left, empty when nothing is.
    """
    prefix = f"{PREFIX}{cluster_id or ''}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    found = [f"namespace {line.split()[0]}" for line in listed if line.startswith(prefix)]
    if NETNS_ETC.is_dir():
        found += [f"{NETNS_ETC / entry}" for entry in os.listdir(NETNS_ETC) if entry.startswith(prefix)]
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--cluster-host" in command and any(arg.startswith(prefix.encode()) for arg in command):
            found.append(f"process {pid}")
    return found


@dataclass
class Host:
    """One host of the cluster: its name (also its hostname), address, network namespace and PID 1."""

    name: str
    address: str
    netns: str
    init: subprocess.Popen | None = None

    pid: int = 0  # PID 1 of the host, as this machine numbers it (what ``nsenter --target`` takes)


def _ip(*args: str) -> None:
    """Run ``ip ARGS``; raise NamespaceUnavailable with its message if it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NamespaceUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Firewall:
    """The firewall of :meth:`MultiHostCluster.firewall` while it stands."""

    TABLE = "course_firewall"

    def __init__(self, hosts: Sequence[Host]):
        self.hosts = hosts

    def dropped(self) -> dict[str, list[int]]:
        """The ports each host dropped connections to so far, for hosts that dropped any."""
        found = {}
        for host in self.hosts:
            listing = subprocess.run(
                ["ip", "netns", "exec", host.netns, "nft", "-j", "list", "set", "inet", self.TABLE, "dropped"],
                capture_output=True, text=True,
            )  # fmt: skip
            sets = [item["set"] for item in json.loads(listing.stdout or "{}").get("nftables", []) if "set" in item]
            elements = [element for item in sets for element in item.get("elem", [])]
            ports = sorted(e if isinstance(e, int) else e.get("elem", {}).get("val") for e in elements)
            if ports:
                found[host.name] = ports
        return found


class MultiHostCluster:
    """A Spark standalone master, workers, an MLflow server and a driver, each a host of its own (see the module).

    Args:
        worker_cores: the cores (task slots) of each worker, one entry per worker: ``(2, 1)`` makes ``worker-1``
            with 2 and ``worker-2`` with 1.
        worker_memory: each worker's memory for executors.
        subnet: the private network, a ``/24`` (every host's address lies in it).
        shared: the folder every host sees at :data:`SHARED_MOUNT` (default: a new folder under this machine's
            temporary folder, removed on stop).
        start_timeout: seconds for the master, the workers and MLflow to come up.
    """

    def __init__(
        self,
        worker_cores: Sequence[int] = (2, 1),
        worker_memory: str = "1536m",
        subnet: str = "10.213.7.0/24",
        shared: str | os.PathLike | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        if not worker_cores:
            raise CourseInputError("worker_cores=(): give each worker's cores, e.g. (2, 1).")
        self.worker_cores = [whole_number("worker_cores", cores) for cores in worker_cores]
        self.worker_memory = worker_memory
        self.network = network = ipaddress.ip_network(subnet)
        self.id = uuid.uuid4().hex[:6]
        names = ["spark-master", *[f"worker-{i + 1}" for i in range(len(self.worker_cores))], "driver", "mlflow"]
        addresses = list(network.hosts())[1 : len(names) + 1]
        self.prefix_len = network.prefixlen
        self.hosts = {name: Host(name, str(addr), f"{PREFIX}{self.id}-{name}") for name, addr in zip(names, addresses)}
        self.switch = f"{PREFIX}{self.id}-switch"
        self._own_shared = shared is None
        self.shared = Path(shared) if shared is not None else Path(tempfile.mkdtemp(prefix="course-shared-"))
        self.start_timeout = start_timeout
        self.services: dict[str, subprocess.Popen] = {}
        self.log_dir = self.shared / "cluster-logs"

    # -- what callers use ---------------------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """The Spark master, as every host names it."""
        return f"spark://spark-master:{MASTER_PORT}"

    @property
    def mlflow_uri(self) -> str:
        """The MLflow tracking server, as every host names it."""
        return f"http://mlflow:{MLFLOW_PORT}"

    @property
    def workers(self) -> list[Host]:
        """The worker hosts, in order."""
        return [host for name, host in self.hosts.items() if name.startswith("worker-")]

    def host_env(self, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """The environment of a process on a host: this one's, with the temporary folders on the host's own ``/tmp``
        (a path under this machine's ``/tmp`` does not exist there); a None value in ``extra`` removes a name."""
        local = ("SPARK_LOCAL_DIRS", "SPARK_LOCAL_IP", "TMPDIR", "JAVA_TOOL_OPTIONS")
        env = {k: v for k, v in os.environ.items() if k not in local}
        env["TMPDIR"] = "/tmp"
        env["PYTHONPATH"] = str(REPO)
        for name, value in (extra or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def command(self, host: str, argv: Sequence[str], cwd: str | os.PathLike = REPO) -> list[str]:
        """``argv`` as a command that runs inside ``host`` (its network, mounts, hostname and processes), in ``cwd``
        (entering a mount namespace starts at its root)."""
        target = self.hosts[host]
        enter = ["nsenter", "--target", str(target.pid), "--net", "--mount", "--uts", "--pid", f"--wd={cwd}"]
        return [*enter, "--", *argv]

    def run(
        self, host: str, argv: Sequence[str], env: Mapping[str, str | None] | None = None, **popen: object
    ) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (in this checkout, with :meth:`host_env`); returns its ``Popen``."""
        return subprocess.Popen(self.command(host, argv), env=self.host_env(env), **popen)  # type: ignore[call-overload]

    def check_output(self, host: str, argv: Sequence[str], timeout: float = 60.0) -> str:
        """Run ``argv`` on ``host`` to its end; its standard output (raises ``CalledProcessError`` on failure)."""
        done = subprocess.run(
            self.command(host, argv), env=self.host_env(), capture_output=True, text=True,
            timeout=timeout, check=True,
        )  # fmt: skip
        return done.stdout

    @contextlib.contextmanager
    def without_shared_folder(self, host: str) -> Iterator[None]:
        """While the block runs, ``host`` has no shared mount: an empty folder of its own at :data:`SHARED_MOUNT`
        (a tmpfs over it), as on a worker where the NFS mount failed; writes there stay on the host."""
        enter = self._inside(host)
        subprocess.run([*enter, "mount", "-t", "tmpfs", "tmpfs", SHARED_MOUNT], check=True)
        try:
            yield
        finally:
            subprocess.run([*enter, "umount", SHARED_MOUNT], check=True)

    @contextlib.contextmanager
    def name_resolving_to_loopback(self, host: str) -> Iterator[None]:
        """While the block runs, ``host``'s own name resolves to 127.0.1.1 there, as on a stock Debian or Ubuntu
        host (``/etc/hosts`` is rewritten in place: the host sees it through a bind mount)."""
        hosts_file = NETNS_ETC / self.hosts[host].netns / "hosts"
        original = hosts_file.read_text()
        with open(hosts_file, "w") as rewritten:
            rewritten.write(original.replace(f"{self.hosts[host].address} {host}\n", f"127.0.1.1 {host}\n"))
        try:
            yield
        finally:
            with open(hosts_file, "w") as restored:
                restored.write(original)

    @contextlib.contextmanager
    def package_version(self, host: str, distribution: str, version: str) -> Iterator[None]:
        """While the block runs, ``host`` reports ``version`` for the installed ``distribution`` (its ``METADATA``
        replaced there by a bind mount), as a worker whose environment was installed apart from the driver's."""
        from importlib import metadata

        real = next(f for f in metadata.distribution(distribution).files or [] if f.name == "METADATA").locate()
        fake = self.shared / f".fault-{host}-{distribution}-METADATA"
        fake.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", Path(real).read_text()))
        enter = self._inside(host)
        subprocess.run([*enter, "mount", "--bind", f"{SHARED_MOUNT}/{fake.name}", str(real)], check=True)
        try:
            yield
        finally:
            subprocess.run([*enter, "umount", str(real)], check=True)
            fake.unlink()

    @contextlib.contextmanager
    def firewall(self, allowed: Sequence[tuple[int, int]], hosts: Sequence[str] | None = None) -> Iterator[Firewall]:
        """While the block runs, each of ``hosts`` (every host by default) drops each new connection from another of
        them, except TCP to the ``allowed`` port ranges (inclusive pairs): nftables in the host's network namespace.
        Yields a :class:`Firewall`, which tells which ports it dropped connections to."""
        chosen = [self.hosts[name] for name in (hosts or self.hosts)]
        if len(chosen) < 2:
            raise CourseInputError("firewall() stands between hosts: name 2 hosts or more, e.g. hosts=None for all.")
        ports = ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in allowed)
        firewall = Firewall(chosen)
        try:
            for host in chosen:
                others = "ip saddr { " + ", ".join(other.address for other in chosen if other is not host) + " }"
                rules = [f"{others} tcp dport {{ {ports} }} accept"] if ports else []
                rules += [f"{others} ct state new meta l4proto tcp add @dropped {{ tcp dport }} drop",
                          f"{others} ct state new drop"]  # fmt: skip
                text = (
                    f"table inet {Firewall.TABLE} {{\n set dropped {{ type inet_service; flags dynamic; }}\n"
                    " chain input {\n  type filter hook input priority 0; policy accept;\n"
                    + "".join(f"  {rule}\n" for rule in rules) + " }\n}\n"
                )  # fmt: skip
                self._netns_run(host, ["nft", "-f", "-"], text)
            yield firewall
        finally:
            for host in chosen:
                subprocess.run(["ip", "netns", "exec", host.netns, "nft", "delete", "table", "inet", Firewall.TABLE],
                               capture_output=True)  # fmt: skip

    @contextlib.contextmanager
    def link_down(self, host: str) -> Iterator[None]:
        """While the block runs, worker ``host``'s network link is down: no reset, no process exit, packets lost. Its
        shared folder goes with it (the NFS server is on the other side of the link): writes there stay on the host.
        Afterwards the host is rebooted (:meth:`reboot`), as an instructor would do with a host that came back."""
        target = self.hosts[host]
        try:
            with self.without_shared_folder(host):
                self._netns_run(target, ["ip", "link", "set", "eth0", "down"])
                try:
                    yield
                finally:
                    self._netns_run(target, ["ip", "link", "set", "eth0", "up"])
        finally:
            self.reboot(host)

    @contextlib.contextmanager
    def frozen(self, host: str) -> Iterator[None]:
        """While the block runs, every process of worker ``host`` is stopped (SIGSTOP), as on a host that hangs: its
        kernel still answers, nothing else does. Afterwards the host is rebooted (:meth:`reboot`)."""
        enter = self._inside(host)
        subprocess.run([*enter, "kill", "-STOP", "-1"], check=False)  # all but the host's PID 1 and kill itself
        try:
            yield
        finally:
            self.reboot(host)

    def reboot(self, host: str) -> None:
        """Kill every process of worker ``host`` and start its Spark worker again; returns once the master lists
        a new worker ALIVE on that host (it lists the old one too until its ``spark.worker.timeout``, 60 s)."""
        address = self.hosts[host].address
        replaced = [worker_id for worker_id, _ in self._master_workers() if worker_id.split("-")[2] == address]
        enter = self._inside(host)
        subprocess.run([*enter, "kill", "-KILL", "-1"], check=False)
        service = self.services.pop(host)
        service.kill()  # nsenter outside the host: it stops itself when its child is stopped, and stays stopped
        service.wait(timeout=30)
        self._start_worker(self.hosts[host])
        self._wait_for_services(replaced)

    @contextlib.contextmanager
    def mlflow_down(self) -> Iterator[None]:
        """While the block runs, the MLflow server is not running (every process of its host killed); it is started
        again afterwards, on the same store."""
        enter = self._inside("mlflow")
        subprocess.run([*enter, "kill", "-KILL", "-1"], check=False)  # all but the host's PID 1 and kill itself
        self.services.pop("mlflow").wait(timeout=30)
        try:
            yield
        finally:
            self._start_mlflow()
            self._wait_for_services()

    def _inside(self, host: str) -> list[str]:
        """The start of a command that runs in ``host``'s mounts and among its processes (not its network)."""
        return ["nsenter", "--target", str(self.hosts[host].pid), "--mount", "--pid", "--"]

    @staticmethod
    def _netns_run(host: Host, argv: list[str], stdin: str = "") -> None:
        """Run ``argv`` in ``host``'s network namespace only (a firewall's or a link's change); raise with its
        message if it fails."""
        done = subprocess.run(["ip", "netns", "exec", host.netns, *argv], input=stdin, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {host.name}: {done.stderr.strip()}")

    def processes(self, host: str) -> list[str]:
        """The command lines of every process on ``host`` (its own ``/proc``)."""
        out = self.check_output(
            host, ["ps", "-eo", "args", "--no-headers", "-ww"]
        )  # -ww: whole lines, whatever COLUMNS says
        return [line for line in out.splitlines() if line.strip()]

    # -- life cycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> MultiHostCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> MultiHostCluster:
        """Make the network and the hosts, start the master, the workers and MLflow, wait until they serve.

        Returns:
            This cluster.

        Raises:
            NamespaceUnavailable: namespaces cannot be made here.
            RuntimeError: a service did not come up within ``start_timeout`` (the message names its log).
        """
        reason = namespaces_available()
        if reason:
            raise NamespaceUnavailable(reason)
        _LIVE[self.id] = self
        clean_up_at_exit(_stop_all)
        try:
            self._make_network()
            for host in self.hosts.values():
                self._make_host(host)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._start_services()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every host (all its processes die with its PID 1), delete the namespaces and the hosts files."""
        for host in self.hosts.values():
            if host.init is not None and host.init.poll() is None:
                if host.pid:
                    _kill(host.pid)  # PID 1 of the host: the kernel kills every process of its PID namespace
                host.init.kill()
                host.init.wait(timeout=30)
        for service in self.services.values():
            if service.poll() is None:  # an nsenter parent whose child died with the host
                service.kill()
            service.wait(timeout=30)
        for netns in [host.netns for host in self.hosts.values()] + [self.switch]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
            shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
        if self._own_shared:
            shutil.rmtree(self.shared, ignore_errors=True)
        _LIVE.pop(self.id, None)

    # -- internals ----------------------------------------------------------------------------------------------

    def _make_network(self) -> None:
        """The switch namespace with its bridge, and one namespace per host joined to it by a veth pair."""
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        for index, host in enumerate(self.hosts.values()):
            _ip("netns", "add", host.netns)
            port = f"v{index}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.prefix_len}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            ephemeral = "net.ipv4.ip_local_port_range={} {}".format(*EPHEMERAL_PORTS)
            subprocess.run(["ip", "netns", "exec", host.netns, "sysctl", "-q", "-w", ephemeral], check=True)
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)

    def _make_host(self, host: Host) -> None:
        """Start the host's PID 1 in its network namespace, with its own PID, mount and UTS namespaces."""
        # Our Popen is unshare; PID 1 of the new namespaces is its child (unshare --fork). Both get a parent-death
        # signal, so that a host dies with the process that made it, even one killed outright.
        die = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        init_argv = [sys.executable, "-c", _INIT, host.name, str(self.shared), SHARED_MOUNT]
        init_argv += ["--cluster-host", host.netns]  # how leftovers() recognises it
        unshare = ["unshare", "--pid", "--mount", "--uts", "--fork", "--mount-proc", "--propagation", "private", "--"]
        command = ["ip", "netns", "exec", host.netns, *die, *unshare, *die, *init_argv]
        init = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        host.init = init
        line = init.stdout.readline() if init.stdout else ""
        children = Path(f"/proc/{init.pid}/task/{init.pid}/children")
        host.pid = int(children.read_text().split()[0]) if line.strip() == "ready" else 0
        if not host.pid:
            init.kill()
            rest = init.stdout.read() if init.stdout else ""
            raise NamespaceUnavailable(f"host {host.name} did not start: {(line + rest).strip()[-300:]}")

    def _spark_env(self, host: Host) -> dict[str, str]:
        """The environment of a Spark daemon on ``host`` (the JVM options reach the executors it starts)."""
        return {
            "JAVA_TOOL_OPTIONS": QUICK_JVM_OPTIONS,
            "JAVA_HOME": str(find_java_home()),
            "SPARK_HOME": str(spark_class().parent.parent),
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": host.address,
        }

    def _start_services(self) -> None:
        """The Spark master, the workers, MLflow; returns once all of them serve."""
        master = self.hosts["spark-master"]
        self._service(
            "spark-master",
            [str(spark_class()), "org.apache.spark.deploy.master.Master", "--host", master.address, "--port",
             str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)],
            self._spark_env(master),
        )  # fmt: skip
        for host in self.workers:
            self._start_worker(host)
        self._start_mlflow()
        self._wait_for_services()

    def _start_worker(self, host: Host) -> None:
        """The Spark worker of ``host``, with its cores and the cluster's worker memory."""
        cores = self.worker_cores[self.workers.index(host)]
        self._service(
            host.name,
            [str(spark_class()), "org.apache.spark.deploy.worker.Worker", "--host", host.address, "--cores",
             str(cores), "--memory", self.worker_memory, "--work-dir", "/tmp/spark-worker", self.master_url],
            self._spark_env(host),
        )  # fmt: skip

    def _start_mlflow(self) -> None:
        """The MLflow tracking server on its host, its store and artifacts on that host's own disk."""
        self._service(
            "mlflow",
            [sys.executable, "-m", "mlflow", "server", "--host", self.hosts["mlflow"].address, "--port",
             str(MLFLOW_PORT), "--workers", "1", "--backend-store-uri", "sqlite:////tmp/mlflow.db",
             "--artifacts-destination", "/tmp/mlflow-artifacts", "--allowed-hosts", "*"],
            {},
        )  # fmt: skip

    def _service(self, host: str, argv: list[str], env: dict[str, str]) -> None:
        """Start a long-running service on ``host``, its output in ``log_dir/<host>.log``."""
        with open(self.log_dir / f"{host}.log", "ab") as log:
            self.services[host] = self.run(host, argv, env, stdout=log, stderr=subprocess.STDOUT)

    def _wait_for_services(self, replaced: Sequence[str] = ()) -> None:
        """Poll, from the driver host, the master's JSON (one ALIVE worker per worker host, none of them one of the
        ``replaced`` worker ids) and MLflow's health endpoint."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            for name, service in self.services.items():
                if service.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {service.returncode}; see {self.log_dir / name}.log")
            try:
                workers = self._master_workers(mlflow_too=True)
                alive = [worker_id for worker_id, state in workers if state == "ALIVE" and worker_id not in replaced]
                hosts = {worker_id.split("-")[2] for worker_id in alive}
                if hosts >= {host.address for host in self.workers}:
                    return
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the multi-host cluster did not come up in {self.start_timeout:g} s; see the logs in "
                    f"{self.log_dir}"
                )
            time.sleep(1)

    def _master_workers(self, mlflow_too: bool = False) -> list[tuple[str, str]]:
        """Each worker the master lists, whatever its state, as ``(id, state)`` (the id is
        ``worker-<date>-<address>-<port>``), asked from the driver host; with ``mlflow_too``, raises unless MLflow's
        health endpoint answers as well."""
        probe = (
            "import json, urllib.request as u\n"
            f"state = json.load(u.urlopen('http://spark-master:{MASTER_UI_PORT}/json/', timeout=2))\n"
            + (f"u.urlopen('{self.mlflow_uri}/health', timeout=2)\n" if mlflow_too else "")
            + "print(json.dumps([[w['id'], w['state']] for w in state['workers']]))\n"
        )
        listed = json.loads(self.check_output("driver", [sys.executable, "-c", probe], timeout=20))
        return [(worker_id, state) for worker_id, state in listed]


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` unless it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_LIVE: dict[str, MultiHostCluster] = {}


def _stop_all() -> None:
    """Stop every cluster of this process not stopped yet (at exit, or on SIGTERM/SIGHUP)."""
    for cluster in list(_LIVE.values()):
        cluster.stop()


clean_up_at_exit(_stop_all)
