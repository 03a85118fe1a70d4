"""The attendee's path in a real browser: JupyterLab started by ``scripts/lab.sh`` (what ``make lab`` runs), lesson 1
in headless Chromium (Debian's ``chromium``, driven by Playwright), the course kernel, the cells up to the first
exercise, then a wrong and a right answer typed into it: its check cell must say "not yet", then "correct".

A second test breaks the course kernel's spec and expects the same path to fail at the kernel. Everything runs in
one temporary folder (the work directory, Jupyter's config and data folders, Chromium's profile) that goes
afterwards; the server is shut down through its API and no process it started may outlive it.
Alone: ``.venv/bin/python -m pytest -m browser``; the browser comes from ``scripts/install_test_packages.sh``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from helpers.course.build import YOUR_CODE, check_ids, read_notebook
from helpers.course.checks import FAILED, PASSED, format_line

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
# Root needs --no-sandbox; the rest keep Chromium from reaching out (the network is closed) or using a GPU.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KERNEL_NAME = "scaling-dl-spark"
KERNEL = "Scaling DL on Spark"
# What an attendee types into exercise 1.1 (label_column): the file name instead of its folder, then the folder.
WRONG_ANSWER = 'def label_column(df):\n    return df.withColumn("label", F.element_at(F.split("path", "/"), -1))\n'
RIGHT_ANSWER = 'def label_column(df):\n    return df.withColumn("label", F.element_at(F.split("path", "/"), -2))\n'
# JupyterLab settings for the test's own settings folder: the lesson is never saved, every cell stays in the page
# (by default only those near the view are), no news is fetched.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
}


@dataclass
class Lab:
    """A running JupyterLab: where it serves (``http://127.0.0.1:PORT``), its token, its process and its log."""

    base: str
    token: str
    process: subprocess.Popen
    log: Path


@dataclass(frozen=True)
class Exercise:
    """The lesson's first exercise: its cell index, the index of its check cell and the check's id."""

    path: Path
    cell: int
    check_cell: int
    check_id: str


def first_exercise(lesson: Path) -> Exercise:
    """The first cell of ``lesson`` with the exercise marker, and the check cell after it."""
    cells = read_notebook(lesson).cells
    cell = next(i for i, c in enumerate(cells) if c.cell_type == "code" and YOUR_CODE in c.source)
    check_cell = next(i for i in range(cell + 1, len(cells)) if check_ids(cells[i].source))
    return Exercise(lesson, cell, check_cell, check_ids(cells[check_cell].source)[0])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lab_environment(scratch: Path) -> dict[str, str]:
    """The server's environment: its own work directory (which also marks the processes it starts) and Jupyter's
    own config and data folders (settings, workspaces, runtime files, notebook signatures) under ``scratch``, so the
    attendee's work/ and Jupyter state stay as they are; the course kernel is still found, in the environment's
    share/jupyter. Temporary files already go to the test session's folder (tests/conftest.py)."""
    folders = {
        "COURSE_WORK_DIR": scratch / "work",
        "JUPYTER_CONFIG_DIR": scratch / "config",
        "JUPYTER_DATA_DIR": scratch / "data",
    }
    for plugin, values in LAB_SETTINGS.items():
        target = folders["JUPYTER_CONFIG_DIR"] / "lab" / "user-settings" / f"{plugin}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    for folder in folders.values():
        folder.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHON=sys.executable, JUPYTER_TOKEN=secrets.token_hex(16))
    for name in ("JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        env.pop(name, None)  # they would take precedence over the folders above
    return env | {name: str(folder) for name, folder in folders.items()}


def api(lab: Lab, path: str, method: str = "GET", token: str | None = None) -> int:
    """The HTTP status of ``method`` on the server's ``path`` with ``token`` (the server's by default)."""
    request = urllib.request.Request(f"{lab.base}{path}", method=method)
    request.add_header("Authorization", f"token {lab.token if token is None else token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_until_serving(lab: Lab, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            pytest.fail(f"scripts/lab.sh exited with {lab.process.returncode}:\n{lab.log.read_text()[-3000:]}")
        try:
            if api(lab, "/api/status") == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within {timeout} s:\n{lab.log.read_text()[-3000:]}")


def started_by(work: str) -> list[psutil.Process]:
    """Live processes whose environment names ``work`` as COURSE_WORK_DIR: the server, kernels, Spark JVMs."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("COURSE_WORK_DIR") == work:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def stop(lab: Lab, work: str) -> list[str]:
    """Shut the server down through its API (it stops its kernels, and their Spark JVMs follow; after a kernel
    failed to start, jupyter_server answers the first request with 404, so it is asked again), SIGTERM if it is
    still there; kill whatever it started that is still there 30 s later and return their command lines."""
    for _ in range(5):
        try:
            accepted = api(lab, "/api/shutdown", method="POST") == 200
        except OSError:
            accepted = False
        try:
            lab.process.wait(timeout=30 if accepted else 1)
            break
        except subprocess.TimeoutExpired:
            pass
    if lab.process.poll() is None:
        lab.process.terminate()
    _, left = psutil.wait_procs(started_by(work), timeout=30)
    leftovers = []
    for proc in left:
        try:
            leftovers.append(" ".join(proc.cmdline())[:200])
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)
    lab.process.wait(timeout=10)
    return leftovers


@contextmanager
def running_lab(extra_env: dict[str, str] | None = None) -> Iterator[tuple[Lab, Path]]:
    """``scripts/lab.sh`` on a free port, in a fresh scratch folder; yields the server and the folder. Afterwards
    nothing it started is left running (the test fails if something was) and the folder is removed."""
    scratch = Path(tempfile.mkdtemp(prefix="course-browser-"))
    try:
        env = lab_environment(scratch) | (extra_env or {})
        port = free_port()
        log = scratch / "lab.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [str(REPO / "scripts" / "lab.sh"), "--port", str(port), "--ServerApp.port_retries=0"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        lab = Lab(f"http://127.0.0.1:{port}", env["JUPYTER_TOKEN"], process, log)
        leftovers: list[str] = []
        try:
            wait_until_serving(lab)
            yield lab, scratch
        finally:
            leftovers = stop(lab, env["COURSE_WORK_DIR"])
        assert not leftovers, f"still running after the server's shutdown: {leftovers}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def chromium(scratch: Path) -> Iterator[Page]:
    """A page in headless Chromium (the system's, never a downloaded one) with a fresh profile under ``scratch``."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install_test_packages.sh (make test does)")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(scratch / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def cell(page: Page, index: int) -> Locator:
    """The notebook cell at ``index``."""
    return page.locator(f".jp-NotebookPanel .jp-Cell[data-windowed-list-index='{index}']")


def outputs(page: Page) -> str:
    """The text of every output on screen, for failure messages."""
    return "\n".join(page.locator(".jp-NotebookPanel .jp-OutputArea-output").all_inner_texts())[-3000:]


def open_with_kernel(page: Page, lab: Lab, lesson: Path, timeout: float = 120) -> None:
    """Open ``lesson`` and pick the course kernel in JupyterLab's kernel dialog, as an attendee does; return once
    it is idle. Fails at once on an error dialog (a kernel that cannot start)."""
    page.goto(f"{lab.base}/lab/tree/{lesson.relative_to(REPO).as_posix()}?token={lab.token}")
    kernel_button = page.locator(".jp-NotebookPanel-toolbar [data-jp-item-name='kernelName']")
    expect(kernel_button).not_to_have_text("No Kernel", timeout=timeout * 1000)  # the notebook's own kernel
    kernel_button.click()
    page.locator(".jp-Dialog select").select_option(label=KERNEL)
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(".jp-Dialog", has_text="Select Kernel")).to_have_count(0)
    status = page.locator(".jp-StatusBar-Widget")
    deadline = time.monotonic() + timeout
    while f"{KERNEL} | Idle" not in status.inner_text():
        if page.locator(".jp-Dialog").count():
            pytest.fail(f"kernel {KERNEL!r} did not start: {page.locator('.jp-Dialog').inner_text()[:1000]}")
        if time.monotonic() > deadline:
            pytest.fail(f"kernel {KERNEL!r} not idle after {timeout} s; status bar: {status.inner_text()!r}")
        page.wait_for_timeout(250)


def run_cells(page: Page, count: int) -> None:
    """Run ``count`` cells from the active one on (Shift+Enter each: run and move to the next)."""
    page.keyboard.press("Escape")  # command mode
    for _ in range(count):
        page.keyboard.press("Shift+Enter")


def type_answer(page: Page, answer: str) -> None:
    """Replace the active cell's code with ``answer``."""
    page.keyboard.press("Enter")  # edit mode
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(answer)


def check_output(page: Page, index: int, timeout: float) -> str:
    """Wait for the run of the cell at ``index`` (its prompt gets an execution count) and return its output. Fails
    at once if the run was cancelled (an earlier cell raised: its prompt goes back to ``[ ]``)."""
    prompt = cell(page, index).locator(".jp-InputPrompt")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = prompt.inner_text()
        if re.search(r"\[\d+\]", text):
            return cell(page, index).locator(".jp-OutputArea").inner_text()
        if "*" not in text:
            pytest.fail(f"cell {index} was not run (an earlier cell failed?); outputs:\n{outputs(page)}")
        page.wait_for_timeout(250)
    pytest.fail(f"cell {index} still running after {timeout} s; outputs:\n{outputs(page)}")


def attendee_path(page: Page, lab: Lab, exercise: Exercise) -> None:
    """Open the lesson with the course kernel, run it down to the exercise, answer it wrongly, then rightly, and
    see the check cell say so each time."""
    open_with_kernel(page, lab, exercise.path)
    cell(page, 0).click()
    run_cells(page, exercise.cell)  # the active cell is now the exercise
    type_answer(page, WRONG_ANSWER)
    run_cells(page, exercise.check_cell - exercise.cell + 1)
    said = check_output(page, exercise.check_cell, timeout=300)  # the first cells start Spark
    assert format_line(exercise.check_id, FAILED, "") in said, f"a wrong answer passed or was not checked: {said}"

    for _ in range(exercise.check_cell - exercise.cell + 1):
        page.keyboard.press("ArrowUp")  # back to the exercise (command mode)
    type_answer(page, RIGHT_ANSWER)
    run_cells(page, exercise.check_cell - exercise.cell + 1)
    said = check_output(page, exercise.check_cell, timeout=120)
    assert format_line(exercise.check_id, PASSED, "") in said, f"the right answer did not pass: {said}"


def test_lab_lesson_one_first_exercise_in_chromium() -> None:
    lesson = next(REPO.glob("lessons/01_*.ipynb"))
    exercise = first_exercise(lesson)
    assert exercise.check_id == "1.1", f"the typed answers are for exercise 1.1, the lesson starts with {exercise}"
    before = lesson.read_bytes()
    with running_lab() as (lab, scratch):
        assert api(lab, "/api/status", token="wrong-token") == 403, "the server must ask for its token"
        listening = {c.laddr.ip for c in psutil.Process(lab.process.pid).net_connections() if c.status == "LISTEN"}
        assert listening == {"127.0.0.1"}, f"the server listens on {listening}, not on 127.0.0.1 only"
        with chromium(scratch) as page:
            attendee_path(page, lab, exercise)
    assert lesson.read_bytes() == before, "the test changed the lesson"


def test_broken_kernel_spec_fails_the_path() -> None:
    """The course kernel's interpreter is gone (its spec points at a removed environment): the path must fail."""
    lesson = next(REPO.glob("lessons/01_*.ipynb"))
    broken = Path(tempfile.mkdtemp(prefix="course-browser-kernel-"))
    try:
        spec = broken / "kernels" / KERNEL_NAME / "kernel.json"
        spec.parent.mkdir(parents=True)
        argv = [str(broken / "removed-venv" / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec.write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
        # JUPYTER_PATH comes before the environment's own share/jupyter: this spec replaces the installed one.
        with running_lab({"JUPYTER_PATH": str(broken)}) as (lab, scratch), chromium(scratch) as page:
            with pytest.raises(pytest.fail.Exception, match="did not start"):
                open_with_kernel(page, lab, lesson, timeout=60)
    finally:
        shutil.rmtree(broken, ignore_errors=True)
