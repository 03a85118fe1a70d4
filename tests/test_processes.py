"""``helpers.processes``: the memory of a real process tree (a child that starts a grandchild holding 150 MiB), and
of one that is gone; a process that ends with the one that started it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from helpers.processes import kill_tree, process_tree, signal_all, tree_memory

HELD = 150 * 2**20
GRANDCHILD = f"b = bytearray({HELD}); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(60)"


def test_tree_memory_counts_every_descendant_and_nothing_once_they_are_gone():
    child = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {GRANDCHILD!r}])"]
    )
    try:
        deadline = time.monotonic() + 30
        total, largest = tree_memory(child.pid)
        while largest < HELD and time.monotonic() < deadline:
            time.sleep(0.2)
            total, largest = tree_memory(child.pid)
        assert largest >= HELD, largest  # the grandchild, two levels down
        assert total > largest  # the child is counted too
    finally:
        kill_tree(child.pid, timeout=10)
        child.wait(timeout=10)
    assert tree_memory(child.pid) == (0, 0)


# a launcher (the child) that starts a training process (the grandchild, with its own child) and prints its pid
ORPHAN = (
    "import subprocess, sys, time; from helpers.processes import end_with_parent; end_with_parent(); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
)
LAUNCHER = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen([sys.executable, '-c', {ORPHAN!r}]); print(p.pid, flush=True); time.sleep(120)"
)


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_process_ends_with_its_launcher_and_takes_its_own_children_with_it():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    tree: list[psutil.Process] = []
    try:
        trainer = psutil.Process(int(launcher.stdout.readline()))
        deadline = time.monotonic() + 30
        while len(process_tree(trainer.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = process_tree(trainer.pid)
        assert len(tree) == 2, tree  # the training process and its child, alive while the launcher is
        time.sleep(1.5)
        assert not any(_gone(process) for process in tree), tree
        launcher.kill()  # as PySpark's wrapper kills torchrun
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not all(_gone(process) for process in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(process) for process in tree), tree
    finally:
        kill_tree(launcher.pid, timeout=10)
        signal_all(tree, signal.SIGKILL)
