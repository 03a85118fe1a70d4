"""Builders of small image folders in tmp paths for tests: other classes, sizes, formats, and broken files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def make_image_folder(
    root: Path, classes: dict[str, int], size=(20, 14), fmt: str = "JPEG", mode: str = "RGB", seed: int = 0
) -> Path:
    """Write ``classes[name]`` random images per class folder under ``root``; returns ``root``."""
    rng = np.random.default_rng(seed)
    suffix = ".jpg" if fmt == "JPEG" else ".png"
    channels = 3 if mode == "RGB" else 1
    for class_index, (name, count) in enumerate(classes.items()):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            base = np.full((size[1], size[0], channels), 40 * class_index, dtype=np.uint8)
            pixels = np.clip(base + rng.integers(0, 40, base.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels.squeeze(), mode=mode).save(folder / f"img_{i:03d}{suffix}", format=fmt)
    return root
