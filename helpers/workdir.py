"""The one folder all files the course writes go under: tables, caches, checkpoints, the MLflow store.

``work/`` in the repository by default; ``COURSE_WORK_DIR`` overrides it (a shared file system on a cluster).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "COURSE_WORK_DIR"


def work_dir(override: str | os.PathLike | None = None) -> Path:
    """Return the course's work directory (created if needed).

    ``override`` (a notebook's ``WORK_DIR`` parameter) wins over ``COURSE_WORK_DIR``, which wins over ``work/``.
    """
    chosen = override or os.environ.get(ENV_VAR) or REPO_ROOT / "work"
    path = Path(chosen).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def work_path(*parts: str, override: str | os.PathLike | None = None) -> Path:
    """A path under the work directory, e.g. ``work_path("lake", "images")``; parent folders are created."""
    path = work_dir(override).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def use_work_dir(override: str | os.PathLike | None = None) -> Path:
    """Make ``override`` (a notebook's ``WORK_DIR`` parameter, if not None) the work directory for this process
    and the processes it starts (Spark workers, Horovod ranks), and return the work directory in use."""
    if override:
        os.environ[ENV_VAR] = str(Path(override).expanduser().resolve())
    return work_dir()
