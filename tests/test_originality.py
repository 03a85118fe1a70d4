"""Answers that are not the learner's own work fail with a hint to write it: a course helper's code under another
name, a private course helper, a course parent's method set in the learner's class, and a rebound ``check``.
Right answers written in other ways pass (the lessons' answer corpora hold those)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from helpers.course.checks import _run
from helpers.course.checks.originality import borrowed
from helpers.workdir import REPO_ROOT


def _renamed_copy(fn, new_name: str, extra_globals: dict | None = None):
    """``fn``'s source pasted into a notebook cell under ``new_name``: a different function, the same code."""
    source = textwrap.dedent(inspect.getsource(fn)).replace(f"def {fn.__name__}(", f"def {new_name}(", 1)
    namespace = {**vars(sys.modules[fn.__module__]), **(extra_globals or {}), "__name__": "__main__"}
    exec(compile(source, "<ipython-input-1>", "exec"), namespace)  # noqa: S102 - the learner's cell
    return namespace[new_name]


def test_a_helper_pasted_under_another_name_fails_the_check():
    from helpers.spark import task_slots

    copy = _renamed_copy(task_slots, "my_slots")
    assert copy is not task_slots and copy.__code__.co_code == task_slots.__code__.co_code
    assert (
        borrowed(copy)
        == "your `my_slots` is the course's helpers.spark.task_slots under another name: write it yourself"
    )


def test_a_pasted_copy_is_found_behind_a_wrapper_of_ones_own():
    from helpers.analysis.tables import speedup_table

    namespace = {"__name__": "__main__"}
    copy = _renamed_copy(speedup_table, "table_of_speedups")
    namespace["table_of_speedups"] = copy
    exec(compile("def speedup_efficiency(table):\n    return table_of_speedups(table)\n", "<cell>", "exec"), namespace)  # noqa: S102
    assert "is the course's helpers.analysis.tables.speedup_table under another name" in borrowed(
        namespace["speedup_efficiency"]
    )


def test_the_same_function_written_in_a_check_cell_of_a_real_exercise_fails_it():
    """Exercise 2.1 (epoch_steps) answered with the course's ``steps_per_epoch`` pasted under the exercise's name."""
    from helpers.loaders import steps_per_epoch

    copy = _renamed_copy(steps_per_epoch, "epoch_steps")
    status, message = _run("2.1", copy)
    assert (status, message) == (
        "failed",
        "your `epoch_steps` is the course's helpers.loaders.steps_per_epoch under another name: write it yourself",
    )


@pytest.mark.parametrize(
    "source, private",
    [
        ("import helpers.tracking as t\ndef answer(x):\n    return t._{name}(x)\n", True),
        ("from helpers import tracking\ndef answer(x):\n    return tracking._{name}(x)\n", True),
        ("def answer(x):\n    from helpers.tracking import _{name} as mine\n    return mine(x)\n", True),
        ("import helpers.tracking\ndef answer(x):\n    return helpers.tracking._{name}(x)\n", True),
        ("from helpers.tracking import _{name} as mine\ndef answer(x):\n    return mine(x)\n", True),
        # a private attribute of one's own object, or a library's, is not a course helper (one named like a private
        # helper of a course module the answer also uses would be taken for it: reading byte code cannot tell)
        ("import helpers.tracking as t\ndef answer(x):\n    return x._state, t.tracking_uri\n", False),
        ("def answer(x):\n    return x._modules\n", False),
    ],
)
def test_a_private_course_helper_in_the_answer_fails(source, private):
    import helpers.tracking

    name = next(
        n[1:]
        for n, v in vars(helpers.tracking).items()
        if n.startswith("_") and inspect.isfunction(v) and not n.startswith("__") and v.__module__ == "helpers.tracking"
    )
    namespace = {"__name__": "__main__"}
    exec(compile(source.format(name=name), "<cell>", "exec"), namespace)  # noqa: S102
    hint = borrowed(namespace["answer"])
    assert (hint is not None) == private, hint
    if private:
        assert f"calls helpers.tracking._{name}, a private course helper: write it yourself" in hint


def test_a_private_helper_given_as_the_answer_fails():
    import helpers.tracking

    private = next(
        v
        for n, v in vars(helpers.tracking).items()
        if n.startswith("_") and inspect.isfunction(v) and not n.startswith("__") and v.__module__ == "helpers.tracking"
    )
    assert borrowed(private).endswith(f"is the course's helpers.tracking.{private.__qualname__}: write it yourself")


def test_a_course_parents_method_set_in_the_learners_class_fails_and_one_written_there_passes():
    from helpers.model import LitClassificationModel

    taken = type(
        "MyModel",
        (LitClassificationModel,),
        {"training_step": LitClassificationModel.training_step, "__module__": "__main__"},
    )
    assert borrowed(taken) == (
        "`training_step` is the course's helpers.model.LitClassificationModel.training_step: write it yourself"
    )
    namespace = {"LitClassificationModel": LitClassificationModel, "__name__": "__main__"}
    exec(
        compile(  # noqa: S102 - the learner's own step, and a copy of the parent's source
            "class Mine(LitClassificationModel):\n    def training_step(self, batch, batch_idx):\n"
            "        return self.loss(batch)\n",
            "<cell>",
            "exec",
        ),
        namespace,
    )
    assert borrowed(namespace["Mine"]) is None
    pasted = textwrap.indent(textwrap.dedent(inspect.getsource(LitClassificationModel.training_step)), "    ")
    exec(compile(f"class Pasted(LitClassificationModel):\n{pasted}", "<cell>", "exec"), namespace)  # noqa: S102
    assert "is the course's helpers.model.LitClassificationModel.training_step under another name" in borrowed(
        namespace["Pasted"]
    )


def test_short_code_written_from_the_signature_is_never_called_a_copy():
    namespace = {"__name__": "__main__"}
    exec(
        compile(
            "def validation_count(n, val_fraction):\n    return max(1, round(n * val_fraction))\n",  # noqa: S102
            "<cell>",
            "exec",
        ),
        namespace,
    )
    assert borrowed(namespace["validation_count"]) is None


_SHELL = """
import json
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
cells = [
    "from helpers.course.checks import check",
    "check = lambda *args: True",
    "passed = check('4.6', {'max_processes': lambda *args: 2})",
]
for cell in cells:
    shell.run_cell(cell, store_history=True)
print(json.dumps({"passed": shell.user_ns["passed"], "restored": shell.user_ns["check"].__module__}))
"""


def test_a_cell_that_rebinds_check_does_not_turn_later_checks_green():
    """A real IPython shell: the cell after ``check = lambda *args: True`` still checks, and fails a wrong answer."""
    done = subprocess.run([sys.executable, "-c", _SHELL], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the course's `check` is back" in done.stdout
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"passed": False, "restored": "helpers.course.checks"}
