"""Run every solution notebook with papermill using one parameter file (laptop, GPU cluster, Databricks).

    python -m helpers.course run --params params/gpu_cluster.yaml [--out build/] [--only 02] [--check]

A parameter file is YAML with these top-level keys (all optional):

* ``common``: parameters for every notebook; each notebook gets only the names its ``parameters`` cell declares;
* one section per notebook, named by its file stem (``02_lightning_refactor``) or lesson number (``"02"``): its
  own values, which win over ``common``; every name in it must be a parameter of that notebook. A section for a
  lesson that is not in ``solutions/`` (yet) is skipped with a warning;
* ``runner``: how to run: ``kernel`` (default ``python3``), ``cell_timeout_s`` (per cell; default none),
  ``env`` (environment variables for the kernels, e.g. ``COURSE_WORK_DIR``, ``TORCH_HOME``).

Before anything runs, every value is checked against the default in the notebook's parameters cell: the same type
(an int is fine where the default is a float; anything where the default is None; ``X: str | None = None`` takes a
str or None). A name in ``common`` that no notebook declares, a wrong type, an unknown section or a missing file is
an error that names the file, the notebook and the parameter. ``--check`` stops after this and prints what each
notebook would get. ``-p NAME=VALUE`` overrides the file for every notebook that declares NAME (VALUE is read as YAML:
``-p MAX_EPOCHS=2``).

The notebooks run in order (``00`` first: the environment check fails fast on a broken set-up), in the solutions
folder as their working directory, and the executed copies go to ``--out``. The first failing notebook stops the
run (``--keep-going`` runs the rest), and the exit status is non-zero if any failed.

Every notebook execution of the course (this runner, the grader, the notebook tests, the benchmarks) goes through
:func:`papermill_command`, and all but the benchmarks through :func:`execute`.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import CourseInputError
from helpers.course.build import SOLUTIONS_DIR, display_path, solution_notebooks
from helpers.logs import logger_levels
from helpers.processes import kill_tree

__all__ = [
    "DEFAULT_KERNEL",
    "Declared",
    "Execution",
    "ParamFile",
    "add_arguments",
    "check_value",
    "command",
    "declared_parameters",
    "execute",
    "kernel_env",
    "load_params",
    "notebook_parameters",
    "papermill_command",
    "resolve_all",
    "run",
    "select",
]

DEFAULT_KERNEL = "python3"

TOP_LEVEL = ("common", "runner", "description")
RUNNER_KEYS = ("kernel", "cell_timeout_s", "env")
PATH_PARAMETERS = ("DATA_DIR", "WORK_DIR")  # the helpers open these as local paths (pathlib): no dbfs:/ URIs
_SECTION = re.compile(r"^(\d\d)(?:_\w+)?$")
_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict, "None": type(None)}


@dataclass(frozen=True)
class Declared:
    """One parameter of a notebook's parameters cell: its name, default (a Python value) and accepted types."""

    name: str
    default: Any
    types: tuple[type, ...] | None  # None: any value (the default is None and there is no annotation)
    help: str = ""

    def describe(self) -> str:
        if self.types is None:
            return "any value (default None)"
        return " or ".join("None" if t is type(None) else t.__name__ for t in self.types)


@dataclass(frozen=True)
class ParamFile:
    """A parsed parameter file."""

    path: Path
    common: dict[str, Any]
    sections: dict[str, dict[str, Any]]  # by lesson number "02" (or the full stem as written)
    section_names: dict[str, str]  # lesson number -> the key as written in the file
    kernel: str
    cell_timeout_s: float | None
    env: dict[str, str]
    overrides: dict[str, Any]  # from the command line: win over everything, for every notebook that declares them


def _annotation_types(annotation: str) -> tuple[type, ...] | None:
    """Types from an annotation such as ``int``, ``str | None``, ``Optional[str]``; None if not understood."""
    text = annotation.replace(" ", "")
    optional = re.fullmatch(r"(?:typing\.)?Optional\[(.+)\]", text)
    parts = [optional.group(1), "None"] if optional else text.split("|")
    types = []
    for part in parts:
        if part not in _TYPES:
            return None
        types.append(_TYPES[part])
    return tuple(types)


def _parameters_cell_source(notebook: Path) -> str:
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise CourseInputError(f"{display_path(notebook)}: needs exactly one cell tagged 'parameters' ({len(cells)}).")
    return cells[0].source


def declared_parameters(notebook: str | os.PathLike) -> dict[str, Declared]:
    """The parameters ``notebook`` declares, in order: every top-level ``NAME = literal`` or
    ``NAME: type = literal`` of its parameters cell, with its default and the types it accepts.

    The cell's source is parsed with ``ast`` rather than taken from ``papermill.inspect_notebook``, which skips
    any line with a second ``=`` (even in a comment, ``# runs HorovodRunner(np=-N)``); its help texts are used.

    Args:
        notebook: the notebook.

    Returns:
        The declared parameters by name.

    Raises:
        CourseInputError: no such notebook, not exactly one parameters cell, or a cell that is not valid Python.
    """
    import papermill

    path = Path(notebook)
    if not path.is_file():
        raise CourseInputError(f"no notebook at {display_path(path)}")
    try:
        body = ast.parse(_parameters_cell_source(path)).body
    except SyntaxError as error:
        raise CourseInputError(f"{display_path(path)}: the parameters cell is not valid Python ({error})") from None
    try:
        with logger_levels({"papermill": logging.ERROR}):  # its "Unable to parse line" warnings: handled here
            helps = {name: info.get("help", "") for name, info in papermill.inspect_notebook(str(path)).items()}
    except Exception:  # help texts are a nicety
        helps = {}
    declared = {}
    for statement in body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names, value, annotation = [statement.target.id], statement.value, ast.unparse(statement.annotation)
        elif isinstance(statement, ast.Assign) and all(isinstance(t, ast.Name) for t in statement.targets):
            names, value, annotation = [t.id for t in statement.targets], statement.value, None
        else:
            continue
        try:
            default = ast.literal_eval(value) if value is not None else None
        except ValueError:  # an expression (e.g. os.environ.get(...)): any value
            default = None
        types = _annotation_types(annotation) if annotation else None
        if types is None and default is not None:
            types = (type(default),)
        if types is not None and float in types and int not in types:
            types = (*types, int)
        for name in names:
            declared[name] = Declared(name, default, types, helps.get(name, ""))
    return declared


def _yaml_hint(value: Any, declared: Declared) -> str:
    if isinstance(value, str) and declared.types and float in declared.types:
        try:
            float(value)
        except ValueError:
            return ""
        return f" (YAML reads {value} as a string: write it with a decimal point, e.g. 1.0e-5)"
    return ""


def check_value(where: str, declared: Declared, value: Any) -> Any:
    """A parameter value checked against the notebook's declaration.

    Args:
        where: the file and notebook, for the message.
        declared: the parameter as the notebook declares it.
        value: the value from the parameter file or the command line.

    Returns:
        ``value`` (an int given for a float becomes a float).

    Raises:
        CourseInputError: a wrong type, list items unlike the default's, or a ``dbfs:/`` URI for a local path.
    """
    if declared.types is not None:
        fits = isinstance(value, declared.types) and not (
            isinstance(value, bool) and bool not in declared.types  # True is an int to Python, not to us
        )
        if not fits:
            raise CourseInputError(
                f"{where}: {declared.name}={value!r} is a {type(value).__name__}, but the notebook's default is "
                f"{declared.default!r}: pass {declared.describe()}{_yaml_hint(value, declared)}."
            )
    if isinstance(value, list) and isinstance(declared.default, list) and declared.default:
        kinds = {type(item) for item in declared.default}
        wrong = [item for item in value if type(item) not in kinds and not (float in kinds and type(item) is int)]
        if wrong:
            raise CourseInputError(
                f"{where}: {declared.name}={value!r}: the items should be like the default's, {declared.default!r}."
            )
    if isinstance(declared.default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # LEARNING_RATE: 1 means 1.0
    if declared.name in PATH_PARAMETERS and isinstance(value, str) and re.match(r"^dbfs:/", value):
        raise CourseInputError(
            f"{where}: {declared.name}={value!r}: the course opens this folder as a local path; on Databricks use "
            f"the FUSE path {'/dbfs/' + value[len('dbfs:/') :].lstrip('/')!r} instead of the dbfs:/ URI."
        )
    return value


def _section_key(key: Any) -> str | None:
    """The lesson number ("02") of a section key (``2``, ``"02"``, ``"02_lightning_refactor"``), else None."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{key:02d}"
    match = _SECTION.match(str(key))
    return match.group(1) if match else None


def load_params(path: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> ParamFile:
    """Read and structurally check a parameter file (values are checked against notebooks by ``resolve_all``).

    Args:
        path: the YAML file.
        overrides: ``-p NAME=VALUE`` values, which win over the file.

    Returns:
        The parsed file.

    Raises:
        CourseInputError: a missing file, invalid YAML, or an unknown or malformed section.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise CourseInputError(
            f"no parameter file at {path}: use one of the files in params/ (laptop.yaml, gpu_cluster.yaml, "
            "databricks.yaml) or a copy of one."
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise CourseInputError(f"{path}: not valid YAML ({error})") from None
    if not isinstance(data, dict):
        raise CourseInputError(f"{path}: expected a mapping with 'common:' and per-notebook sections.")
    common = data.get("common") or {}
    if not isinstance(common, dict):
        raise CourseInputError(f"{path}: 'common' must be a mapping of NAME: value.")
    sections: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for key, body in data.items():
        if key in TOP_LEVEL:
            continue
        number = _section_key(key)
        if number is None:
            raise CourseInputError(
                f"{path}: unknown section {key!r}: use 'common', 'runner', or a notebook's name such as "
                "'02_lightning_refactor' (or its number, '02')."
            )
        if number in sections:
            raise CourseInputError(f"{path}: two sections for lesson {number} ({names[number]!r} and {key!r}).")
        if body is not None and not isinstance(body, dict):
            raise CourseInputError(f"{path}: section {key!r} must be a mapping of NAME: value.")
        sections[number], names[number] = dict(body or {}), str(key)
    runner = data.get("runner") or {}
    if not isinstance(runner, dict) or set(runner) - set(RUNNER_KEYS):
        raise CourseInputError(f"{path}: 'runner' takes only {list(RUNNER_KEYS)}; found {runner!r}.")
    env = runner.get("env") or {}
    if not isinstance(env, dict):
        raise CourseInputError(f"{path}: runner.env must be a mapping of VARIABLE: value.")
    timeout = runner.get("cell_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise CourseInputError(f"{path}: runner.cell_timeout_s={timeout!r}: pass a positive number of seconds.")
    return ParamFile(
        path=path,
        common=common,
        sections=sections,
        section_names=names,
        kernel=str(runner.get("kernel", DEFAULT_KERNEL)),
        cell_timeout_s=timeout,
        env={str(k): os.path.expandvars(str(v)) for k, v in env.items() if v is not None},
        overrides=dict(overrides or {}),
    )


def notebook_parameters(params: ParamFile, notebook: Path, declared: Mapping[str, Declared]) -> dict[str, Any]:
    """What one notebook gets: the ``common`` names it declares, then its own section, then the overrides.

    Args:
        params: the parameter file.
        notebook: the notebook.
        declared: its declared parameters.

    Returns:
        The values by name, type-checked.

    Raises:
        CourseInputError: a section that names no parameter of it, a mismatched section name, or a bad value.
    """
    number = notebook.stem[:2]
    where = f"{params.path} -> {notebook.stem}"
    values = {name: value for name, value in params.common.items() if name in declared}
    section = params.sections.get(number, {})
    section_name = params.section_names.get(number)
    if section_name and _SECTION.match(section_name) and section_name != number and section_name != notebook.stem:
        raise CourseInputError(
            f"{params.path}: section {section_name!r} does not match the notebook {notebook.stem!r}: rename the "
            f"section to {notebook.stem!r}."
        )
    unknown = sorted(set(section) - set(declared))
    if unknown:
        raise CourseInputError(
            f"{where}: {', '.join(unknown)} {'is not a parameter' if len(unknown) == 1 else 'are not parameters'} "
            f"of this notebook; its parameters are {', '.join(declared)}."
        )
    values.update(section)
    values.update({name: value for name, value in params.overrides.items() if name in declared})
    return {name: check_value(where, declared[name], value) for name, value in values.items()}


def resolve_all(
    params: ParamFile, notebooks: Sequence[Path], all_notebooks: Sequence[Path] | None = None
) -> dict[Path, dict[str, Any]]:
    """Check ``params`` against the solutions and return each of ``notebooks``' parameters.

    ``all_notebooks`` (default: ``notebooks``) is the whole course: a ``common`` name must be declared by at least
    one of them, and a section must match one of them (or name a lesson that is absent: a warning).

    Args:
        params: the parameter file.
        notebooks: the notebooks to run.
        all_notebooks: every notebook of the course.

    Returns:
        Each of ``notebooks`` with its values.

    Raises:
        CourseInputError: a name no notebook declares, or a bad value (see :func:`notebook_parameters`).
    """
    everything = list(all_notebooks if all_notebooks is not None else notebooks)
    declared = {path: declared_parameters(path) for path in everything}
    known = {name for names in declared.values() for name in names}
    stray = sorted((set(params.common) | set(params.overrides)) - known)
    if stray:
        raise CourseInputError(
            f"{params.path}: common or -p parameter(s) {', '.join(stray)} are declared by no notebook in "
            f"{display_path(everything[0].parent) if everything else 'the solutions'}: check the spelling, or move "
            "them to the section of the notebook that will declare them."
        )
    numbers = {path.stem[:2] for path in everything}
    for number, name in params.section_names.items():
        if number not in numbers:
            warnings.warn(f"{params.path}: section {name!r}: no such notebook in the solutions; skipped.", stacklevel=2)
    return {path: notebook_parameters(params, path, declared[path]) for path in notebooks}


def select(notebooks: Sequence[Path], only: Sequence[str] | None, option: str = "--only") -> list[Path]:
    """The notebooks chosen with ``--only``.

    Args:
        notebooks: every notebook.
        only: name prefixes (``02`` or ``02_lightning``); None or empty: all.
        option: the command-line option they came from, for the message.

    Returns:
        The notebooks whose stem starts with one of ``only``, in order.

    Raises:
        CourseInputError: a prefix that matches no notebook.
    """
    if not only:
        return list(notebooks)
    chosen = [nb for nb in notebooks if any(nb.stem.startswith(prefix) for prefix in only)]
    missing = [prefix for prefix in only if not any(nb.stem.startswith(prefix) for nb in notebooks)]
    if missing:
        raise CourseInputError(
            f"{option} {' '.join(missing)}: no solution notebook starts with that; there are "
            f"{', '.join(nb.stem for nb in notebooks)}."
        )
    return chosen


@dataclass(frozen=True)
class Execution:
    """How a notebook's papermill run ended."""

    returncode: int | None
    timed_out: bool
    log_tail: str

    @property
    def failed(self) -> bool:
        """The run timed out or exited non-zero (a cell raised, the kernel died)."""
        return self.timed_out or self.returncode != 0


def papermill_command(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    parameters: Mapping[str, Any] | None = None,
    kernel: str = DEFAULT_KERNEL,
    cwd: str | os.PathLike | None = None,
    cell_timeout: float | None = None,
    prepare_only: bool = False,
) -> list[str]:
    """The command line that runs papermill on a notebook with this interpreter.

    Args:
        source: the notebook to run.
        output: where papermill writes the executed (or, with ``prepare_only``, parameterised) copy.
        parameters: values injected after the ``parameters`` cell (any YAML-representable values).
        kernel: the Jupyter kernel to run it in.
        cwd: the kernel's working directory (default: papermill's, the current one).
        cell_timeout: seconds a single cell may run (default: no limit).
        prepare_only: only inject the parameters, execute nothing.

    Returns:
        The command, for ``subprocess``.
    """
    command = [sys.executable, "-m", "papermill", str(source), str(output), "--kernel", kernel]
    if parameters:
        command += ["--parameters_yaml", json.dumps(dict(parameters))]
    if cwd is not None:
        command += ["--cwd", str(cwd)]
    if cell_timeout is not None:
        command += ["--execution-timeout", str(int(cell_timeout))]
    if prepare_only:
        command.append("--prepare-only")
    return [*command, "--no-progress-bar", "--log-level", "WARNING"]


def execute(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    parameters: Mapping[str, Any] | None = None,
    kernel: str = DEFAULT_KERNEL,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout: float | None = None,
    cell_timeout: float | None = None,
) -> Execution:
    """Run a notebook with papermill in a process of its own (see :func:`papermill_command`).

    A ``WORK_DIR`` parameter is also passed to the kernel as ``COURSE_WORK_DIR`` (unless ``env`` sets it), so
    that what the helpers start from the notebook uses the same folder. Past ``timeout`` the whole run, kernel
    included, is killed; papermill saves after every cell, so ``output`` then holds what ran.

    Args:
        source: the notebook to run.
        output: where the executed copy goes.
        parameters: values injected after the ``parameters`` cell.
        kernel: the Jupyter kernel.
        cwd: the kernel's working directory.
        env: environment variables added for the run; a None value removes that variable.
        timeout: seconds for the whole notebook (default: no limit).
        cell_timeout: seconds for one cell (default: no limit).

    Returns:
        How it ended, with the last 2000 characters of papermill's output.
    """
    extra = dict(env or {})
    work = (parameters or {}).get("WORK_DIR")
    if work is not None:
        extra.setdefault("COURSE_WORK_DIR", str(work))
    command = papermill_command(
        source, output, parameters=parameters, kernel=kernel, cwd=cwd, cell_timeout=cell_timeout
    )
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={name: value for name, value in {**os.environ, **extra}.items() if value is not None},
        start_new_session=True,  # the kernel and what it starts: one tree to kill
    ) as process:
        try:
            log, _ = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            log, _ = process.communicate()
            timed_out = True
    return Execution(process.returncode, timed_out, (log or "").strip()[-2000:])


def kernel_env(params: ParamFile) -> dict[str, str]:
    """The variables a notebook's kernel gets: the parameter file's ``runner.env``, and their names in
    ``COURSE_WORKER_ENV`` so that a cluster session hands them on to every executor (:func:`helpers.spark.worker_env`).

    Args:
        params: the loaded parameter file.

    Returns:
        The variables to add to the kernel's environment.
    """
    return {**params.env, "COURSE_WORKER_ENV": ",".join(params.env)}


def run(
    params_path: str | os.PathLike,
    out: str | os.PathLike = "build",
    only: Sequence[str] | None = None,
    solutions: str | os.PathLike = SOLUTIONS_DIR,
    overrides: Mapping[str, Any] | None = None,
    check_only: bool = False,
    keep_going: bool = False,
) -> int:
    """Check the parameters against the solutions, print them, then (unless ``check_only``) run the notebooks.

    Args:
        params_path: the parameter file.
        out: folder for the executed notebooks.
        only: run only the notebooks whose name starts with one of these (``02``, ``03_horovod``); all if empty.
        solutions: the solution notebooks' folder.
        overrides: values that win over the file, for every notebook that declares them.
        check_only: stop after checking and printing.
        keep_going: run the remaining notebooks after a failure.

    Returns:
        How many notebooks failed.

    Raises:
        CourseInputError: a bad parameter file, override, ``only`` prefix or solutions folder.
    """
    params = load_params(params_path, overrides)
    everything = solution_notebooks(Path(solutions))
    if not everything:
        raise CourseInputError(f"no solution notebooks in {display_path(Path(solutions))}")
    chosen = select(everything, only)
    resolved = resolve_all(params, chosen, everything)
    for notebook, values in resolved.items():
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items()) or "(defaults)"
        print(f"{notebook.stem}: {shown}")
    if check_only:
        return 0
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    ran = 0
    for notebook, values in resolved.items():
        ran += 1
        target = out_dir / notebook.name
        print(f"== {notebook.stem} -> {target}", flush=True)
        started = time.monotonic()
        result = execute(
            notebook, target, parameters=values, kernel=params.kernel, cwd=notebook.parent, env=kernel_env(params),
            cell_timeout=params.cell_timeout_s,
        )  # fmt: skip
        if result.failed:
            failed.append(notebook.stem)
            last = result.log_tail.splitlines()
            print(
                f"   FAILED after {time.monotonic() - started:.0f} s: {last[-1] if last else 'no output'}"
                f" (the executed notebook, up to the failing cell, is {target})",
                flush=True,
            )
            if not keep_going:
                break
        else:
            print(f"   ok in {time.monotonic() - started:.0f} s", flush=True)
    print(
        f"{ran - len(failed)} of {len(resolved)} notebooks ran without error; executed copies in {out_dir}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return len(failed)


def _override(text: str) -> tuple[str, Any]:
    import yaml

    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME=VALUE, e.g. MAX_EPOCHS=2")
    parsed = yaml.safe_load(value)
    if isinstance(parsed, str):  # 1e-5: a float to Python, a string to YAML 1.1
        try:
            parsed = float(parsed)
        except ValueError:
            pass
    return name.strip(), parsed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` subcommand's options (``python -m helpers.course run --help``).

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument("--params", required=True, help="parameter file (params/laptop.yaml, gpu_cluster.yaml, ...)")
    parser.add_argument("--out", default="build", help="folder for the executed notebooks (default build/)")
    parser.add_argument("--only", nargs="+", metavar="PREFIX", help="run only these notebooks: 02, 03_horovod, ...")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS_DIR, help="solution notebooks folder")
    parser.add_argument(
        "-p",
        "--set",
        dest="overrides",
        action="append",
        type=_override,
        default=[],
        metavar="NAME=VALUE",
        help="override a parameter in every notebook that declares it (value read as YAML)",
    )
    parser.add_argument("--check", action="store_true", help="check the parameters and print them; run nothing")
    parser.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")


def command(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand.

    Args:
        args: the options :func:`add_arguments` declared, parsed.

    Returns:
        The exit status: 0, or 1 if a notebook failed.

    Raises:
        CourseInputError: see :func:`run`.
    """
    failed = run(args.params, args.out, args.only, args.solutions, dict(args.overrides), args.check, args.keep_going)
    return 1 if failed else 0
