"""``python -m helpers.course preflight --params FILE``: will this cluster run the course? Checked from the driver.

The evening before a class: one short Spark job on every task slot of the cluster the parameter file names, one
tiny collective per launcher across hosts, then a table to read at a glance (item, host, result, what to do) and an
exit status (0: every row ok; 1: a row failed). Each host's row checks:

- the same Python and course packages as on the driver (``versions``), Java (``java``);
- the work folder, written on one host and read on the others (``shared folder``);
- what the host's name resolves to (``host name``): 127.0.1.1 (stock Debian/Ubuntu) is unreachable from other hosts;
- the GPUs Spark gives each task when the file asks for GPUs (``gpus``);
- the MLflow tracking server, reached and written from the host (``mlflow``);
- the data set and, for a pretrained backbone, the weights under ``TORCH_HOME`` (``data``, ``weights``);

and once for the cluster: executors registering with the driver (``executors``), then an allreduce across hosts
with TorchDistributor and Horovod on Spark (where installed), and Ray on Spark's nodes on the hosts' addresses
(``--ray``, about a minute more).
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from helpers.course.run import kernel_env, load_params

__all__ = ["Row", "add_arguments", "command", "preflight", "table"]

PACKAGES = (
    "scaling-dl-spark-helpers", "torch", "pyspark", "pyarrow", "numpy", "petastorm", "pytorch-lightning", "mlflow",
    "deltalake", "horovod", "ray", "deepspeed",
)  # fmt: skip
STALL_S = "60"  # the collectives' stall bound during the preflight: a blocked port fails in a minute, not ten
COLLECTIVE_BOUND_S = 90  # one launcher's whole check: start-up, rendezvous, collective (about 20 s when healthy)


@dataclass(frozen=True)
class Row:
    """One line of the preflight's table: ``ok`` True, False (with a ``fix``) or None (not run, ``found`` says
    why)."""

    item: str
    host: str
    ok: bool | None
    found: str
    fix: str = ""

    @property
    def result(self) -> str:
        """``ok``, ``FAIL`` or ``skip``."""
        return {True: "ok", False: "FAIL", None: "skip"}[self.ok]


def _versions() -> dict[str, str | None]:
    """Python's and each course package's version in this process (None: not installed)."""
    import platform
    from importlib import metadata

    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _java() -> str:
    """The first line of ``java -version`` of this host's Java (JAVA_HOME, else the PATH)."""
    import shutil
    import subprocess

    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "no Java"
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    lines = [line for line in (done.stderr or done.stdout).splitlines() if not line.startswith("Picked up")]
    return lines[0].strip() if lines else "no output from java -version"


def host_facts(settings: dict[str, Any]) -> dict[str, Any]:
    """What one host says of itself (runs in a Spark task, and on the driver): see the module."""
    import socket
    from pathlib import Path

    name = socket.gethostname()
    try:
        resolves = socket.gethostbyname(name)
    except OSError as exc:
        resolves = f"unresolved ({exc})"
    facts: dict[str, Any] = {"host": name, "resolves_to": resolves, "versions": _versions(), "java": _java()}
    data = settings.get("data_dir")
    facts["data"] = None if data is None else sum(1 for p in Path(data).glob("*") if p.is_dir())
    weights = Path(os.environ.get("TORCH_HOME", "~/.cache/torch")).expanduser() / "hub" / "checkpoints"
    facts["weights"] = sorted(p.name for p in weights.glob("*.pth")) if weights.is_dir() else []
    facts["mlflow"] = _mlflow_write(settings.get("tracking_uri"), settings.get("experiment_id"))
    return facts


def _mlflow_write(uri: str | None, experiment_id: str | None) -> str:
    """Create, write and delete a run on the tracking server from this host: "" if that worked, else the error."""
    if uri is None or experiment_id is None:
        return ""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        run = client.create_run(experiment_id)
        client.log_metric(run.info.run_id, "preflight", 1.0)
        client.delete_run(run.info.run_id)
    except Exception as exc:  # whatever the client raises is the finding
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return ""


def _task_facts(settings: dict[str, Any]) -> Callable:
    """The function of the barrier job: :func:`host_facts` in every task, with the GPUs Spark gave it."""

    def facts(_rows):
        from pyspark import BarrierTaskContext

        found = host_facts(settings)
        gpu = BarrierTaskContext.get().resources().get("gpu")
        found["gpus"] = list(gpu.addresses) if gpu is not None else []
        yield found

    return facts


def _java_major(version_line: str) -> str | None:
    """``17`` from ``openjdk version "17.0.15" 2025-04-15``; None without a quoted version."""
    quoted = version_line.split('"')
    return quoted[1].split(".")[0] if len(quoted) > 2 else None


def _host_rows(driver: dict[str, Any], hosts: list[dict[str, Any]], expect: dict[str, Any]) -> list[Row]:
    """The per-host rows (see the module), each host compared with the driver."""
    from helpers.network import INTERFACE_ENV, is_loopback

    rows = []
    for facts in sorted({f["host"]: f for f in hosts}.values(), key=lambda f: f["host"]):
        host, theirs = facts["host"], facts["versions"]
        differ = [f"{k} {theirs.get(k)} (driver {v})" for k, v in driver["versions"].items() if theirs.get(k) != v]
        rows.append(
            Row(
                "versions",
                host,
                not differ,
                "; ".join(differ) or "the driver's Python and packages",
                "install the course's environment on every host at the driver's path (make setup there)",
            )
        )
        java_ok = _java_major(facts["java"]) is not None and _java_major(facts["java"]) == _java_major(driver["java"])
        rows.append(Row("java", host, java_ok, facts["java"], "install the driver's Java (17) or set JAVA_HOME"))
        named = bool(os.environ.get(INTERFACE_ENV))
        loop = is_loopback(facts["resolves_to"])
        rows.append(
            Row(
                "host name",
                host,
                not loop or named,
                f"{host} resolves to {facts['resolves_to']}",
                f"map {host} to its cluster address in /etc/hosts, or name the interface ({INTERFACE_ENV})",
            )
        )
        if expect["use_gpu"]:
            rows.append(
                Row(
                    "gpus",
                    host,
                    bool(facts["gpus"]),
                    f"task GPUs {facts['gpus'] or 'none'}",
                    "advertise the GPUs to Spark (spark.worker.resource.gpu.amount and a discovery script)",
                )
            )
        if expect["tracking_uri"]:
            rows.append(
                Row(
                    "mlflow",
                    host,
                    not facts["mlflow"],
                    facts["mlflow"] or f"wrote a run to {expect['tracking_uri']}",
                    f"start the tracking server at {expect['tracking_uri']} and let every host reach it",
                )
            )
        if expect["data_dir"]:
            rows.append(
                Row(
                    "data",
                    host,
                    (facts["data"] or 0) >= 2,
                    f"{facts['data']} class folders in {expect['data_dir']}",
                    "put the data set on the shared storage at DATA_DIR (python -m helpers.data --dest ...)",
                )
            )
        if expect["pretrained"]:
            rows.append(
                Row(
                    "weights",
                    host,
                    bool(facts["weights"]),
                    ", ".join(facts["weights"]) or "none in TORCH_HOME",
                    "run lesson 2 once with internet access, or copy the .pth file into $TORCH_HOME/hub/checkpoints",
                )
            )
    return rows


def _torch_allreduce() -> list[dict[str, Any]]:
    """In every TorchDistributor process: the interface rule, one Gloo allreduce; every rank's host and sum. The
    rendezvous and the collective wait at most the stall bound (a blocked port fails, it does not hang)."""
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from helpers.jobs import stall_timeout_s
    from helpers.network import pin_interface

    interface = pin_interface()
    dist.init_process_group("gloo", timeout=timedelta(seconds=stall_timeout_s()))
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (socket.gethostname(), interface, total.item()))
    dist.destroy_process_group()
    return gathered


def _horovod_allreduce() -> float:
    """In every Horovod process: one allreduce of 1 (the sum is the number of processes)."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    return hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()


def _collective(spark, item: str, run: Callable[[], str], fix: str, bound_s: float) -> Row:
    """Run one launcher's collective, its Spark jobs cancelled after ``bound_s`` seconds (a rendezvous whose port is
    blocked would wait ten minutes); its row (the first line of what it raised, if it did)."""
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        spark.sparkContext.cancelAllJobs()

    timer = threading.Timer(bound_s, cancel)
    timer.start()
    try:
        return Row(item, "all", True, run())
    except Exception as exc:  # any failure of the launcher is the finding
        if cancelled.is_set():
            found = f"no result in {bound_s:g} s: the processes on different hosts did not meet"
        else:
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            found = f"{type(exc).__name__}: {first[:200]}"
        return Row(item, "all", False, found, fix)
    finally:
        timer.cancel()


def _launcher_rows(spark, processes: int, ray: bool, bound_s: float) -> list[Row]:
    """An allreduce across hosts with each launcher that trains on the workers (Ray on Spark with ``ray``), each
    given ``bound_s`` seconds."""
    from helpers.devices import horovod_installed
    from helpers.distributor import make_distributor, run_with_distributor
    from helpers.network import INTERFACE_ENV

    ports = (
        f"open the ports between the workers and to the driver (docs/instructor.md, section 2), or name the "
        f"interface between the hosts ({INTERFACE_ENV})"
    )

    def torch_distributor() -> str:
        ranks = run_with_distributor(make_distributor(processes, local_mode=False, spark=spark), _torch_allreduce)
        hosts = sorted({host for host, _, _ in ranks})
        interfaces = sorted({str(interface) for _, interface, _ in ranks})
        return f"{len(ranks)} processes on {', '.join(hosts)}, interface {', '.join(interfaces)}, sum {ranks[0][2]:g}"

    def horovod() -> str:
        from helpers.horovod_runner import HorovodRunner

        return f"{processes} processes, allreduce sum {HorovodRunner(np=processes).run(_horovod_allreduce):g}"

    def ray_on_spark() -> str:
        from helpers.ray_on_spark import ray_cluster

        with ray_cluster(spark, workers=processes) as cluster:
            nodes = cluster.nodes()
        return f"{len(nodes)} Ray nodes at {sorted({n['NodeManagerAddress'] for n in nodes})}"

    rows = [_collective(spark, "torch_distributor", torch_distributor, ports, bound_s)]
    if horovod_installed():
        rows.append(_collective(spark, "horovod", horovod, ports, bound_s))
    if ray:
        rows.append(_collective(spark, "ray", ray_on_spark, ports, bound_s))
    return rows


def _expected(params_path: str) -> dict[str, Any]:
    """What the parameter file asks of the cluster: lesson 4's settings, the shared ones, and its ``runner.env``
    set in this process as a notebook's kernel would get it (and the preflight's short stall bound)."""
    from helpers.tracking import tracking_uri

    params = load_params(params_path)
    os.environ.update(kernel_env(params))
    os.environ["COURSE_STALL_TIMEOUT_S"] = STALL_S
    lesson = {**params.common, **params.sections.get("04", {})}
    uri = lesson.get("MLFLOW_TRACKING_URI")
    return {
        "master": lesson.get("SPARK_MASTER"),
        "workers": int(lesson.get("WORKERS", 2)),
        "use_gpu": bool(lesson.get("USE_GPU", False)),
        "work_dir": lesson.get("WORK_DIR"),
        "data_dir": lesson.get("DATA_DIR"),
        "pretrained": bool(lesson.get("PRETRAINED", False)),
        "tracking_uri": tracking_uri(uri) if uri else None,
    }


def _experiment_id(uri: str | None) -> tuple[str | None, Row | None]:
    """The ``preflight`` experiment on the tracking server, made from the driver; or the driver's failing row."""
    if uri is None:
        return None, None
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    try:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        found = client.get_experiment_by_name("preflight")
        return (found.experiment_id if found else client.create_experiment("preflight")), None
    except Exception as exc:  # the server's failure is the finding
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return None, Row("mlflow", "driver", False, first, f"start the tracking server at {uri}")


def preflight(params_path: str, ray: bool = False, bound_s: float = COLLECTIVE_BOUND_S) -> list[Row]:
    """Check the cluster of a parameter file from this driver (see the module).

    Args:
        params_path: the parameter file (its lesson-4 section names the master and the training processes).
        ray: also start Ray on Spark and check its nodes.
        bound_s: the seconds each launcher's row may take before it fails (start-up, rendezvous, collective).

    Returns:
        The table's rows, the failing ones with a fix.
    """
    from helpers.cluster import ClusterStartError, LocalCluster
    from helpers.shared_storage import shared_folder_report
    from helpers.workdir import use_work_dir, work_dir

    expect = _expected(params_path)
    use_work_dir(expect["work_dir"])
    experiment, failed = _experiment_id(expect["tracking_uri"])
    settings = {"data_dir": expect["data_dir"], "tracking_uri": expect["tracking_uri"], "experiment_id": experiment}
    driver = {**host_facts(settings), "gpus": []}
    gpu_conf = {"spark.task.resource.gpu.amount": "1"} if expect["use_gpu"] else None
    cluster = LocalCluster(workers=expect["workers"], master_url=expect["master"], spark_conf=gpu_conf,
                           check_shared=False, start_timeout=180)  # fmt: skip
    try:
        spark = cluster.start().spark
    except (ClusterStartError, OSError) as exc:
        return [*([failed] if failed else []), Row("executors", "driver", False, str(exc).split(". ")[0], str(exc))]
    try:
        n = expect["workers"]
        hosts = spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(_task_facts(settings)).collect()
        rows = [Row("spark", "driver", True, f"Spark {spark.version}, {n} executors, driver at "
                    f"{spark.conf.get('spark.driver.host')}")]  # fmt: skip
        rows += [failed] if failed else []
        rows += _host_rows(driver, hosts, {**expect, "tracking_uri": None if failed else expect["tracking_uri"]})
        shared = shared_folder_report(spark, work_dir())
        rows += [
            Row(
                "shared folder",
                host,
                not problem,
                problem or f"shares {work_dir()} with the driver",
                "mount the shared folder at the same path on every host",
            )
            for host, problem in sorted(shared.items())
        ]
        if any(shared.values()):
            return rows + [Row("launchers", "all", None, "not run: they need the shared folder on every host")]
        return rows + _launcher_rows(spark, n, ray, bound_s)
    finally:
        cluster.stop()


def table(rows: list[Row]) -> str:
    """The rows as a plain-text table: item, host, result, what was found, what to do."""
    lines = [("item", "host", "result", "found", "what to do")]
    lines += [(r.item, r.host, r.result, r.found, r.fix if r.ok is False else "") for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line[:4], widths)) + "  " + line[4] for line in lines)


def _seconds(text: str) -> float:
    """``--bound``: a positive number of seconds, else argparse's one-line error."""
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds (e.g. --bound 90)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``preflight`` subcommand's options.

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument(
        "--params", required=True, help="the parameter file of the cluster (e.g. params/gpu_cluster.yaml)"
    )
    parser.add_argument("--ray", action="store_true", help="also start Ray on Spark on the workers (about a minute)")
    parser.add_argument(
        "--bound", type=_seconds, default=COLLECTIVE_BOUND_S, metavar="SECONDS",
        help=f"the seconds each launcher's row may take before it fails (default {COLLECTIVE_BOUND_S}; raise it where "
        "processes start slowly)",
    )  # fmt: skip


def command(args: argparse.Namespace) -> int:
    """Run the preflight and print its table.

    Returns:
        0 when every row is ok, 1 otherwise.
    """
    rows = preflight(args.params, ray=args.ray, bound_s=args.bound)
    print(table(rows), flush=True)
    failed = [row for row in rows if row.ok is False]
    print(
        f"{len(rows) - len(failed)} of {len(rows)} checks ok"
        + (f"; fix the {len(failed)} marked FAIL" if failed else "")
    )
    return 1 if failed else 0
