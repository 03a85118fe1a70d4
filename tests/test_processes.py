"""``helpers.processes.tree_memory``: the memory of a real process tree (a child that starts a grandchild holding
150 MiB), and of one that is gone."""

from __future__ import annotations

import subprocess
import sys
import time

from helpers.processes import kill_tree, tree_memory

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
