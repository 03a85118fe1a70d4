"""Image folders (one sub-folder of images per class, like tf_flowers' ``flower_photos``): the embedded digits,
the instructors' tf_flowers download, and the check of a folder. Class names come from the folder names."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from helpers import CourseInputError
from helpers.workdir import work_dir

__all__ = ["IMAGE_EXTENSIONS", "class_folders", "download_tf_flowers", "embedded_digits", "resolve_data_dir"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
TF_FLOWERS_URL = "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
_DONE_MARKER = ".complete"


def embedded_digits(work: str | os.PathLike | None = None) -> Path:
    """Write scikit-learn's bundled 8x8 digits (1,797 images, 10 classes) as PNG files, once, and return the folder.

    The folder holds ``digit_0`` ... ``digit_9``, one grayscale PNG per image, the same layout as tf_flowers.
    It is written to a temporary folder and renamed into place, so an interrupted run leaves nothing half-written.

    Args:
        work: the work directory (default: :func:`~helpers.workdir.work_dir`).

    Returns:
        ``<work>/data/digits``.
    """
    target = work_dir(work) / "data" / "digits"
    if (target / _DONE_MARKER).exists():
        return target
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".digits-", dir=target.parent))
    for index, (image, label) in enumerate(zip(digits.images, digits.target)):
        class_dir = staging / f"digit_{label}"
        class_dir.mkdir(exist_ok=True)
        pixels = (image * (255.0 / 16.0)).round().astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(class_dir / f"{index:04d}.png")
    (staging / _DONE_MARKER).touch()
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def resolve_data_dir(data_dir: str | os.PathLike | None, work: str | os.PathLike | None = None) -> Path:
    """The image folder a notebook's ``DATA_DIR`` names.

    Args:
        data_dir: an image folder, or None for the embedded digits.
        work: the work directory the digits go under.

    Returns:
        The folder, resolved (not checked: see :func:`class_folders`).
    """
    return embedded_digits(work) if data_dir is None else Path(data_dir).expanduser().resolve()


def class_folders(data_dir: str | os.PathLike) -> list[str]:
    """Check an image folder and return its class names.

    Args:
        data_dir: the image folder.

    Returns:
        The names of the sub-folders that hold images, sorted (the order that defines label indices).

    Raises:
        CourseInputError: the folder is missing, or holds fewer than two classes with images.
    """
    root = Path(data_dir)
    hint = "point DATA_DIR at a folder with one sub-folder of images per class (or None for the embedded digits)"
    if not root.is_dir():
        raise CourseInputError(f"DATA_DIR '{root}' does not exist or is not a folder: {hint}.")
    classes = sorted(
        child.name
        for child in root.iterdir()
        if child.is_dir()
        and not child.name.startswith(".")
        and any(f.suffix.lower() in IMAGE_EXTENSIONS for f in child.iterdir() if f.is_file())
    )
    if not classes:
        raise CourseInputError(f"DATA_DIR '{root}' has no class sub-folders with .jpg/.jpeg/.png images: {hint}.")
    if len(classes) < 2:
        raise CourseInputError(
            f"DATA_DIR '{root}' has only one class ('{classes[0]}'): a classifier needs at least two class folders."
        )
    return classes


def download_tf_flowers(dest: str | os.PathLike | None = None, url: str = TF_FLOWERS_URL) -> Path:
    """Download and unpack tf_flowers (3,670 JPEGs in 5 class folders), for instructors; needs internet access.

    Unpacks into a temporary folder first, so nothing is half-written; a second call reuses the folder.

    Args:
        dest: the folder to unpack into (default: the work directory's ``data``); on a cluster, shared storage
            such as ``/dbfs/...``.
        url: the archive to download.

    Returns:
        ``<dest>/flower_photos``.
    """
    dest_dir = Path(dest) if dest else work_dir() / "data"
    target = dest_dir / "flower_photos"
    if (target / _DONE_MARKER).exists():
        return target
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        archive = Path(tmp) / "flower_photos.tgz"
        urllib.request.urlretrieve(url, archive)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = Path(tmp) / "flower_photos"
        (unpacked / _DONE_MARKER).touch()
        if target.exists():
            shutil.rmtree(target)
        unpacked.rename(target)
    return target


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Download tf_flowers for the course (instructors; needs internet).")
    parser.add_argument("--dest", help="folder to unpack into (default: the work directory's data/)")
    print(download_tf_flowers(parser.parse_args().dest))
