"""Lesson 2 MLflow tracking: the store, one run per training with its params, the registry, failed runs.

Real MLflow on a SQLite store in a temporary work directory, real Lightning trainings on digits.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import mlflow
import pytest
import pytorch_lightning as pl
import torch
from test_model_training import CLASS_COUNT, IMAGE_SIZE, DigitsDataModule
from torch.utils.data import DataLoader

from helpers import CourseInputError
from helpers.model import LitClassificationModel
from helpers.tracking import (
    load_registered_model,
    metric_history,
    registry_name,
    run_name,
    setup_mlflow,
    tracking_uri,
)
from helpers.training import _without_registry_news, train
from helpers.workdir import REPO_ROOT

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.usefixtures("one_torch_thread"),
]

EXPERIMENT = "lesson2-digits"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One work directory (and so one MLflow store) for this module's trainings."""
    return tmp_path_factory.mktemp("work")


@pytest.fixture(autouse=True)
def course_work_dir(work, monkeypatch):
    monkeypatch.setenv("COURSE_WORK_DIR", str(work))


@pytest.fixture(scope="module")
def digits() -> DigitsDataModule:
    return DigitsDataModule()


@pytest.fixture(scope="module")
def tracked(digits, work):
    """One tracked training of 4 epochs, its result, and the experiment's runs right after it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_WORK_DIR", str(work))
        pl.seed_everything(0, verbose=False)
        model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
        result = train(
            model,
            digits,
            max_epochs=4,
            mlflow_experiment=EXPERIMENT,
            run_name="tracked",
            registered_model_name="digits-classifier",
            extra_params={"dataset": "sklearn-digits"},
            progress_bar=False,
        )
        runs = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    return result, runs


def runs_of(experiment: str) -> list:
    return mlflow.search_runs(experiment_names=[experiment], output_format="list")


def test_default_store_is_sqlite_under_the_work_dir(work):
    assert tracking_uri() == f"sqlite:///{work / 'mlflow' / 'mlflow.db'}"
    assert tracking_uri("databricks") == "databricks"
    assert tracking_uri("http://mlflow.example:5000") == "http://mlflow.example:5000"


def test_a_reader_ignores_an_inherited_tracking_uri_as_train_does(tmp_path):
    # MLFLOW_TRACKING_URI inherited from outside (mlflow.set_tracking_uri in a parent process exports it): train's
    # processes write to the course store, so metric_history(run, key) without a URI must read there too
    script = (
        "import mlflow\n"
        "from mlflow.tracking import MlflowClient\n"
        "from helpers.tracking import metric_history, resolve_uri, tracking_uri\n"
        "client = MlflowClient(tracking_uri(None))\n"
        "run = client.create_run(client.create_experiment('inherited')).info.run_id\n"
        "client.log_metric(run, 'lr', 0.5, step=3)\n"
        "print(metric_history(run, 'lr'))\n"
        "mlflow.set_tracking_uri('sqlite:///' + sys.argv[1])\n"
        "print(resolve_uri(None))\n"
    )
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": elsewhere, "COURSE_WORK_DIR": str(tmp_path / "work")}
    done = subprocess.run([sys.executable, "-c", "import sys\n" + script, str(tmp_path / "set-here.db")],
                          env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    history, set_here = done.stdout.strip().splitlines()[-2:]
    assert history == "[(3, 0.5)]"
    assert set_here == f"sqlite:///{tmp_path / 'set-here.db'}"  # a URI set in the process itself still counts


def test_setup_mlflow_gets_or_creates_the_experiment(work):
    experiment_id = setup_mlflow("setup-check")
    assert setup_mlflow("setup-check") == experiment_id
    experiment = mlflow.get_experiment(experiment_id)
    assert experiment.name == "setup-check"
    assert experiment.artifact_location == (work / "mlflow" / "artifacts" / "setup-check").as_uri()
    assert mlflow.get_tracking_uri() == tracking_uri()


def test_empty_experiment_name_is_rejected():
    with pytest.raises(CourseInputError, match="experiment"):
        setup_mlflow(" ")


@pytest.mark.slow
def test_one_finished_run_with_the_training_params(tracked):
    result, runs = tracked
    assert [run.info.run_id for run in runs] == [result.mlflow_run_id]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "tracked"
    params = run.data.params
    expected = {
        "learning_rate": "0.01",
        "batch_size": "64",
        "devices": "1",
        "world_size": "1",
        "max_epochs": "4",
        "early_stopping_min_delta": "0.01",
        "early_stopping_patience": "10",
        "dataset": "sklearn-digits",
        "effective_learning_rate": "0.01",
    }
    assert {key: params.get(key) for key in expected} == expected
    assert run.data.metrics["wall_time_s"] == pytest.approx(result.wall_time_s)


@pytest.mark.slow
def test_epoch_metrics_are_logged_per_epoch(tracked):
    result, _ = tracked
    val_loss = metric_history(result.mlflow_run_id, "val_loss")
    assert [step for step, _ in val_loss] == [0, 1, 2, 3]
    assert val_loss[-1][1] < val_loss[0][1]
    assert val_loss[-1][1] == pytest.approx(result.last_val_loss)
    assert metric_history(result.mlflow_run_id, "val_acc")[-1][1] >= 0.9


@pytest.mark.slow
def test_registered_model_loads_back_and_predicts(tracked, digits):
    result, _ = tracked
    assert (result.registered_model_name, result.registered_model_version) == ("digits-classifier", "1")
    for version in ("latest", 1):
        network = load_registered_model("digits-classifier", version)
        with torch.no_grad():
            predicted = network(digits.val_x).argmax(dim=1)
        assert (predicted == digits.val_y).float().mean() >= 0.9


def test_registering_prints_none_of_the_registry_s_news_and_passes_on_the_rest(digits, capfd):
    for expected in ("1", "2"):  # a new name, then a new version of it
        result = train(
            LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE),
            digits,
            max_epochs=1,
            mlflow_experiment="quiet",
            registered_model_name="quiet-classifier",
            progress_bar=False,
        )
        assert result.registered_model_version == expected
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if "quiet-classifier" in line], err
    with pytest.raises(ValueError), _without_registry_news():
        print("Created version '3' of model 'quiet-classifier'.", file=sys.stderr)
        print("a warning the learner should see", file=sys.stderr)
        raise ValueError("registration failed")
    assert capfd.readouterr().err == "a warning the learner should see\n"


def test_unknown_registered_model_is_reported():
    setup_mlflow("setup-check")
    with pytest.raises(CourseInputError, match="no-such-model"):
        load_registered_model("no-such-model")


# --- Unity Catalog's registry (Databricks): three-level names, no models:/name/latest -------------------------------


def test_model_names_go_into_the_schema_course_model_schema_names(monkeypatch):
    monkeypatch.delenv("COURSE_MODEL_SCHEMA", raising=False)
    assert registry_name("image-classifier") == "image-classifier"  # laptops, MLflow servers: as given
    assert registry_name("image-classifier", "sqlite:///x.db") == "image-classifier"
    monkeypatch.setenv("COURSE_MODEL_SCHEMA", "main.scaling_dl")
    assert registry_name("image-classifier") == "main.scaling_dl.image-classifier"
    assert registry_name("image-classifier", "databricks-uc") == "main.scaling_dl.image-classifier"
    assert registry_name("prod.models.classifier", "databricks-uc") == "prod.models.classifier"  # already qualified


@pytest.mark.parametrize("schema", ["main", "main.a.b", "main.", "main.my schema", "main/x.y"])
def test_a_model_schema_that_is_not_catalog_dot_schema_is_refused(monkeypatch, schema):
    monkeypatch.setenv("COURSE_MODEL_SCHEMA", schema)
    with pytest.raises(CourseInputError, match=r"COURSE_MODEL_SCHEMA=.*<catalog>\.<schema>"):
        registry_name("image-classifier")


def test_unity_catalog_takes_only_three_level_names(monkeypatch):
    monkeypatch.delenv("COURSE_MODEL_SCHEMA", raising=False)
    for uri in ("databricks-uc", "databricks-uc://my-profile"):
        with pytest.raises(CourseInputError, match=r"catalog\.schema\.model: set COURSE_MODEL_SCHEMA"):
            registry_name("image-classifier", uri)
    with pytest.raises(CourseInputError, match="catalog.schema.model"):
        registry_name("main.scaling_dl.image classifier", "databricks-uc")  # no spaces in Unity Catalog names
    assert registry_name("image-classifier", "databricks") == "image-classifier"  # the legacy workspace registry


def test_a_name_unity_catalog_refuses_stops_train_before_the_fit(monkeypatch, digits):
    """MLFLOW_REGISTRY_URI=databricks-uc, as params/databricks.yaml sets it, and no COURSE_MODEL_SCHEMA: the error
    comes before any epoch and leaves no run behind (registering would fail only after the training)."""
    monkeypatch.delenv("COURSE_MODEL_SCHEMA", raising=False)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "databricks-uc")
    model = LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE)
    before = [tensor.clone() for tensor in model.parameters()]
    with pytest.raises(CourseInputError, match="'lesson-2-uc'.*COURSE_MODEL_SCHEMA"):
        train(model, digits, max_epochs=1, mlflow_experiment="/Shared/course/lesson-2-uc", progress_bar=False)
    assert runs_of("/Shared/course/lesson-2-uc") == []
    assert all(torch.equal(old, new) for old, new in zip(before, model.parameters(), strict=True))  # never trained
    assert mlflow.active_run() is None


@pytest.mark.slow
def test_model_is_registered_in_the_schema_and_loads_back_by_its_short_name(monkeypatch, digits):
    monkeypatch.setenv("COURSE_MODEL_SCHEMA", "main.scaling_dl")
    result = train(
        LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE),
        digits,
        max_epochs=1,
        mlflow_experiment="schema-check",
        registered_model_name="schema-classifier",
        progress_bar=False,
    )
    assert (result.registered_model_name, result.registered_model_version) == ("main.scaling_dl.schema-classifier", "1")
    network = load_registered_model("schema-classifier")  # the short name finds it, as lesson 2's would
    with torch.no_grad():
        assert network(digits.val_x[:4]).shape == (4, CLASS_COUNT)


def test_latest_is_the_highest_version_even_where_the_registry_has_no_latest(monkeypatch):
    """Unity Catalog's registry refuses ``get_latest_versions``, which ``models:/name/latest`` needs: "latest" is
    resolved from the versions found. Here the registry client (every store's way in) refuses it the same way."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking._model_registry.client import ModelRegistryClient

    setup_mlflow("latest-check")
    example = torch.ones(1, 2)
    for fill in (1.0, 2.0):  # version 1 maps the example to 2.0, version 2 to 4.0
        network = torch.nn.Linear(2, 1)
        torch.nn.init.constant_(network.weight, fill)
        torch.nn.init.zeros_(network.bias)
        with mlflow.start_run():
            mlflow.pytorch.log_model(network, name="model", input_example=example.numpy(),
                                     registered_model_name="latest-check", pip_requirements=[])  # fmt: skip

    def no_latest(self, name, stages=None):
        raise MlflowException("get_latest_versions is not supported for models in Unity Catalog")

    monkeypatch.setattr(ModelRegistryClient, "get_latest_versions", no_latest)
    with torch.no_grad():
        assert load_registered_model("latest-check")(example).item() == 4.0
        assert load_registered_model("latest-check", 1)(example).item() == 2.0


class BreaksInSecondEpoch:
    """Train batches that fail early in the second epoch, like a data source that disappears mid-training."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader, self.batches_served = loader, 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if self.batches_served == len(self.loader) + 2:
                raise RuntimeError("the data source went away")
            self.batches_served += 1
            yield batch


class BrokenDigits(DigitsDataModule):
    def train_dataloader(self) -> BreaksInSecondEpoch:
        return BreaksInSecondEpoch(super().train_dataloader())


@pytest.mark.slow
def test_failed_training_ends_its_run_failed_and_raises(tracked):
    with pytest.raises(RuntimeError, match="data source went away"):
        train(
            LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE),
            BrokenDigits(),
            max_epochs=3,
            mlflow_experiment="broken",
            progress_bar=False,
        )
    runs = runs_of("broken")
    assert [run.info.status for run in runs] == ["FAILED"]
    assert mlflow.active_run() is None
    assert [step for step, _ in metric_history(runs[0].info.run_id, "val_loss")] == [0]


@pytest.mark.slow
def test_untracked_training_opens_no_run_even_after_autolog(tracked, digits):
    before = len(mlflow.search_runs(search_all_experiments=True, output_format="list"))
    result = train(LitClassificationModel(CLASS_COUNT, image_size=IMAGE_SIZE), digits, max_epochs=1, progress_bar=False)
    assert result.mlflow_run_id is None
    assert len(mlflow.search_runs(search_all_experiments=True, output_format="list")) == before


def test_run_names_say_what_ran_and_never_repeat():
    names = {run_name("small_cnn", "devices2", "") for _ in range(3)}
    assert len(names) == 3  # same second, different random suffix
    assert all(re.fullmatch(r"small_cnn-devices2-\d{8}-\d{6}-[0-9a-f]{4}", name) for name in names), names
