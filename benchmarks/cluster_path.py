"""Part 7: the cluster path across hosts. The same lesson-4 training (Lightning DDP under TorchDistributor, 2
processes, the digits at 32 px) on a local 2-worker cluster and on a cluster of 2 one-core workers on separate hosts
(helpers.multihost), so that a regression in what crossing hosts costs (the driver's address, the shared-folder
check, the interface choice, the tracking server) shows as a ratio.

Each side is one driver process (``python -m benchmarks.cluster_path [MASTER_URL]``) that connects, prepares the data
and trains ``repeats`` times after one unrecorded job; on the multi-host side it runs on the driver host, with the
MLflow server as its tracking store. Needs root (namespaces): elsewhere the part is skipped and says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Comparison, median

WORKERS = 2
SIDES = ("multihost", "local")


def train_times(master_url: str | None, repeats: int, epochs: int) -> dict[str, list[float]]:
    """In the driver process: connect (or start a local cluster), then ``repeats`` + 1 trainings; their times."""
    from helpers.cluster import LocalCluster
    from helpers.loaders import prepare_data
    from helpers.workdir import work_dir
    from helpers.worker import TrainSettings, train_with_distributor

    with LocalCluster(workers=WORKERS, master_url=master_url, start_timeout=180) as cluster:
        _, train, val, classes = prepare_data(None, num_devices=WORKERS, spark=cluster.spark)
        times: dict[str, list[float]] = {"job_s": [], "fit_s": []}
        for attempt in range(repeats + 1):
            with tempfile.TemporaryDirectory(dir=work_dir()) as folder:
                settings = TrainSettings(image_size=32, max_epochs=epochs, early_stopping=False, default_dir=folder)
                started = time.perf_counter()
                result = train_with_distributor(train, val, len(classes), settings, num_processes=WORKERS,
                                                local_mode=False, spark=cluster.spark)  # fmt: skip
                if attempt:  # the first job warms the caches of both sides alike
                    times["job_s"].append(time.perf_counter() - started)
                    times["fit_s"].append(result.wall_time_s)
    return times


def _reported(output: str) -> dict[str, list[float]]:
    """The times a driver process printed (its ``TIMES`` line); raises with its output's end if there is none."""
    line = next((x for x in output.splitlines() if x.startswith("TIMES ")), None)
    if line is None:
        raise RuntimeError(f"the training driver failed: {output[-2000:]}")
    return json.loads(line.removeprefix("TIMES "))


class ClusterPathBench:
    """Part 7 (see the module): multi-host over local, whole-job time of the same training."""

    def __init__(self, repeats: int, epochs: int, work: Path):
        self.repeats, self.epochs, self.work = repeats, epochs, work
        self.missing: list[str] = []

    def run(self, log=print) -> list[Comparison]:
        from helpers.multihost import SHARED_MOUNT, MultiHostCluster, namespaces_available

        reason = namespaces_available()
        if reason:
            self.missing.append(f"7. Not measured: {reason}.")
            return []
        argv = [sys.executable, "-m", "benchmarks.cluster_path", str(self.repeats), str(self.epochs)]
        log(f"  local: a {WORKERS}-worker cluster on this machine, {self.repeats} + 1 trainings")
        local = subprocess.run(argv, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
        times = {"local": _reported(local.stdout)}
        log("  multihost: 2 one-core workers, a driver and an MLflow server on separate hosts, the same trainings")
        with MultiHostCluster(worker_cores=(1, 1), shared=tempfile.mkdtemp(dir=self.work)) as cluster:
            env = {"COURSE_WORK_DIR": f"{SHARED_MOUNT}/work", "MLFLOW_TRACKING_URI": cluster.mlflow_uri}
            process = cluster.run("driver", [*argv, cluster.master_url], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)  # fmt: skip
            times["multihost"] = _reported(process.communicate()[0])
        job = Comparison(
            f"7. the lesson-4 training across hosts vs on one machine ({WORKERS} workers, TorchDistributor)",
            "s", "multihost", "local", 1.5, "<=",
            {side: times[side]["job_s"] for side in SIDES},
        )  # fmt: skip
        fit = {side: median(times[side]["fit_s"]) for side in SIDES}
        job.notes.append(
            f"Whole TorchDistributor job, {self.epochs} epochs, the first of {self.repeats + 1} jobs per side "
            f"unrecorded. Median fit: multihost {fit['multihost']:.1f} s, local {fit['local']:.1f} s; the rest of a "
            "job is Spark's barrier stage, torchrun's rendezvous and, across hosts, the shared-folder check (one "
            "Spark job) and the veth bridge between the namespaces. The target, 1.5, allows for that check and "
            "for the tracking server."
        )
        return [job]


if __name__ == "__main__":
    repeats, epochs, *master = sys.argv[1:]
    print("TIMES " + json.dumps(train_times(master[0] if master else None, int(repeats), int(epochs))), flush=True)
