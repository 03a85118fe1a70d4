"""The one folder all files the course writes go under: tables, caches, checkpoints, the MLflow store.

``work/`` in the repository by default; ``COURSE_WORK_DIR`` overrides it (a shared file system on a cluster).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "REPO_ROOT", "use_work_dir", "work_dir", "work_path"]

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "COURSE_WORK_DIR"


def work_dir(override: str | os.PathLike | None = None) -> Path:
    """Return the course's work directory (created if needed).

    Args:
        override: a notebook's ``WORK_DIR`` parameter; it wins over ``COURSE_WORK_DIR``, which wins over ``work/``.

    Returns:
        The folder, resolved.
    """
    chosen = override or os.environ.get(ENV_VAR) or REPO_ROOT / "work"
    path = Path(chosen).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def work_path(*parts: str, override: str | os.PathLike | None = None) -> Path:
    """A path under the work directory, e.g. ``work_path("lake", "images")``; its parent folders are created.

    Args:
        parts: the path's parts below the work directory.
        override: as for :func:`work_dir`.

    Returns:
        The path (itself not created).
    """
    path = work_dir(override).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def use_work_dir(override: str | os.PathLike | None = None) -> Path:
    """Make ``override`` the work directory for this process and the processes it starts (Spark workers, ranks).

    Args:
        override: a notebook's ``WORK_DIR`` parameter; None keeps the work directory as it is.

    Returns:
        The work directory in use.
    """
    if override:
        os.environ[ENV_VAR] = str(Path(override).expanduser().resolve())
    return work_dir()
