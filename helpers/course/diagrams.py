"""The lessons' diagrams, drawn with matplotlib: one figure per lesson, the single source of the pictures.

Every diagram is a function that draws on a fresh figure whose coordinates are inches from the bottom left corner.
Texts that belong in a box carry the box's gid (``box:<n>``), so a test can check that they stay inside it; no two
texts may overlap. :mod:`helpers.course.pages` renders them to PNG and embeds them in the solution notebooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

__all__ = ["DIAGRAMS", "DPI", "Diagram"]

DPI = 110
FONT = 10
# light fills with a darker edge of the same hue (Okabe-Ito based, readable for colour-blind readers)
BLUE, BLUE_EDGE = "#d6e6f5", "#2b6ca3"
ORANGE, ORANGE_EDGE = "#fbe0c3", "#c66a00"
GREEN, GREEN_EDGE = "#d4eed9", "#1d7a3a"
PURPLE, PURPLE_EDGE = "#e6dcf0", "#6a4c93"
GREY, GREY_EDGE = "#f0f0f0", "#7a7a7a"
INK = "#222222"


@dataclass(frozen=True)
class Diagram:
    """One lesson's diagram: ``name`` (the attachment's file stem), the ``lesson`` it belongs to (notebook stem),
    ``alt`` (the text a screen reader says, and the markdown image's alt text), and ``draw``."""

    name: str
    lesson: str
    alt: str
    draw: Callable[[], Figure]


def _canvas(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure ``width`` x ``height`` inches with one axes in inch coordinates and no frame (no pyplot: drawing
    a diagram never changes a notebook's plotting backend)."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def _box(ax, x, y, w, h, text="", fill=GREY, edge=GREY_EDGE, size=FONT, title=None, mono=False, align="center"):
    """A rounded box with ``title`` (bold, on top when there is ``text``) and ``text``; returns its gid."""
    gid = f"box:{len(ax.patches)}"
    patch = FancyBboxPatch(
        (x, y), w, h, boxstyle="round,pad=0,rounding_size=0.08", facecolor=fill, edgecolor=edge, linewidth=1.2
    )
    patch.set_gid(gid)
    ax.add_patch(patch)
    family = "monospace" if mono else "sans-serif"
    cx = x + w / 2 if align == "center" else x + 0.12
    if title and text:
        ax.text(cx, y + h - 0.1, title, ha=align, va="top", fontsize=size, weight="bold", color=INK, gid=gid)
        ax.text(
            cx,
            y + (h - 0.32) / 2,
            text,
            ha=align,
            va="center",
            fontsize=size - 1,
            color=INK,
            gid=gid,
            family=family,
            linespacing=1.3,
        )
    else:
        ax.text(
            cx,
            y + h / 2,
            title or text,
            ha=align,
            va="center",
            fontsize=size,
            color=INK,
            gid=gid,
            weight="bold" if title else "normal",
            family=family,
            linespacing=1.3,
        )
    return gid


def _arrow(ax, start, end, color=INK, both=False, width=1.3, rad=0.0):
    """An arrow from ``start`` to ``end`` (points in inches)."""
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="<|-|>" if both else "-|>",
            mutation_scale=12,
            color=color,
            linewidth=width,
            connectionstyle=f"arc3,rad={rad}",
            shrinkA=0,
            shrinkB=0,
        )
    )


def _label(ax, x, y, text, size=FONT, **kwargs):
    """Free text (not in a box)."""
    ax.text(x, y, text, fontsize=size, color=kwargs.pop("color", INK), **kwargs)


def course_stack() -> Figure:
    """Lesson 0: the tools of the course in the order data flows through them, and what lesson 0 checks."""
    fig, ax = _canvas(10.2, 2.5)
    stages = [
        ("Image files", "one folder\nper class", "lesson 1", True),
        ("Spark + Delta", "a versioned\nlake table", "lesson 1", True),
        ("Petastorm", "tensors, one\nshard per device", "lesson 1", False),
        ("Lightning", "model, data\nand Trainer", "lesson 2", False),
        ("Horovod or\nTorchDistributor", "n processes,\none per device", "lessons 3, 4", True),
        ("MLflow", "runs, metrics,\nmodels", "lessons 2-5", True),
    ]
    width, gap, y = 1.4, 0.28, 0.75
    for index, (title, text, lessons, checked) in enumerate(stages):
        x = 0.15 + index * (width + gap)
        fill, edge = (GREEN, GREEN_EDGE) if checked else (GREY, GREY_EDGE)
        _box(ax, x, y, width, 1.15, text, fill, edge, title=title, size=9.5)
        _label(ax, x + width / 2, y - 0.25, lessons, size=9, ha="center", va="center", color="#555555")
        if index:
            _arrow(ax, (x - gap + 0.03, y + 0.57), (x - 0.03, y + 0.57))
    ax.add_patch(Rectangle((0.2, 2.1), 0.22, 0.22, facecolor=GREEN, edgecolor=GREEN_EDGE))
    _label(
        ax,
        0.52,
        2.21,
        "checked by lesson 0: the data, a Spark session, a 2-process Horovod allreduce and an MLflow run",
        size=9.5,
        va="center",
    )
    return fig


def data_path() -> Figure:
    """Lesson 1: files -> binaryFile -> Delta versions -> split -> Parquet cache -> one shard per worker."""
    fig, ax = _canvas(10.2, 4.5)
    stages = [
        ("Image files", "digits/0/*.png\ndigits/1/*.png ...", GREY, GREY_EDGE),
        ("Spark binaryFile", "one row per file:\npath, bytes", BLUE, BLUE_EDGE),
        ("Delta table", "v0 ingest, v1 bad write,\nv2 restore: time travel", PURPLE, PURPLE_EDGE),
        ("Stratified split", "every class in train\nand in validation", BLUE, BLUE_EDGE),
        ("Parquet cache", "make_spark_converter:\n2 files per device", ORANGE, ORANGE_EDGE),
    ]
    width, gap, y = 1.78, 0.27, 2.95
    for index, (title, text, fill, edge) in enumerate(stages):
        x = 0.15 + index * (width + gap)
        _box(ax, x, y, width, 1.2, text, fill, edge, title=title, size=9.5)
        if index:
            _arrow(ax, (x - gap + 0.03, y + 0.6), (x - 0.03, y + 0.6))
    _label(
        ax,
        0.15,
        4.3,
        "Bytes stay encoded (PNG/JPEG) until the loader's TransformSpec decodes them on the worker.",
        size=9.5,
        va="center",
        style="italic",
    )
    shard_fill = [(BLUE, BLUE_EDGE), (GREEN, GREEN_EDGE)]
    cache_x = 0.15 + 4 * (width + gap) + width / 2
    files_left = 4.6
    for index in range(4):
        fill, edge = shard_fill[index % 2]
        x = files_left + index * 1.3
        _box(ax, x, 1.65, 1.05, 0.55, f"part {index}", fill, edge, size=9)
        _arrow(ax, (cache_x, y - 0.03), (x + 0.52, 2.23), color="#888888", width=1.0)
    for worker in range(2):
        fill, edge = shard_fill[worker]
        x = files_left + 0.25 + worker * 2.6
        _box(
            ax, x, 0.2, 2.15, 0.85, f"cur_shard={worker}, shard_count=2", fill, edge, title=f"worker {worker}", size=9.5
        )
        for part in (worker, worker + 2):
            _arrow(ax, (files_left + part * 1.3 + 0.52, 1.62), (x + 1.07, 1.08), color=edge, width=1.0)
    _label(
        ax,
        0.15,
        1.3,
        "make_torch_dataloader(cur_shard=k, shard_count=N):\nworker k reads only its own row "
        "groups.\nFewer files than workers: a worker gets nothing.",
        size=9.5,
        va="center",
        linespacing=1.4,
    )
    return fig


def lightning_split() -> Figure:
    """Lesson 2: which lines of the plain loop you keep writing, and which Lightning's Trainer takes over."""
    fig, ax = _canvas(10.2, 4.4)
    model, data, trainer = (GREEN, GREEN_EDGE), (BLUE, BLUE_EDGE), (ORANGE, ORANGE_EDGE)
    lines = [
        ("optimizer = SGD(params, lr, momentum)", model),
        ("for epoch in range(max_epochs):", trainer),
        ("    for batch in train_loader:", data),
        ("        x, y = batch.to(device)", trainer),
        ("        loss = cross_entropy(net(x), y)", model),
        ("        optimizer.zero_grad()", trainer),
        ("        loss.backward(); optimizer.step()", trainer),
        ("    for batch in val_loader: ... log", data),
        ("    if no better for patience: break", trainer),
        ("    torch.save(checkpoint)", trainer),
    ]
    _label(ax, 0.15, 4.15, "The plain PyTorch loop", size=10.5, weight="bold", va="center")
    for index, (line, (fill, edge)) in enumerate(lines):
        top = 3.8 - index * 0.36
        ax.add_patch(Rectangle((0.15, top - 0.3), 4.6, 0.3, facecolor=fill, edgecolor="none"))
        ax.add_patch(Rectangle((0.15, top - 0.3), 0.07, 0.3, facecolor=edge, edgecolor="none"))
        _label(ax, 0.32, top - 0.15, line, size=9.5, va="center", family="monospace")
    _label(ax, 5.2, 4.15, "Where each part goes", size=10.5, weight="bold", va="center")
    parts = [
        (
            "You write: LightningModule",
            "training_step, validation_step (the loss and\nwhat to log), configure_optimizers",
            model,
            1.0,
        ),
        (
            "You write: LightningDataModule",
            "train_dataloader, val_dataloader:\nthe loaders of this device's shard",
            data,
            1.0,
        ),
        (
            "Lightning's Trainer does the rest",
            "the loops, moving batches to the device, zero_grad,\nbackward, step, "
            "logging; callbacks: EarlyStopping,\nModelCheckpoint (and resume); several devices\nthrough a strategy "
            "(DDP, Horovod)",
            trainer,
            1.42,
        ),
    ]
    top = 3.85
    for title, text, (fill, edge), height in parts:
        _box(ax, 5.2, top - height, 4.85, height, text, fill, edge, title=title, size=9.5, align="left")
        top -= height + 0.17
    return fig


def allreduce_step() -> Figure:
    """Lesson 3: one data-parallel step on 3 ranks: broadcast once, own shard, gradients, allreduce, same step."""
    fig, ax = _canvas(10.2, 5.8)
    columns, width = [3.0, 5.6, 8.2], 2.1
    step = "$W \\leftarrow W - lr \\cdot n \\cdot \\bar{g}$\nsame W on every rank"
    rows = [  # bottom y, height, row label, box text of rank r, fill
        (4.3, 0.6, "start (once):\nbroadcast\nfrom rank 0", lambda r: "weights W", (GREY, GREY_EDGE)),
        (3.35, 0.6, "read", lambda r: f"a batch of shard {r}", (GREY, GREY_EDGE)),
        (2.4, 0.6, "forward, backward", lambda r: f"gradient $g_{r}$", (GREY, GREY_EDGE)),
        (0.5, 0.8, "optimizer step", lambda r: step, (GREEN, GREEN_EDGE)),
    ]
    for rank, x in enumerate(columns):
        _label(ax, x, 5.55, f"rank {rank}", size=10.5, weight="bold", ha="center", va="center")
    for y, height, name, text, (fill, edge) in rows:
        _label(ax, 0.15, y + 0.3, name, size=9.5, va="center", color="#555555")
        for rank, x in enumerate(columns):
            first = y == rows[0][0] and rank == 0
            _box(
                ax,
                x - width / 2,
                y,
                width,
                height,
                text(rank),
                *((PURPLE, PURPLE_EDGE) if first else (fill, edge)),
                size=9.5,
            )
    _arrow(ax, (columns[0] + width / 2 + 0.02, 4.6), (columns[1] - width / 2 - 0.02, 4.6), color=PURPLE_EDGE)
    _arrow(ax, (columns[0] + 0.2, 4.92), (columns[2] - 0.2, 4.92), color=PURPLE_EDGE, rad=-0.12)
    for x in columns:
        _arrow(ax, (x, 4.28), (x, 3.97), color="#888888", width=1.0)
        _arrow(ax, (x, 3.33), (x, 3.02), color="#888888", width=1.0)
        _arrow(ax, (x, 2.38), (x, 2.07), color=ORANGE_EDGE, width=1.0)
        _arrow(ax, (x, 1.43), (x, 1.32), color=ORANGE_EDGE, width=1.0)
    _label(ax, 0.15, 1.75, "average", size=9.5, va="center", color="#555555")
    _box(
        ax,
        columns[0] - width / 2,
        1.45,
        columns[2] - columns[0] + width,
        0.6,
        "allreduce: every rank receives $\\bar{g}$ = ($g_0$ + $g_1$ + $g_2$) / 3",
        ORANGE,
        ORANGE_EDGE,
        size=10,
    )
    return fig


def _worker_column(ax, x, y, worker, lines, fill, edge):
    """A worker box holding an executor box holding a task box with the training process's ``lines``."""
    _box(ax, x, y, 2.25, 2.2, "", GREY, GREY_EDGE)
    _label(ax, x + 0.12, y + 2.02, f"worker {worker + 1}", size=9, weight="bold", va="center", gid=None)
    _box(ax, x + 0.12, y + 0.12, 2.01, 1.7, "", "#ffffff", GREY_EDGE)
    _label(ax, x + 0.24, y + 1.64, "executor", size=9, va="center", color="#555555")
    _box(ax, x + 0.24, y + 0.24, 1.77, 1.2, lines, fill, edge, title=f"task {worker}", size=9)


def launchers() -> Figure:
    """Lesson 4: Horovod on Spark and TorchDistributor side by side: driver, executors, tasks, processes."""
    fig, ax = _canvas(10.2, 5.0)
    panels = [
        (
            0.1,
            "Horovod on Spark",
            "HorovodRunner(np=2).run(train_hvd)",
            "Spark job: 2 tasks",
            "train_hvd\nhvd.init(): rank {r}",
            "Horovod allreduce\n(Gloo / NCCL)",
            BLUE,
            BLUE_EDGE,
        ),
        (
            5.2,
            "TorchDistributor",
            "TorchDistributor(num_processes=2,\nlocal_mode=False).run(ddp_train)",
            "barrier stage: 2 tasks start together",
            "torchrun -> ddp_train\nRANK={r} from os.environ",
            "DDP allreduce\n(Gloo / NCCL)",
            ORANGE,
            ORANGE_EDGE,
        ),
    ]
    for left, title, call, job, process, link, fill, edge in panels:
        _label(ax, left + 2.45, 4.75, title, size=11, weight="bold", ha="center", va="center")
        _box(ax, left + 0.45, 3.55, 4.0, 0.9, call, "#ffffff", INK, title="driver (this notebook)", size=9, mono=True)
        _label(ax, left + 2.45, 3.22, job, size=9, ha="center", va="center", style="italic")
        for worker in range(2):
            x = left + worker * 2.65
            _worker_column(ax, x, 0.55, worker, process.format(r=worker), fill, edge)
            _arrow(ax, (left + 2.45 + (worker - 0.5) * 1.2, 3.5), (x + 1.12, 2.8), color=INK, width=1.1)
        _arrow(ax, (left + 2.03, 1.15), (left + 2.86, 1.15), color=edge, both=True, width=1.6)
        _label(ax, left + 2.45, 0.28, link, size=9, ha="center", va="center", color=edge, linespacing=1.2)
    ax.plot([5.1, 5.1], [0.1, 4.9], color="#bbbbbb", linewidth=1)
    return fig


def epoch_pitfall() -> Figure:
    """Lesson 5: how much data one "epoch" reads on n devices: one pass, or n x n passes with fixed steps."""
    fig, ax = _canvas(10.2, 4.9)
    unit, left = 0.44, 1.5
    device_fill = [BLUE, ORANGE, GREEN, PURPLE]
    device_edge = [BLUE_EDGE, ORANGE_EDGE, GREEN_EDGE, PURPLE_EDGE]
    panels = [
        (4.55, "One pass per epoch (the course): batch b per device, ceil(rows / (b x n)) steps", False),
        (2.35, "Fixed steps per epoch (the pitfall): batch b x n per device, ceil(rows / b) steps", True),
    ]
    for top, title, fixed in panels:
        _label(ax, 0.15, top, title, size=10, weight="bold", va="center")
        for row, devices in enumerate((1, 2, 4)):
            y = top - 0.55 - row * 0.55
            _label(ax, 0.15, y + 0.16, f"{devices} device{'s' if devices > 1 else ''}", size=9.5, va="center")
            passes = devices * devices if fixed else 1
            for index in range(passes):  # one block per pass; on one pass, one stripe per device's shard
                stripes = 1 if fixed else devices
                for part in range(stripes):
                    fill, edge = (ORANGE, ORANGE_EDGE) if fixed else (device_fill[part], device_edge[part])
                    width = unit / stripes
                    ax.add_patch(
                        Rectangle((left + index * unit + part * width, y), width, 0.32, facecolor=fill, edgecolor=edge)
                    )
            end = left + passes * unit + 0.12
            words = f"{passes} pass{'es' if passes > 1 else ''} of the data"
            _label(ax, end, y + 0.16, words, size=9.5, va="center")
    _label(
        ax,
        0.15,
        0.25,
        "Early stopping counts epochs: with fixed steps, 4 devices train on 16 times more data between two checks.",
        size=9.5,
        va="center",
        style="italic",
    )
    return fig


def zero_stages() -> Figure:
    """Lesson 6: what each ZeRO stage keeps on each of 4 devices (the ZeRO paper's figure 1), and the paper's sums."""
    fig, ax = _canvas(10.2, 4.7)
    kinds = [(2, 3, BLUE, BLUE_EDGE), (2, 2, ORANGE, ORANGE_EDGE), (12, 1, GREEN, GREEN_EDGE)]  # bytes, split from
    legend = [
        "parameters (2 bytes each)",
        "gradients (2 bytes)",
        "optimizer states (K = 12 bytes: fp32 copy, momentum, variance)",
    ]
    x = 0.15
    for text, (_, _, fill, edge) in zip(legend, kinds, strict=True):
        ax.add_patch(Rectangle((x, 4.38), 0.22, 0.2, facecolor=fill, edgecolor=edge))
        _label(ax, x + 0.3, 4.48, text, size=9.5, va="center")
        x += 0.55 + 0.075 * len(text)
    rows = [
        ("stage 0: plain\ndata parallelism", "16Ψ = 120 GB"),
        ("stage 1: optimizer\nstates split", "4Ψ + 12Ψ/N = 31.4 GB"),
        ("stage 2: and the\ngradients", "2Ψ + 14Ψ/N = 16.6 GB"),
        ("stage 3: and the\nparameters", "16Ψ/N = 1.9 GB"),
    ]
    unit, left, devices, pitch = 0.08, 1.95, 4, 1.45
    for device in range(devices):
        _label(ax, left + device * pitch + 8 * unit, 3.95, f"device {device}", size=9.5, ha="center", va="center")
    _label(ax, 7.85, 3.95, "per device, Ψ = 7.5 B, N = 64", size=9.5, va="center", weight="bold")
    for stage, (name, total) in enumerate(rows):
        y = 3.25 - stage * 0.78
        _label(ax, 0.15, y + 0.15, name, size=9.5, va="center", linespacing=1.2)
        _label(ax, 7.85, y + 0.15, total, size=10, va="center")
        for device in range(devices):
            start = left + device * pitch
            for size, split_from, fill, edge in kinds:
                split = stage >= split_from
                width = size * unit
                ax.add_patch(Rectangle((start, y), width, 0.3, facecolor="#ffffff", edgecolor=GREY_EDGE, lw=0.6))
                share = width / devices if split else width
                offset = device * share if split else 0
                ax.add_patch(Rectangle((start + offset, y), share, 0.3, facecolor=fill, edgecolor=edge, lw=0.8))
                start += width
    _label(
        ax,
        0.15,
        0.3,
        "White: the part another device holds. Each device keeps 1/N of what its stage splits "
        "(mixed-precision Adam, the ZeRO paper's example).",
        size=9.5,
        va="center",
        style="italic",
    )
    return fig


DIAGRAMS: tuple[Diagram, ...] = (
    Diagram(
        "course_stack",
        "00_environment_check",
        "The course's tools in the order the data flows through them: image files, Spark and Delta, Petastorm, "
        "Lightning, Horovod or TorchDistributor, MLflow; lesson 0 checks the data, Spark, Horovod and MLflow.",
        course_stack,
    ),
    Diagram(
        "data_path",
        "01_data_lake_petastorm",
        "The data path: image files, read by Spark's binaryFile source, written as Delta table versions, split "
        "per class, cached as Parquet files by Petastorm, and each worker reads its own shard of the files.",
        data_path,
    ),
    Diagram(
        "lightning_split",
        "02_lightning_refactor",
        "The plain PyTorch loop line by line, coloured by where each line goes: the LightningModule, the "
        "LightningDataModule, or Lightning's Trainer and its callbacks.",
        lightning_split,
    ),
    Diagram(
        "allreduce_step",
        "03_horovod_single_node",
        "One data-parallel step on three ranks: rank 0 broadcasts the weights once, each rank reads a batch of "
        "its own shard and computes its gradient, allreduce gives every rank the average gradient, and every "
        "rank takes the same optimizer step.",
        allreduce_step,
    ),
    Diagram(
        "launchers",
        "04_multi_node_scaling",
        "Horovod on Spark and TorchDistributor side by side: the driver starts a Spark job of two tasks, one in "
        "the executor of each worker; each task runs one training process, and the processes average "
        "gradients with an allreduce.",
        launchers,
    ),
    Diagram(
        "epoch_pitfall",
        "05_early_stopping_analysis",
        "How much data one epoch reads on 1, 2 and 4 devices: one pass with the per-device batch fixed, "
        "but 1, 4 and 16 passes when the steps per epoch stay fixed and the per-device batch grows.",
        epoch_pitfall,
    ),
    Diagram(
        "zero_stages",
        "06_ray_and_deepspeed",
        "What each ZeRO stage keeps on each of four devices: stage 0 keeps every parameter, gradient and "
        "optimizer state on every device (16 bytes per parameter); stage 1 splits the optimizer states, stage 2 "
        "the gradients too, stage 3 the parameters too, so that for 7.5 billion parameters on 64 devices a device "
        "holds 120, 31.4, 16.6 and 1.9 GB.",
        zero_stages,
    ),
)
