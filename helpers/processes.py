"""Process trees: a process with all its descendants, signalled and reaped together, and their memory.

The course starts processes that start their own (Spark's JVMs and Python daemons, Jupyter kernels, training
workers); stopping one means stopping its whole tree, and waiting until it is gone.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

import psutil

__all__ = [
    "clean_up_at_exit",
    "end_with_parent",
    "kill_tree",
    "process_tree",
    "signal_all",
    "stop_processes",
    "tree_memory",
]

# What clean_up_at_exit was given: run, in order, at interpreter exit and on SIGTERM/SIGHUP.
_CLEANUPS: list[Callable[[], None]] = []


def clean_up_at_exit(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` at interpreter exit and when SIGTERM or SIGHUP ends this process (then die of the signal).

    The signal handlers are installed only where nobody else handles the signal (Jupyter and pytest keep theirs), and
    only from the main thread; one handler runs every registered clean-up. Registering twice registers once.

    Args:
        cleanup: what stops the processes this process started; it must tolerate having nothing left to stop.
    """
    if cleanup not in _CLEANUPS:
        _CLEANUPS.append(cleanup)
        atexit.register(cleanup)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _clean_up_and_reraise)


def _clean_up_and_reraise(signum: int, frame: object) -> None:
    """The SIGTERM/SIGHUP handler: every clean-up, then die of the signal as the process would have."""
    for cleanup in list(_CLEANUPS):
        cleanup()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def process_tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants, the root first.

    Args:
        pid: the root's process id.

    Returns:
        The processes, or an empty list if ``pid`` is gone.
    """
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_memory(pid: int) -> tuple[int, int]:
    """The resident memory of the process ``pid`` and all its descendants (Spark's JVMs, training workers, ...).

    Args:
        pid: the root's process id.

    Returns:
        ``(total, largest)``: the sum over the tree and the largest single process, in bytes; processes that exit
        while they are read count as 0 (and a gone root gives ``(0, 0)``).
    """
    total = largest = 0
    for process in process_tree(pid):
        try:
            rss = process.memory_info().rss
        except psutil.Error:
            continue
        total += rss
        largest = max(largest, rss)
    return total, largest


def signal_all(processes: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each of ``processes``, skipping those already gone.

    Args:
        processes: the processes to signal.
        sig: the signal number (``signal.SIGTERM``, ``signal.SIGKILL``...).
    """
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def stop_processes(
    processes: list[psutil.Process], timeout: float, signals: Iterable[int] = (signal.SIGTERM, signal.SIGKILL)
) -> list[psutil.Process]:
    """Send each of ``signals`` in turn to the processes still alive, waiting up to ``timeout`` seconds after each.

    Args:
        processes: the processes to stop (e.g. from :func:`process_tree`).
        timeout: seconds to wait for them to exit after each signal.
        signals: the signals to send, gentlest first.

    Returns:
        The processes still alive after the last signal (normally none).
    """
    alive = list(processes)
    for sig in signals:
        if not alive:
            break
        signal_all(alive, sig)
        _, alive = psutil.wait_procs(alive, timeout=timeout)
    return alive


def kill_tree(pid: int, timeout: float = 10.0) -> list[psutil.Process]:
    """SIGKILL the process ``pid`` and all its descendants, as a crash would, and wait for them.

    Args:
        pid: the root's process id (nothing happens if it is gone).
        timeout: seconds to wait for the processes to exit.

    Returns:
        The processes still alive after ``timeout`` (normally none).
    """
    return stop_processes(process_tree(pid), timeout, (signal.SIGKILL,))


def end_with_parent(poll_s: float = 0.5) -> None:
    """SIGKILL this process and its descendants as soon as the process that started it is gone.

    A training process waits in a collective until the stall bound when a peer is lost; its launcher is meant to
    stop it, but may die first: PySpark's TorchDistributor wrapper SIGKILLs ``torchrun`` half a second after Spark
    kills the task, before ``torchrun`` stops its workers (and a rank inside a collective does not run Python's
    SIGTERM handler). This watch, in a daemon thread, ends such an orphan within ``poll_s``.

    Args:
        poll_s: seconds between looks at the parent.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        signal_all(reversed(process_tree(os.getpid())), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()
