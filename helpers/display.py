"""What the notebooks show: sample images, class balance, loss curves, and the source of a helper."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import pandas as pd

__all__ = ["class_distribution", "loss_curves", "show_samples", "show_source"]


def show_samples(df, class_names: list[str], per_class: int = 4, seed: int = 0):
    """A grid of sample images, one column per class.

    Args:
        df: a lake DataFrame (``path``, ``label``, ``content``).
        class_names: the classes, in column order.
        per_class: images per class (rows).
        seed: which images are picked.

    Returns:
        The matplotlib figure.
    """
    from PIL import Image
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy("label").orderBy(F.xxhash64("path", F.lit(seed)))
    rows = (
        df.withColumn("_n", F.row_number().over(window))
        .where(F.col("_n") <= per_class)
        .select("label", "content")
        .collect()
    )
    fig, axes = plt.subplots(
        per_class, len(class_names), figsize=(1.3 * len(class_names), 1.3 * per_class), squeeze=False
    )
    for ax in axes.flat:
        ax.axis("off")
    filled = {name: 0 for name in class_names}
    for row in rows:
        col = class_names.index(row["label"])
        ax = axes[filled[row["label"]], col]
        with Image.open(io.BytesIO(row["content"])) as image:
            ax.imshow(image.convert("RGB"), interpolation="nearest")
        filled[row["label"]] += 1
    for col, name in enumerate(class_names):
        axes[0, col].set_title(name, fontsize=9)
    fig.tight_layout()
    return fig


def class_distribution(df):
    """A bar chart of images per class.

    Args:
        df: a DataFrame with a ``label`` column.

    Returns:
        The number of rows per label (a pandas Series, sorted by label).
    """
    counts = df.groupBy("label").count().toPandas().set_index("label")["count"].sort_index()
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(counts)), 2.8))
    counts.plot.bar(ax=ax, color="tab:blue")
    ax.set_ylabel("images")
    ax.set_xlabel("")
    ax.set_title("Images per class")
    fig.tight_layout()
    return counts


def loss_curves(history: pd.DataFrame, title: str = "Loss per epoch"):
    """A line plot of losses per epoch.

    Args:
        history: a DataFrame indexed by epoch with one column per curve (e.g. ``train_loss``, ``val_loss``).
        title: the plot's title.

    Returns:
        The matplotlib figure.
    """
    fig, ax = plt.subplots(figsize=(5, 3))
    history.plot(ax=ax, marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def show_source(obj) -> None:
    """Show the source code of a helper function or class in the notebook, syntax-highlighted.

    Args:
        obj: a function, class or module.
    """
    import inspect

    from IPython.display import Code, display

    display(Code(inspect.getsource(obj), language="python"))
