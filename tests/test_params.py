"""The parameter files in params/ fit every solution notebook, and helpers.course.run refuses bad ones clearly.

Nothing is executed: each file's values are injected into each notebook with papermill's own
``parameterize_notebook`` and the injected cell is checked against the notebook's parameters cell (names declared,
types like the defaults', None only where the default is None or the annotation allows it).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import nbformat
import pytest
import yaml

from helpers import CourseInputError
from helpers.course.build import solution_notebooks
from helpers.course.cli import main
from helpers.course.run import declared_parameters, load_params, resolve_all, select
from helpers.tracking import registry_name
from helpers.workdir import REPO_ROOT

PARAM_FILES = sorted((REPO_ROOT / "params").glob("*.yaml"))
SOLUTIONS = solution_notebooks()
CLUSTER_FILES = [p for p in PARAM_FILES if p.stem not in ("laptop", "multihost")]  # GPU clusters, real data


def _literal_assignments(source: str) -> dict[str, object]:
    """NAME -> value for every top-level assignment of a literal in ``source``."""
    values = {}
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            values[statement.target.id] = ast.literal_eval(statement.value)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                values[target.id] = ast.literal_eval(statement.value)
    return values


def _cell(nb, tag: str) -> str:
    cells = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag}"
    return cells[0].source


def _fits(value, default, annotation_allows_none: bool) -> bool:
    if default is None:
        return True
    if value is None:
        return annotation_allows_none
    if isinstance(default, bool) or isinstance(value, bool):
        return type(value) is type(default)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def test_the_three_parameter_files_exist():
    assert {p.stem for p in PARAM_FILES} >= {"laptop", "gpu_cluster", "databricks"}


@pytest.mark.parametrize("param_file", PARAM_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda p: p.stem[:2])
def test_parameters_inject_into_every_solution(param_file, notebook):
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    params = load_params(param_file)
    values = resolve_all(params, [notebook], SOLUTIONS)[notebook]
    nb = load_notebook_node(str(notebook))  # as papermill reads it (every cell gets a tags list)
    parameters_source = _cell(nb, "parameters")
    defaults = _literal_assignments(parameters_source)
    annotated = {
        s.target.id: ast.unparse(s.annotation)
        for s in ast.parse(parameters_source).body
        if isinstance(s, ast.AnnAssign)
    }
    injected = parameterize_notebook(nb, values, report_mode=False)
    injected_values = _literal_assignments(_cell(injected, "injected-parameters"))
    assert injected_values == values  # papermill's Python translator round-trips every value
    for name, value in injected_values.items():
        assert name in defaults, f"{param_file.name}: {name} is not a parameter of {notebook.stem}"
        allows_none = "None" in annotated.get(name, "") or "Optional" in annotated.get(name, "")
        assert _fits(value, defaults[name], allows_none), (
            f"{param_file.name} -> {notebook.stem}: {name}={value!r} does not fit the default {defaults[name]!r}"
        )


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda p: p.stem[:2])
def test_runner_sees_every_name_papermill_sees(notebook):
    import papermill

    assert set(papermill.inspect_notebook(str(notebook))) <= set(declared_parameters(notebook))
    assert list(declared_parameters(notebook)) == list(
        _literal_assignments(_cell(nbformat.read(str(notebook), as_version=4), "parameters"))
    )


@pytest.mark.parametrize("param_file", CLUSTER_FILES, ids=lambda p: p.stem)
def test_cluster_files_use_real_data_on_gpus(param_file):
    data = yaml.safe_load(param_file.read_text())
    common = data["common"]
    assert common["DATA_DIR"].rstrip("/").endswith("flower_photos")
    assert common["WORK_DIR"] and common["IMAGE_SIZE"] == 224 and common["MLFLOW_TRACKING_URI"]
    assert data["02_lightning_refactor"]["BACKBONE"] == "mobilenet_v2"
    assert data["02_lightning_refactor"]["PRETRAINED"] is True
    for section, body in data.items():
        if isinstance(body, dict) and "USE_GPU" in body:
            assert body["USE_GPU"] is True, section
    assert data["runner"]["env"]["COURSE_WORK_DIR"] == common["WORK_DIR"]


def _strings(node) -> list[str]:
    """Every string value of a parsed YAML document."""
    if isinstance(node, dict):
        return [text for value in node.values() for text in _strings(value)]
    if isinstance(node, list):
        return [text for value in node for text in _strings(value)]
    return [node] if isinstance(node, str) else []


def test_databricks_file_keeps_files_in_a_volume_and_models_in_unity_catalog(monkeypatch):
    data = yaml.safe_load((REPO_ROOT / "params" / "databricks.yaml").read_text())
    common, env = data["common"], data["runner"]["env"]
    assert not [text for text in _strings(data) if text.startswith(("/dbfs", "dbfs:"))]  # no DBFS left
    volume = "/".join(common["WORK_DIR"].split("/")[:5])  # /Volumes/<catalog>/<schema>/<volume>
    assert volume.startswith("/Volumes/") and volume.count("/") == 4, volume
    for path in (common["DATA_DIR"], common["WORK_DIR"], env["COURSE_WORK_DIR"], env["TORCH_HOME"]):
        assert path.startswith(volume + "/"), path  # one volume to create and grant
    assert common["MLFLOW_TRACKING_URI"] == "databricks" and env["MLFLOW_REGISTRY_URI"] == "databricks-uc"
    catalog, schema = volume.split("/")[2:4]
    assert env["COURSE_MODEL_SCHEMA"] == f"{catalog}.{schema}"  # the models beside the volume
    monkeypatch.setenv("COURSE_MODEL_SCHEMA", env["COURSE_MODEL_SCHEMA"])
    assert registry_name("image-classifier", env["MLFLOW_REGISTRY_URI"]) == f"{catalog}.{schema}.image-classifier"


def test_readme_names_the_files_and_the_command():
    readme = (REPO_ROOT / "README.md").read_text()
    for path in PARAM_FILES:
        assert f"params/{path.name}" in readme
    assert "python -m helpers.course run --params" in readme
    assert "docs/instructor.md" in readme


# --- the runner's errors -------------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def _resolve(path: Path, overrides=None):
    return resolve_all(load_params(path, overrides), SOLUTIONS, SOLUTIONS)


def test_unknown_file_is_a_clear_error(tmp_path):
    with pytest.raises(CourseInputError, match="no parameter file"):
        load_params(tmp_path / "nope.yaml")
    assert main(["run", "--params", str(tmp_path / "nope.yaml"), "--check"]) == 2


@pytest.mark.parametrize(
    "text, message",
    [
        ("common:\n  SEED: '0'\n", r"SEED='0' is a str.*pass int"),
        ("common:\n  SEED: true\n", r"SEED=True is a bool.*pass int"),
        ("02_lightning_refactor:\n  LEARNING_RATE: 1e-5\n", r"write it with a decimal point"),
        ("02_lightning_refactor:\n  PRETRAINED: 'yes'\n", r"PRETRAINED='yes' is a str"),
        ("00_environment_check:\n  USE_GPU: true\n", r"USE_GPU is not a parameter of this notebook"),
        ("common:\n  LEARNIG_RATE: 0.1\n", r"LEARNIG_RATE are declared by no notebook"),
        ("common:\n  WORK_DIR: dbfs:/course\n", r"FUSE path '/dbfs/course'"),
        ("lesson2:\n  SEED: 1\n", r"unknown section 'lesson2'"),
        ("02_wrong_name:\n  SEED: 1\n", r"rename the section to '02_lightning_refactor'"),
        ("runner:\n  kernal: python3\n", r"'runner' takes only"),
        ("- a\n- b\n", r"expected a mapping"),
    ],
)
def test_bad_files_are_refused_with_the_reason(tmp_path, text, message):
    with pytest.raises(CourseInputError, match=message):
        _resolve(_write(tmp_path, text))


def test_list_items_are_checked(tmp_path):
    if not any(p.stem.startswith("05") for p in SOLUTIONS):
        pytest.skip("lesson 5 is not in solutions/")
    with pytest.raises(CourseInputError, match="DEVICE_COUNTS"):
        _resolve(_write(tmp_path, "05_early_stopping_analysis:\n  DEVICE_COUNTS: [1, two]\n"))


def test_each_notebook_gets_only_its_own_names_and_sections_win(tmp_path):
    path = _write(
        tmp_path,
        """
        common:
          SEED: 3
          BATCH_SIZE: 16
        "02":
          BATCH_SIZE: 8
          LEARNING_RATE: 1
        """,
    )
    resolved = {nb.stem[:2]: values for nb, values in _resolve(path).items()}
    assert resolved["00"] == {"SEED": 3}
    assert resolved["01"] == {"SEED": 3, "BATCH_SIZE": 16}
    assert resolved["02"]["BATCH_SIZE"] == 8
    assert resolved["02"]["LEARNING_RATE"] == 1.0 and isinstance(resolved["02"]["LEARNING_RATE"], float)


def test_command_line_overrides_win_everywhere(tmp_path):
    path = _write(tmp_path, "02_lightning_refactor:\n  MAX_EPOCHS: 50\n")
    resolved = {nb.stem[:2]: values for nb, values in _resolve(path, {"MAX_EPOCHS": 1}).items()}
    assert resolved["02"]["MAX_EPOCHS"] == 1 and resolved["03"]["MAX_EPOCHS"] == 1
    assert "MAX_EPOCHS" not in resolved["00"]


def test_section_for_an_absent_lesson_is_skipped_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="no such notebook"):
        _resolve(_write(tmp_path, "09_future_lesson:\n  SEED: 1\n"))


def test_only_selects_by_prefix_and_rejects_unknown():
    assert [p.stem[:2] for p in select(SOLUTIONS, ["02"])] == ["02"]
    with pytest.raises(CourseInputError, match="--only 7"):
        select(SOLUTIONS, ["7"])
    with pytest.raises(CourseInputError, match="^--outputs 7: no solution notebook"):
        select(SOLUTIONS, ["7"], option="--outputs")


def test_check_prints_what_each_notebook_gets(capsys):
    laptop = str(REPO_ROOT / "params" / "laptop.yaml")
    assert main(["run", "--params", laptop, "--check", "--only", "02", "-p", "MAX_EPOCHS=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("02_lightning_refactor:") and "MAX_EPOCHS=1" in out


def test_instructor_guide_covers_the_topics():
    guide = (REPO_ROOT / "docs" / "instructor.md").read_text()
    for topic in (
        "T4",
        "64 GB",
        "make setup GPU=1",
        "python -m helpers.course run --params",
        "python -m helpers.course grade",
        "grades.csv",
        "too few partitions",
        "Petastorm cache on the local disk",
        "Horovod vs torch",
        "make gpu-smoke",
        "Unity Catalog",
        "COURSE_MODEL_SCHEMA",
        "CREATE MODEL",
        "WRITE VOLUME",
    ):
        assert topic in guide, topic
    for path in PARAM_FILES:
        assert f"params/{path.name}" in guide
