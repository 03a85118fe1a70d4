"""Checks declared, not hand-written: a :class:`FunctionCheck` names the function an exercise asks for, the cases it
is called on (fixed ones, then ones drawn from a generator seeded by the exercise id), the reference that gives the
right result, what the answer must return, the course helpers that would do the work, and the hint. One engine runs
every such check::

    register("4.6")(FunctionCheck(
        "4.6", answer="max_processes", fixed=[(2, 1, 1, 0, 0.0)], draws=30, draw=lambda rng: (...),
        reference=_slots, returns=WHOLE, forbid=("helpers.spark:task_slots",), keywords=True,
        hint="each executor runs cores // task_cpus tasks ...", passed="task slots right on {n} clusters",
    ))

The engine takes the answer from the notebook's namespace (or as the function itself), rejects a stub (and counts
a body that returns nothing as not attempted yet), runs every case inside the tripwire
(:func:`~helpers.course.checks.own_work`), and fails with one line that names the call:
``max_processes(executors=2, ...) = 3, expected 2: <hint>``; an error the answer raises gets the same line and hint.
An error of the reference is the check's own (``check`` reports it as a bug of the course). The corpus in ``tests/``
reads :meth:`FunctionCheck.cases`, the very cases the learner's answer meets.
"""

from __future__ import annotations

import importlib
import numbers
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helpers.course.checks import (
    CheckFailed,
    close,
    is_whole,
    own_work,
    require,
    require_implemented,
    returned,
)

__all__ = ["NUMBER", "WHOLE", "FunctionCheck", "Returns"]


@dataclass(frozen=True)
class Returns:
    """What an answer must return: ``kind`` (named in the hint when it returns something else), a test of that
    kind, and how a value of it is compared with the reference's (a set of values: any of them is right)."""

    kind: str
    is_kind: Callable[[Any], bool]
    matches: Callable[[Any, Any], bool]


def _is_number(value: Any) -> bool:
    """A real number, numpy scalars and 0-d tensors included; not a bool, a string or bytes."""
    if isinstance(value, (bool, str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _options(expected: Any) -> set[Any]:
    return set(expected) if isinstance(expected, (set, frozenset)) else {expected}


WHOLE = Returns("a whole number", is_whole, lambda got, expected: int(got) in _options(expected))
NUMBER = Returns("a number", _is_number, lambda got, expected: close(got, expected))


def _shown(value: Any) -> str:
    """A case's argument or an expected result as the hint shows it: floats to 6 significant digits, a set of
    right results as ``3 or 4``."""
    if isinstance(value, (set, frozenset)):
        return " or ".join(_shown(item) for item in sorted(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))  # a numpy integer as the number it is
    return repr(value)


def _helpers(paths: Sequence[str]) -> list[Any]:
    """The course helpers named ``module:attribute``."""
    found = []
    for path in paths:
        module, name = path.split(":")
        found.append(getattr(importlib.import_module(module), name))
    return found


@dataclass(frozen=True)
class FunctionCheck:
    """A check of a function on cases, declared; calling it with the answer runs it (a ``register``-ed check).

    Args:
        exercise_id: the exercise's id, ``"N.x"``: it seeds the drawn cases, so every run meets the same ones.
        answer: the name of the function the exercise asks for (read from the notebook's namespace).
        fixed: the cases every answer meets first (argument tuples): the text's examples and the edge cases.
        reference: the right result of a case, called with its arguments (its parameters name them in a hint);
            a set holds every right result where several are.
        hint: what to fix, after ``call = got, expected X:``; or a function of the case and what the answer
            returned (or raised) that says it.
        passed: the success message; ``{n}`` is the number of cases.
        draw: one more case from a ``random.Random``; ``draws`` of them follow the fixed cases.
        draws: how many cases ``draw`` adds.
        returns: what the answer must return, and how it is compared (:data:`WHOLE`, :data:`NUMBER`).
        forbid: the course helpers, as ``"module:name"``, that do the exercise: calling one fails the answer.
        keywords: show the call with its parameter names (``f(a=1, b=2)``) rather than positionally.
    """

    exercise_id: str
    answer: str
    fixed: Sequence[tuple]
    reference: Callable[..., Any]
    hint: str | Callable[[tuple, Any], str]
    passed: str
    draw: Callable[[random.Random], tuple] | None = None
    draws: int = 0
    returns: Returns = WHOLE
    forbid: Sequence[str] = ()
    keywords: bool = False

    def cases(self) -> list[tuple]:
        """The fixed cases, then ``draws`` drawn ones from a generator seeded with the exercise id."""
        rng = random.Random(f"check {self.exercise_id}")
        drawn = [tuple(self.draw(rng)) for _ in range(self.draws)] if self.draw else []
        return [tuple(case) for case in self.fixed] + drawn

    def check_functions(self) -> tuple[Any, ...]:
        """The check's own code: an error raised there is a bug of the check, not the learner's failure."""
        return tuple(part for part in (self.reference, self.draw, self.hint) if callable(part))

    def call(self, case: tuple) -> str:
        """How a hint shows the answer's call on ``case``."""
        if self.keywords:
            names = self.reference.__code__.co_varnames[: len(case)]
            return f"{self.answer}({', '.join(f'{n}={_shown(v)}' for n, v in zip(names, case))})"
        return f"{self.answer}({', '.join(map(_shown, case))})"

    def __call__(self, answer: Any) -> str:
        fn = require(answer, self.answer) if isinstance(answer, Mapping) else answer
        require_implemented(fn)
        cases = self.cases()
        right = [self.reference(*case) for case in cases]  # before the tripwire: the reference may use the helpers
        with own_work(*_helpers(self.forbid)):
            for case, expected in zip(cases, right):
                self._judge(fn, case, expected)
        return self.passed.format(n=len(cases))

    def _judge(self, fn: Callable[..., Any], case: tuple, expected: Any) -> None:
        """Fail unless ``fn(*case)`` returns ``expected`` (one of them, for a set)."""
        try:
            got = fn(*case)
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001 - the learner's code may raise anything
            raise CheckFailed(
                f"{self.call(case)} raised {type(error).__name__}: {error}; expected {_shown(expected)}: "
                f"{self._hint(case, error)}"
            ) from error
        if not self.returns.is_kind(returned(got, self.answer)):
            raise CheckFailed(f"{self.call(case)} returned {got!r}: return {self.returns.kind}")
        if not self.returns.matches(got, expected):
            raise CheckFailed(f"{self.call(case)} = {got!r}, expected {_shown(expected)}: {self._hint(case, got)}")

    def _hint(self, case: tuple, got: Any) -> str:
        return self.hint if isinstance(self.hint, str) else self.hint(case, got)
