"""MLflow for the course: where runs are stored, the experiment, loading registered models, metric histories.

Offline (a laptop, CI) everything goes to a SQLite store under the work directory,
``<work_dir>/mlflow/mlflow.db``, with artifacts in ``<work_dir>/mlflow/artifacts``. On a cluster pass the
workspace's URI (``"databricks"``, ``"http://host:5000"``): it is used as given.

The model registry is MLflow's choice for that URI (``MLFLOW_REGISTRY_URI`` overrides it). Unity Catalog's registry
(``databricks-uc``) takes three-level names, ``catalog.schema.model``: with ``COURSE_MODEL_SCHEMA=catalog.schema``
the course's own names (``image-classifier``) are registered in that schema (:func:`registry_name`).

MLflow is imported by the functions that call it: a training process other than global rank 0 never does, and the
import costs each process about a second of CPU.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from datetime import datetime
from urllib.parse import urlparse

from torch import nn

from helpers import CourseInputError
from helpers.workdir import work_path

__all__ = [
    "MODEL_SCHEMA_ENV",
    "load_registered_model",
    "metric_history",
    "registry_name",
    "resolve_uri",
    "run_name",
    "setup_mlflow",
    "tracking_uri",
]

MODEL_SCHEMA_ENV = "COURSE_MODEL_SCHEMA"  # "<catalog>.<schema>": the Unity Catalog schema models are registered in
UNITY_CATALOG_REGISTRY = "databricks-uc"  # MLflow's scheme for Unity Catalog's model registry on Databricks
_NOT_IN_UC_NAMES = re.compile(r"[\s/\x00-\x1f\x7f]")  # with the period: Unity Catalog refuses them in names

# Schema migrations and store set-up log at INFO on every new process: not useful in a notebook.
for _name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def run_name(*parts: object) -> str:
    """A readable, unique name for a run or a group of runs: ``<parts>-<YYYYmmdd-HHMMSS>-<4 hex>``.

    Args:
        parts: what the name says, e.g. ``("resnet", "devices2")``; joined with ``-``, empty parts left out.

    Returns:
        The parts, the local time to the second and four random hex digits, joined with ``-``.
    """
    words = [str(part) for part in parts if str(part)]
    return "-".join([*words, f"{datetime.now():%Y%m%d-%H%M%S}", uuid.uuid4().hex[:4]])


def tracking_uri(uri: str | None = None) -> str:
    """The MLflow tracking URI to use.

    Args:
        uri: a URI to use as given (``"databricks"``, ``"http://host:5000"``), or None.

    Returns:
        ``uri``, or the local SQLite store under the work directory when it is None or empty.
    """
    if uri:
        return uri
    return f"sqlite:///{work_path('mlflow', 'mlflow.db')}"


def _is_local_store(uri: str) -> bool:
    """True for stores on this file system (SQLite, plain paths), whose artifacts the course places itself."""
    return urlparse(uri).scheme in ("", "file", "sqlite")


def _uri_set_in_process() -> bool:
    """Whether ``mlflow.set_tracking_uri`` was called in this process: MLflow keeps that URI in a module global,
    while its public ``is_tracking_uri_set`` also counts the environment variable a process inherits."""
    from mlflow.tracking._tracking_service import utils

    return utils._tracking_uri is not None


def resolve_uri(uri: str | None) -> str:
    """The store a helper should use when the caller may have set one up earlier.

    Only a URI set in this process counts (``setup_mlflow``, ``mlflow.set_tracking_uri``), never a
    ``MLFLOW_TRACKING_URI`` this process inherited: ``train`` writes to ``tracking_uri(None)`` in its own processes,
    so a reader following an inherited variable would look in another store and find nothing.

    Args:
        uri: a URI to use as given, or None.

    Returns:
        ``uri`` if given, else the URI set earlier in this process, else the course default.
    """
    if uri is None and _uri_set_in_process():
        import mlflow

        return mlflow.get_tracking_uri()
    return tracking_uri(uri)


def setup_mlflow(experiment: str, uri: str | None = None) -> str:
    """Point MLflow at ``tracking_uri(uri)`` and make ``experiment`` the active experiment.

    The experiment is created if needed (restored if it was deleted). On a local store its artifacts go to
    ``<work_dir>/mlflow/artifacts/<experiment>``, never to ``./mlruns`` in the current directory.

    Args:
        experiment: the experiment's name, e.g. ``"lesson2-digits"``.
        uri: the tracking URI; default: the local store under the work directory.

    Returns:
        The experiment's id.

    Raises:
        CourseInputError: ``experiment`` is empty.
    """
    if not experiment or not experiment.strip():
        raise CourseInputError("experiment is empty: pass an experiment name such as 'lesson2-digits'.")
    import mlflow
    from mlflow.tracking import MlflowClient

    resolved = tracking_uri(uri)
    mlflow.set_tracking_uri(resolved)
    client = MlflowClient(resolved)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        artifact_location = None
        if _is_local_store(resolved):
            folder = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("_") or "experiment"
            artifact_location = work_path("mlflow", "artifacts", folder).as_uri()
        experiment_id = client.create_experiment(experiment, artifact_location=artifact_location)
    else:
        experiment_id = found.experiment_id
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(experiment_id)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def _model_schema() -> str | None:
    """``COURSE_MODEL_SCHEMA`` if set: two names, ``catalog.schema``."""
    schema = os.environ.get(MODEL_SCHEMA_ENV, "").strip()
    if not schema:
        return None
    parts = schema.split(".")
    if len(parts) != 2 or not all(parts) or _NOT_IN_UC_NAMES.search(schema):
        raise CourseInputError(
            f"{MODEL_SCHEMA_ENV}={schema!r}: name the Unity Catalog schema the models go to as <catalog>.<schema> "
            "(e.g. main.scaling_dl), without spaces or slashes."
        )
    return schema


def _is_unity_catalog(registry_uri: str | None) -> bool:
    """True for Unity Catalog's registry on Databricks (``databricks-uc``, ``databricks-uc://profile``)."""
    return bool(registry_uri) and registry_uri.split(":", 1)[0] == UNITY_CATALOG_REGISTRY


def registry_name(name: str, registry_uri: str | None = None) -> str:
    """The name a model is registered (and looked up) under.

    A name without a dot (``image-classifier``) goes into the schema that ``COURSE_MODEL_SCHEMA`` names
    (``main.scaling_dl`` -> ``main.scaling_dl.image-classifier``); a name with dots, or any name while the variable
    is unset, is used as given.

    Args:
        name: the model's name.
        registry_uri: the registry it is for (``mlflow.get_registry_uri()``); a Unity Catalog registry
            (``databricks-uc``) must get a three-level name, which is checked here, before any training.

    Returns:
        The name to register.

    Raises:
        CourseInputError: ``name`` is empty, ``COURSE_MODEL_SCHEMA`` is not ``catalog.schema``, or the registry is
            Unity Catalog's and the name is not ``catalog.schema.model``.
    """
    if not name or not name.strip():
        raise CourseInputError("the registered model name is empty: pass a name such as 'image-classifier'.")
    schema = _model_schema()
    full = f"{schema}.{name}" if schema and "." not in name else name
    if _is_unity_catalog(registry_uri):
        parts = full.split(".")
        if len(parts) != 3 or not all(parts) or _NOT_IN_UC_NAMES.search(full):
            raise CourseInputError(
                f"registered model {full!r}: Unity Catalog's model registry ({registry_uri}) takes names "
                f"catalog.schema.model: set {MODEL_SCHEMA_ENV}=<catalog>.<schema> (runner.env of the parameter "
                "file, or the cluster's environment variables), or pass registered_model_name='catalog.schema.model'. "
                "MLFLOW_REGISTRY_URI=databricks selects the legacy workspace registry instead."
            )
    return full


def load_registered_model(name: str, version: str | int = "latest", uri: str | None = None) -> nn.Module:
    """Load a version of a registered model as a torch module.

    Args:
        name: the registered model's name (``result.registered_model_name``; a name without a dot goes through
            :func:`registry_name`, as when it was registered).
        version: a version number, or ``"latest"``: the highest version number (Unity Catalog's registry has no
            ``models:/name/latest``, so it is looked up here).
        uri: the tracking URI; default: the store set by ``setup_mlflow`` in this process, else the course's local
            store.

    Returns:
        The module: it maps images (N x 3 x H x W, float32) to class logits, ``model(features).argmax(dim=1)``.

    Raises:
        CourseInputError: the store has no version of ``name``, or the name does not suit the registry
            (:func:`registry_name`).
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    resolved = resolve_uri(uri)
    mlflow.set_tracking_uri(resolved)
    name = registry_name(name, mlflow.get_registry_uri())
    versions = MlflowClient(resolved).search_model_versions(f"name = '{name}'")
    if not versions:
        raise CourseInputError(
            f"registered model {name!r} has no versions in {resolved}: train with train(..., mlflow_experiment=...) "
            "first, or check the name and the tracking URI."
        )
    if str(version).lower() == "latest":
        version = max(int(found.version) for found in versions)
    return mlflow.pytorch.load_model(f"models:/{name}/{version}")


def metric_history(run_id: str, key: str, uri: str | None = None) -> list[tuple[int, float]]:
    """The values of a metric logged in a run, ready to plot.

    Args:
        run_id: the MLflow run.
        key: the metric, e.g. ``"val_loss"``; training runs log their epoch metrics (``val_loss``, ``val_acc``,
            ``train_loss_epoch``) with the epoch as the step.
        uri: the tracking URI; default: the one set in this process, else the course's local store.

    Returns:
        ``(step, value)`` pairs sorted by step.
    """
    from mlflow.tracking import MlflowClient

    history = MlflowClient(resolve_uri(uri)).get_metric_history(run_id, key)
    return sorted((metric.step, metric.value) for metric in history)
