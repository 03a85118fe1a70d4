"""The launchers' shared job protocol: failure records, the root-cause rule, MLflow clean-up, the worker wrapper.

The launchers' own tests (test_horovod_runner, test_distributor, test_horovod_training) run it with real
processes; these tests pin the rule itself on real exceptions and a real MLflow store.
"""

import json
import os
import socket

import pytest
from mlflow.tracking import MlflowClient

from helpers.jobs import JOB_DIR_ENV, JobError, JobFolder, WorkerCall, is_collateral, last_checkpoint, record_mlflow_run
from helpers.tracking import tracking_uri

pytestmark = pytest.mark.usefixtures("work_dir")


class HorovodInternalError(RuntimeError):
    """Named like Horovod's own: what a rank raises when another one stopped."""


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a real traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_echoes_of_another_ranks_failure_are_collateral_and_own_errors_are_not():
    assert is_collateral(HorovodInternalError("ncclAllReduce failed"))
    assert is_collateral(
        RuntimeError("Horovod has been shut down. This was caused by an exception on one of the ranks")
    )
    assert is_collateral(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert not is_collateral(ValueError("deliberate failure on rank 1"))
    assert not is_collateral(KeyError("label"))


def test_the_root_cause_is_the_earliest_own_error_even_after_an_echo():
    job = JobFolder.create("test")
    job.record_failure(0, raised(RuntimeError("Horovod has been shut down")))  # first in time, but an echo
    job.record_failure(1, raised(ValueError("the real problem")))
    job.record_failure(2, raised(TypeError("a later own error")))
    cause = job.root_cause()
    assert (cause.rank, cause.collateral) == (1, False)
    assert cause.last_line == "ValueError: the real problem"
    assert "Traceback (most recent call last)" in cause.text


def test_with_only_echoes_the_earliest_echo_is_named_and_without_records_nothing():
    job = JobFolder.create("test")
    assert job.root_cause() is None
    job.record_failure(3, raised(RuntimeError("Connection reset by peer")))
    job.record_failure(1, raised(RuntimeError("Horovod has been shut down")))
    assert job.root_cause().rank == 3 and job.root_cause().collateral


def test_a_worker_call_records_its_rank_and_reraises(monkeypatch):
    job = JobFolder.create("test")
    monkeypatch.setenv("RANK", "4")

    def fails(x):
        raise ZeroDivisionError(f"x={x}")

    with pytest.raises(ZeroDivisionError):
        WorkerCall(fails, job, rank_env="RANK")(7)
    assert os.environ[JOB_DIR_ENV] == str(job.path)  # the training code finds its job
    assert job.failures()[4].last_line == "ZeroDivisionError: x=7"
    assert WorkerCall(lambda x: x * 2, job, rank_env="RANK")(x=21) == 42
    assert list(job.failures()) == [4]
    assert job.hosts() == {4: socket.gethostname()}  # so that the driver can name the host of a silent rank
    assert job.ranks_with_hosts([5, 4]) == f"5, 4 ({socket.gethostname()})"


def test_a_job_error_names_the_checkpoint_to_resume_from_after_its_first_line(tmp_path):
    error = JobError("rank 1 of 2 failed: ValueError: x\n--- traceback from rank 1 ---\nTraceback ...")
    assert error.add_resume_hint(tmp_path) is error and error.last_checkpoint is None
    assert str(error).startswith("rank 1 of 2 failed: ValueError: x. No checkpoint was written yet: rerun from")
    (tmp_path / "last.ckpt").write_bytes(b"saved")
    error = JobError("lost a host.").add_resume_hint(tmp_path)
    assert error.last_checkpoint == str(tmp_path / "last.ckpt") == last_checkpoint(tmp_path)
    assert (
        str(error)
        == f"lost a host. Rerun with ckpt_restore={str(tmp_path / 'last.ckpt')!r} to continue from its last checkpoint."
    )


def test_records_are_complete_json_and_leave_no_temporary_files():
    job = JobFolder.create("test")
    for rank in range(3):
        job.record_failure(rank, raised(ValueError(rank)))
    job.write_result(b"rank 0's result")
    names = sorted(path.name for path in job.path.iterdir())
    assert names == ["failure-rank-0.json", "failure-rank-1.json", "failure-rank-2.json", "result.pkl"]
    assert json.loads((job.path / "failure-rank-2.json").read_text())["rank"] == 2
    assert job.read_result() == b"rank 0's result"
    job.remove()
    assert not job.path.exists()


def test_outside_a_job_recording_a_run_does_nothing(monkeypatch, work_dir):
    monkeypatch.delenv(JOB_DIR_ENV, raising=False)
    record_mlflow_run("0" * 32, tracking_uri())
    assert not (work_dir / "jobs").exists()


def test_after_a_failed_job_only_runs_left_running_are_failed_and_errors_only_warn(monkeypatch, work_dir):
    """A FINISHED run is left alone, and a store the driver cannot reach only warns (the worker's error must not
    be replaced by a bookkeeping one)."""
    client = MlflowClient(tracking_uri())
    experiment_id = client.create_experiment("cleanup", artifact_location=(work_dir / "artifacts").as_uri())
    open_run = client.create_run(experiment_id).info.run_id  # RUNNING, as a killed rank leaves it
    finished = client.create_run(experiment_id).info.run_id
    client.set_terminated(finished, "FINISHED")
    job = JobFolder.create("test")
    monkeypatch.setenv(JOB_DIR_ENV, str(job.path))
    for run_id in (open_run, finished):
        record_mlflow_run(run_id, tracking_uri())
    record_mlflow_run("0" * 32, f"sqlite:///{work_dir / 'missing' / 'nowhere.db'}")
    with pytest.warns(UserWarning, match="could not mark the MLflow run"):
        job.fail_open_mlflow_runs()
    assert client.get_run(open_run).info.status == "FAILED"
    assert client.get_run(open_run).info.end_time is not None
    assert client.get_run(finished).info.status == "FINISHED"


def test_the_drivers_workspace_credentials_reach_a_process_and_its_experiment_id_does_not(monkeypatch, tmp_path):
    """A Spark task does not inherit the notebook's authentication: the call carries it to every process."""
    import subprocess
    import sys

    import cloudpickle

    from helpers.jobs import worker_credentials

    def databricks_env() -> dict:  # defined here: sent by value, as a notebook's function is
        return {name: os.environ.get(name) for name in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "MLFLOW_EXPERIMENT_ID")}

    monkeypatch.setenv("DATABRICKS_HOST", "https://adb-123.azuredatabricks.net")
    monkeypatch.setenv("DATABRICKS_TOKEN", "dapi-test-token")
    call = WorkerCall(databricks_env, JobFolder.create("test"), rank_env="RANK")
    pickled = tmp_path / "call.pkl"
    pickled.write_bytes(cloudpickle.dumps(call))
    clean = {key: value for key, value in os.environ.items() if not key.startswith("DATABRICKS_")}
    clean["MLFLOW_EXPERIMENT_ID"] = "1"  # the notebook's experiment (set_experiment exports it): not the worker's
    program = f"import cloudpickle, json; print(json.dumps(cloudpickle.loads(open({str(pickled)!r}, 'rb').read())()))"
    done = subprocess.run([sys.executable, "-c", program], env=clean, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "DATABRICKS_HOST": "https://adb-123.azuredatabricks.net",
        "DATABRICKS_TOKEN": "dapi-test-token",
        "MLFLOW_EXPERIMENT_ID": None,
    }
    monkeypatch.delenv("DATABRICKS_TOKEN")  # half a set of credentials is none
    assert worker_credentials() == {}
