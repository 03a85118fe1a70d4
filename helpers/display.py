"""What the notebooks show: sample images, class balance, loss curves, and the source of a helper."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import pandas as pd


def show_samples(df, class_names: list[str], per_class: int = 4, seed: int = 0):
    """A grid of ``per_class`` images for each class, from a lake DataFrame (path, label, content)."""
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
    """A bar chart of images per class, from a DataFrame with a ``label`` column; returns the counts too."""
    counts = df.groupBy("label").count().toPandas().set_index("label")["count"].sort_index()
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(counts)), 2.8))
    counts.plot.bar(ax=ax, color="tab:blue")
    ax.set_ylabel("images")
    ax.set_xlabel("")
    ax.set_title("Images per class")
    fig.tight_layout()
    return counts


def loss_curves(history: pd.DataFrame, title: str = "Loss per epoch"):
    """Line plot of a DataFrame indexed by epoch with one column per curve (e.g. train_loss, val_loss)."""
    fig, ax = plt.subplots(figsize=(5, 3))
    history.plot(ax=ax, marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def show_source(obj) -> None:
    """Show the source code of a helper function or class in the notebook, syntax-highlighted."""
    import inspect

    from IPython.display import Code, display

    display(Code(inspect.getsource(obj), language="python"))
