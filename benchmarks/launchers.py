"""Part 6, launchers: Ray Train, TorchDistributor and Horovod training the same model with 2 workers, side by side.

Every variant is one training job started through the course's own launcher, on the same 2-worker local standalone
cluster (``helpers.cluster.LocalCluster(workers=2, cores_per_worker=1)``), the same lake table sharded for 2
processes (``prepare_data(None, num_devices=2)``) and the same ``TrainSettings`` (lesson 2's model, early stopping
off, so every job trains the same number of epochs; no MLflow):

- ``ray``: ``helpers.worker.train_with_ray(..., num_workers=2)`` inside ``with ray_cluster(spark, workers=2):``
  (Ray on Spark, :mod:`helpers.ray_on_spark`). While Ray runs, its worker nodes hold both Spark task slots, so
  TorchDistributor and Horovod jobs could not run: every repetition starts Ray, runs the job and shuts Ray down,
  and the cluster's start and stop are measured apart from the job;
- ``torch_distributor``: ``helpers.worker.train_with_distributor(..., num_processes=2, local_mode=False)``
  (Lightning DDP in 2 Spark barrier tasks);
- ``horovod``: ``helpers.worker.launch_training("horovod", 2, ..., on_spark=True)`` (``HorovodRunner(np=2)``,
  ``HorovodStrategy`` in 2 Spark tasks), skipped where Horovod is not installed.

Each job gives the training throughput (training images x epochs / ``TrainResult.wall_time_s``, the fit alone:
its sanity check and validation passes included) and the whole job's wall time around the launcher call
(processes, imports, rendezvous, the fit, teardown). The variants alternate (Ray, TorchDistributor, Horovod, ...)
after one unrecorded job of each.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

from benchmarks.common import Comparison, Measurement, alternate

__all__ = ["WORKERS", "LaunchersBench"]

WORKERS = 2
TD = "torch_distributor"


class LaunchersBench:
    """Part 6: the three launchers on one cluster; ``run`` returns their comparisons against TorchDistributor.

    Args:
        epochs: the epochs every job trains (early stopping off).
        image_size, batch_size: the images' side and the rows per step and process.
        work: a folder for the jobs' checkpoints (one temporary folder per job, removed after it).
        quick: one repetition, no warm-up (``--quick``: checks that everything runs, measures nothing).
    """

    def __init__(
        self, epochs: int = 3, image_size: int = 32, batch_size: int = 32, work: Path | None = None, quick=False
    ) -> None:
        self.epochs, self.image_size, self.batch_size = epochs, image_size, batch_size
        self.work, self.quick = work, quick
        self.missing: list[str] = []
        self.cluster = None

    def setup(self) -> None:
        """The 2-worker cluster, the lake table sharded for 2 processes, the settings every job uses."""
        from helpers.cluster import LocalCluster
        from helpers.loaders import prepare_data
        from helpers.worker import TrainSettings

        self.cluster = LocalCluster(workers=WORKERS, cores_per_worker=1, start_timeout=180)
        self.spark = self.cluster.start().spark
        _, train, val, class_names = prepare_data(None, num_devices=WORKERS, spark=self.spark)
        self.data = (train, val, len(class_names))
        self.images = len(train)
        self.settings = TrainSettings(
            batch_size=self.batch_size,
            image_size=self.image_size,
            max_epochs=self.epochs,
            early_stopping=False,
            seed=0,
        )

    def _job(self, launch: Callable[..., object]) -> dict[str, float]:
        """Run ``launch(train, val, class_count, settings)``; its throughput, fit time and whole-job time."""
        with tempfile.TemporaryDirectory(prefix="bench-launchers-", dir=self.work) as folder:
            settings = self.settings.replace(default_dir=folder)
            started = time.perf_counter()
            result = launch(*self.data, settings)
            job_s = time.perf_counter() - started
        if result.epochs_run != self.epochs:
            raise RuntimeError(f"a job trained {result.epochs_run} epochs instead of {self.epochs}")
        return {
            "images_per_s": self.images * result.epochs_run / result.wall_time_s,
            "fit_s": result.wall_time_s,
            "job_s": job_s,
        }

    # --- the variants ------------------------------------------------------------------------------------------

    def ray(self) -> dict[str, float]:
        """Start Ray on Spark, train with Ray Train, shut Ray down: the job's figures and the cluster's times."""
        from helpers.ray_on_spark import ray_cluster
        from helpers.worker import train_with_ray

        started = time.perf_counter()
        with ray_cluster(self.spark, workers=WORKERS):
            start_s = time.perf_counter() - started
            measured = self._job(lambda *data: train_with_ray(*data, num_workers=WORKERS))
            stopping = time.perf_counter()
        stop_s = time.perf_counter() - stopping
        total = start_s + measured["job_s"] + stop_s
        return {**measured, "cluster_start_s": start_s, "cluster_stop_s": stop_s, "job_with_cluster_s": total}

    def torch_distributor(self) -> dict[str, float]:
        """Lightning DDP under TorchDistributor, in 2 Spark barrier tasks."""
        from helpers.worker import train_with_distributor

        return self._job(
            lambda *data: train_with_distributor(*data, num_processes=WORKERS, local_mode=False, spark=self.spark)
        )

    def horovod(self) -> dict[str, float]:
        """HorovodStrategy under ``HorovodRunner(np=2)``, in 2 Spark tasks."""
        from helpers.worker import launch_training

        return self._job(lambda *data: launch_training("horovod", WORKERS, *data, on_spark=True))

    # --- the comparisons ---------------------------------------------------------------------------------------

    def run(self, repeats: int, log=print) -> list[Comparison | Measurement]:
        """Set up, alternate the launchers ``repeats`` times; their comparisons against TorchDistributor."""
        from helpers.devices import horovod_installed

        log(f"  setup: a {WORKERS}-worker local cluster, the lake table sharded for {WORKERS} processes")
        self.setup()
        variants = {"ray": self.ray, TD: self.torch_distributor}
        if horovod_installed():
            variants["horovod"] = self.horovod
        else:
            self.missing.append("6. Horovod is not installed here: its rows of part 6 were not measured.")
        order = "one repetition (--quick)" if self.quick else "one unrecorded job each first"
        log(
            f"  per job: {self.images} training images x {self.epochs} epochs at {self.image_size} px, batch "
            f"{self.batch_size} per process; {order}"
        )
        if self.quick:
            values = alternate(variants, 1, warmup=False, log=log, minimum=1)
        else:
            values = alternate(variants, repeats, log=log)
        results: list[Comparison | Measurement] = []
        for label, name in (("a", "ray"), ("b", "horovod")):
            if name in variants:
                results += self._pair(label, name, values)
        results.append(self._ray_cluster(values))
        return results

    def _pair(self, label: str, name: str, values: dict[str, list[float]]) -> list[Comparison]:
        """``name`` against TorchDistributor: training throughput, then whole-job time (reported, no targets)."""
        shown = {"ray": "Ray Train", "horovod": "Horovod"}[name]
        throughput = Comparison(
            f"6{label}. {shown} vs TorchDistributor, training throughput ({WORKERS} workers)",
            "images/s",
            name,
            TD,
            1.0,
            ">=",
            {name: values[f"{name}@images_per_s"], TD: values[f"{TD}@images_per_s"]},
            report_only=True,
        )
        job = Comparison(
            f"6{label}'. {shown} vs TorchDistributor, whole job ({WORKERS} workers)",
            "s",
            name,
            TD,
            1.0,
            "<=",
            {name: values[f"{name}@job_s"], TD: values[f"{TD}@job_s"]},
            report_only=True,
        )
        if name == "ray":
            job.values["ray_with_cluster_start_and_stop"] = values["ray@job_with_cluster_s"]
        throughput.notes.append(self._throughput_note(name, values))
        job.notes.append(self._job_note(name, values))
        return [throughput, job]

    def _throughput_note(self, name: str, values: dict[str, list[float]]) -> str:
        """How the throughput was counted, and the fit times behind it."""
        fit = {k: median(values[f"{k}@fit_s"]) for k in (name, TD)}
        unexplained = (
            " Not profiled here: part 3 measured HorovodStrategy faster than Lightning DDP on in-memory tensors "
            "(3b), so a gap here lies in what these jobs add (the Petastorm loaders and validation passes, "
            "`horovod.spark.run` on the Spark tasks, the course's collective watch)."
            if name == "horovod" and fit[name] > 1.1 * fit[TD]
            else ""
        )
        return (
            f"Training throughput = {self.images} training images x {self.epochs} epochs / the fit's wall time "
            "(`TrainResult.wall_time_s`: Lightning's fit with its sanity check, a validation pass and a checkpoint "
            f"per epoch, the Petastorm readers opened in it). Median fit: {name} {fit[name]:.1f} s, {TD} "
            f"{fit[TD]:.1f} s. "
            "Every launcher runs the same `helpers.worker.train_process` on the same shards (Lightning DDP under "
            "Ray Train and TorchDistributor, HorovodStrategy under Horovod); no target was set for this ratio "
            "(parity, 1.0, is shown for scale): above 1 means faster than TorchDistributor." + unexplained
        )

    def _job_note(self, name: str, values: dict[str, list[float]]) -> str:
        """Where a whole job's time goes besides the fit."""
        job = {k: median(values[f"{k}@job_s"]) for k in (name, TD)}
        fit = {k: median(values[f"{k}@fit_s"]) for k in (name, TD)}
        text = (
            "Whole job = the launcher call's wall time on the driver. Besides the fit it took "
            f"{job[name] - fit[name]:.1f} s with {name} and {job[TD] - fit[TD]:.1f} s with {TD} (medians): "
            "starting the training processes, importing torch and Lightning in them, the rendezvous, and the "
            "teardown; below 1 means a shorter job."
        )
        if name == "ray":
            start, stop = median(values["ray@cluster_start_s"]), median(values["ray@cluster_stop_s"])
            text += (
                f" Ray's job excludes its cluster: starting Ray on Spark took {start:.1f} s and shutting it down "
                f"{stop:.1f} s more (medians, 6c); `ray_with_cluster_start_and_stop` is the job with both, what a "
                "one-off Ray Train job on a Spark cluster costs. A Ray cluster kept running for several jobs pays "
                "the start once, but holds the Spark task slots meanwhile."
            )
        return text

    def _ray_cluster(self, values: dict[str, list[float]]) -> Measurement:
        """Ray on Spark's own start and stop, every repetition."""
        return Measurement(
            f"6c. Ray on Spark: cluster start and stop ({WORKERS} worker nodes)",
            {key: values[f"ray@{key}"] for key in ("cluster_start_s", "cluster_stop_s")},
            [
                "`ray_cluster(spark, workers=2)` (helpers.ray_on_spark) from the call to a connected driver with "
                "every worker node registered, and leaving its block until every Ray process has exited, in seconds."
            ],
        )

    def close(self) -> None:
        """Stop the local cluster."""
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
