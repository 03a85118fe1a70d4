"""The package's two halves: the domain (``helpers``, what the notebooks teach with) never imports the course's
tooling (``helpers.course``), and no helpers module imports itself through others (no import cycle).

Imports are read with ``ast`` from every file, including those inside functions, and ``importlib.import_module`` /
``__import__`` calls with a literal name. Each rule is also run on a small package written by the test that breaks
it, so a scanner that finds nothing fails here.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from helpers.workdir import REPO_ROOT

TOOLING = "helpers.course"


def module_name(path: Path, root: Path) -> str:
    """``helpers/course/run.py`` -> ``helpers.course.run``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_names(path: Path, module: str) -> set[str]:
    """Every module name ``path`` may import, anywhere in the file: ``import a.b`` gives ``a.b``; ``from a import
    b`` gives ``a`` and ``a.b`` (``b`` may be a module); a literal ``import_module("a.b")`` gives ``a.b``."""
    names: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """For every module of ``package`` (a folder under ``root``), the modules of that package it imports."""
    files = {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
    return {
        module: {name for name in imported_names(path, module) if name in files and name != module}
        for module, path in files.items()
    }


def tooling_imports(graph: dict[str, set[str]], tooling: str) -> list[str]:
    """``"domain.module -> tooling.module"`` for every import of ``tooling`` from a module outside it."""
    inside = (tooling, f"{tooling}.")
    return sorted(
        f"{module} -> {name}"
        for module, names in graph.items()
        if not module.startswith(inside) and module != tooling
        for name in names
        if name.startswith(inside) or name == tooling
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``, each as the modules along it (the first repeated at the end)."""
    found: list[list[str]] = []
    state: dict[str, str] = {}  # "active" while on the current path, "done" once fully explored

    def visit(module: str, path: list[str]) -> None:
        state[module] = "active"
        for name in sorted(graph.get(module, ())):
            if state.get(name) == "active":
                found.append([*path[path.index(name) :], name])
            elif name not in state:
                visit(name, [*path, name])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


@pytest.fixture(scope="module")
def helpers_graph() -> dict[str, set[str]]:
    graph = import_graph(REPO_ROOT, "helpers")
    assert TOOLING in graph and "helpers.cluster" in graph  # the scan saw both halves
    return graph


def test_the_domain_never_imports_the_tooling(helpers_graph):
    assert tooling_imports(helpers_graph, TOOLING) == []


def test_the_tooling_uses_the_domain(helpers_graph):
    """The scan reads real imports: the grader imports the checks, the checks import domain modules."""
    assert "helpers.course.checks" in helpers_graph["helpers.course.grade"]
    assert any(not name.startswith(TOOLING) for name in helpers_graph["helpers.course.checks.lesson1"])


def test_no_import_cycle_among_helpers_modules(helpers_graph):
    assert cycles(helpers_graph) == []


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


def test_the_scanner_reports_a_domain_module_that_imports_the_tooling(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/course/__init__.py": "",
            "pkg/course/grade.py": "from pkg import lake\n",
            "pkg/lake.py": "def f():\n    from .course import grade\n    return grade\n",
            "pkg/loaders.py": "import importlib\n\nmod = importlib.import_module('pkg.course')\n",
            "pkg/data.py": "import os\n",
        },
    )
    assert tooling_imports(import_graph(tmp_path, "pkg"), "pkg.course") == [
        "pkg.lake -> pkg.course",
        "pkg.lake -> pkg.course.grade",
        "pkg.loaders -> pkg.course",
    ]


def test_the_scanner_reports_an_import_cycle(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import g\n",
            "pkg/b.py": "def g():\n    import pkg.c\n",
            "pkg/c.py": "from . import a\n",
            "pkg/d.py": "from pkg import a\n",
        },
    )
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
