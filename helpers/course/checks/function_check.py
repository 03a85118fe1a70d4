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
Where no single right result exists (a config, a table), a ``judge`` of the case and the result says what is wrong
instead of a reference: ``zero_config_for(2, 32, 2, 1, 0.02) has zero_optimization.stage=1, expected 2``. An error of
the reference or the judge is the check's own (``check`` reports it as a bug of the course). The corpus in
``tests/`` reads :meth:`FunctionCheck.cases`, the very cases the learner's answer meets.

Where a case cannot be handed over as it is, the declaration says how the call is made and what is judged:
``arguments`` makes the call from a case (a Spark DataFrame, a Delta table written for it; ``cleanup`` removes it
afterwards), ``calls`` makes several calls judged together (one per shard), ``collect`` takes what the judge needs of
a lazy result while it is still the answer's work (a DataFrame's rows, batches read through a returned spec),
``around`` is the context a case's call runs in (MLflow pointed at an empty store, the rank and working directory a
training case sets), ``methods`` names what a class must define, ``effect_only`` judges what a call did rather than
what it returned. An exercise that asks for several functions is :class:`FunctionChecks`, one declaration each.

Where the exercise is about processes, ``processes`` makes a case's calls at once as ranks of one real job that
``launch`` starts (lesson 3: local Horovod; 4.3: TorchDistributor on the workers; 6.2: Ray Train), every case in that
job; each rank writes its results to a report in a folder of the check's (:mod:`.ranks`), with what ``around`` saw it
do (the Trainers it fitted), and the judge gets every rank's. The check is
then a generator of steps (:meth:`FunctionCheck.steps`) that yields the job and is resumed when it has ended, so that
:func:`drive` runs one answer and lesson 3's ``check_answers`` runs the jobs of many answers as one.
"""

from __future__ import annotations

import copy
import numbers
import random
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from helpers.course.checks import (
    CheckFailed,
    NotAttempted,
    close,
    hinted,
    is_whole,
    named_helpers,
    own_work,
    require,
    require_implemented,
    returned,
)
from helpers.course.checks.ranks import FitStopped, job_failure, rank_report, rank_reports, report_folder

__all__ = [
    "NUMBER",
    "WHOLE",
    "Call",
    "Case",
    "Collected",
    "FunctionCheck",
    "FunctionChecks",
    "Returns",
    "Seen",
    "Watched",
    "drive",
    "resume",
]


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


_SHOWN_ITEMS = 6  # a list whose text is longer than _SHOWN_LIST_CHARS shows as its first _SHOWN_ITEMS items
_SHOWN_LIST_CHARS = 200  # a loss history of 20 epochs still shows whole
_SHOWN_CHARS = 80  # an argument whose repr is longer, or spans lines (a network), shows as <its type>


def _shown(value: Any) -> str:
    """A case's argument or an expected result as the hint shows it: floats to 6 significant digits, a set of
    right results as ``3 or 4``, a list longer than :data:`_SHOWN_LIST_CHARS` characters by its first items and its
    length, an object with a long repr by its type."""
    if isinstance(value, list):
        whole = f"[{', '.join(map(_shown, value))}]"
        if len(whole) <= _SHOWN_LIST_CHARS or len(value) <= _SHOWN_ITEMS:
            return whole
        return f"[{', '.join(map(_shown, value[:_SHOWN_ITEMS]))}, ... ({len(value)} items)]"
    if isinstance(value, (set, frozenset)):
        return " or ".join(_shown(item) for item in sorted(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))  # a numpy integer as the number it is
    text = repr(value)
    return f"<{type(value).__name__}>" if "\n" in text or len(text) > _SHOWN_CHARS else text


@dataclass(frozen=True)
class Case:
    """A case the notebook's own objects give (a run of the lesson), with what only it knows: its right result,
    instead of the reference's (``expected``, a set where several are right; None: the reference's), and what to say
    when the answer misses it (``why``, instead of the check's hint)."""

    args: tuple
    expected: Any = None
    why: str = ""


@dataclass(frozen=True)
class Call:
    """A call with keyword arguments, where an exercise asks to pass them on (``launch(fn, 2, tag=7)`` must call
    ``fn(tag=7)``): what ``arguments`` returns instead of a tuple."""

    args: tuple
    kwargs: Mapping[str, Any]


class Collected(dict):
    """What a declaration's ``collect`` took of an answer's result (rows, batches, what a fit logged), so that its
    judge can tell it from whatever else the answer returned: a dict the answer returned is not one."""


class Seen(dict):
    """What an ``around`` that watches the answer's call saw it do (every Trainer it fitted, what it reported), filled
    while the call runs: the value such an ``around`` yields (other contexts yield what they like, e.g. a mock)."""


@dataclass(frozen=True)
class Watched:
    """What the judge gets of a call whose ``around`` watched it (its context yielded a :class:`Seen`): what the
    call returned (collected), and what ``around`` saw."""

    returned: Any
    seen: Any


@dataclass(frozen=True)
class FunctionCheck:
    """A check of a function on cases, declared; calling it with the answer runs it (a ``register``-ed check).

    Args:
        exercise_id: the exercise's id, ``"N.x"``: it seeds the drawn cases, so every run meets the same ones.
        answer: the name of the function the exercise asks for (read from the notebook's namespace).
        fixed: the cases every answer meets first (argument tuples): the text's examples and the edge cases.
        hint: what to fix, after ``call = got, expected X:``; or a function of the case and what the answer
            returned (or raised) that says it.
        passed: the success message; ``{n}`` is the number of cases.
        reference: the right result of a case, called with its arguments (its parameters name them in a hint);
            a set holds every right result where several are.
        judge: instead of ``reference``, ``judge(case, result, given)``: None where the answer's result is right,
            else what is wrong, worded to follow the call (``"returned a list: return a dict"``). It runs after the
            answer, outside the tripwire, with the case as it was given (untouched: an answer that changes its
            arguments cannot change what it is judged on) and ``given``, the answer's own copy of it (the objects
            the answer was called with, which its result may hold).
        draw: one more case from a ``random.Random``; ``draws`` of them follow the fixed cases.
        draws: how many cases ``draw`` adds.
        returns: what the answer must return, and how it is compared (:data:`WHOLE`, :data:`NUMBER`).
        forbid: the course helpers, as ``"module:name"``, that do the exercise: calling one fails the answer.
        keywords: show the call with its parameter names (``f(a=1, b=2)``) rather than positionally.
        show: how a hint shows a case's arguments (``<2 worker nodes of 4 CPUs>, True``), where the engine's way
            would not say what matters.
        from_namespace: the cases the notebook's namespace gives (:class:`Case`, e.g. the lesson's runs), met after
            the others where the check is given the namespace; none where it finds none.
        arguments: the arguments the answer is called with, made fresh from a case (a Spark DataFrame from its rows:
            a case that cannot be copied, such as a DataFrame, is described instead), or a :class:`Call` where some are
            keywords; None: a deep copy of the case.
            Declare ``show`` with it: the hint shows the case, not its arguments.
        calls: instead of ``arguments``, the several calls one case makes, judged together (every shard of one shard
            count: disjoint, and covering the data together); the judge gets the list of their results and, as
            ``given``, the list of their arguments.
        collect: ``collect(result, case)``, what the judge, or the comparison with the reference, gets of a result
            that is not None, taken right after the answer returns, inside the tripwire (a lazy DataFrame's rows, a
            batch read through a returned spec) as a :class:`Collected`, or the result as it is where there is nothing
            to take (the judge names it): an error there is the answer's, with the hint.
        effect_only: the exercise asks for what the call does (a fit resumed from a checkpoint), not for a result:
            an answer that returns None is judged like any other, not taken for one not written yet.
        processes: where the exercise is about processes, how many make a case's calls at once, as ranks of a job
            that ``launch`` starts (every case in one job): rank ``i`` makes ``calls``' call ``i``, or every rank the
            call ``arguments`` makes; the judge then gets every rank's result in rank order. Or a function of the
            cases that says how many (no more than the data has shards, the notebook's ``WORKERS``). A rank's
            error ends the job: ``launch`` or the ranks' reports say which rank raised what, and the check adds its
            hint (the first case's).
        launch: ``launch(processes, job, kwargs)`` runs ``job(**kwargs)`` in ``processes`` real processes, each
            finding its rank in ``HOROVOD_RANK`` or ``RANK`` (local Horovod processes, TorchDistributor on the
            workers, Ray Train: any launcher whose processes see the check's folder on shared storage). The ranks'
            results come back through that folder.
        methods: for an exercise that asks for a class, the methods it must write: one still a stub is not attempted.
        cleanup: ``cleanup(case, made)`` undoes what ``arguments`` or ``calls`` made for a case (a table written for
            it, runs added to a store), once the check has judged.
        around: ``around(case, given)``, the context the answer's call on ``case`` (with ``given``, what
            ``arguments`` or ``calls`` made of it) runs in, made fresh for each case: MLflow pointed at the check's own
            store, a library's look at the cluster patched, the rank and working directory a training case sets.
            Where it yields a :class:`Seen` (filled with the Trainers the call fits), the judge gets a
            :class:`Watched` of the result and what was seen, read when the call has ended (in a rank: written to its
            report). A call that ``around`` stops at ``fit`` (:class:`~helpers.course.checks.ranks.FitStopped`)
            returned nothing.
        passed_namespace: appended to ``passed`` where there were such cases; ``{m}`` is their number; or a function
            of those cases that says what they showed (the lesson's own numbers).
    """

    exercise_id: str
    answer: str
    fixed: Sequence[tuple]
    hint: str | Callable[[tuple, Any], str]
    passed: str
    reference: Callable[..., Any] | None = None
    judge: Callable[[tuple, Any, tuple], str | None] | None = None
    draw: Callable[[random.Random], tuple] | None = None
    draws: int = 0
    returns: Returns = WHOLE
    forbid: Sequence[str] = ()
    keywords: bool = False
    show: Callable[[tuple], str] | None = None
    from_namespace: Callable[[Mapping[str, Any]], list[Case]] | None = None
    arguments: Callable[[tuple], tuple] | None = None
    calls: Callable[[tuple], list[tuple]] | None = None
    collect: Callable[[Any, tuple], Any] | None = None
    around: Callable[[tuple, Any], AbstractContextManager] | None = None
    cleanup: Callable[[tuple, Any], None] | None = None
    methods: Sequence[str] = ()
    effect_only: bool = False
    processes: int | Callable[[list[tuple]], int] = 0
    launch: Callable[[int, Callable[..., Any], dict[str, Any]], Any] | None = None
    passed_namespace: str | Callable[[list[Case]], str] = ""

    def cases(self) -> list[tuple]:
        """The fixed cases, then ``draws`` drawn ones from a generator seeded with the exercise id."""
        rng = random.Random(f"check {self.exercise_id}")
        drawn = [tuple(self.draw(rng)) for _ in range(self.draws)] if self.draw else []
        return [tuple(case) for case in self.fixed] + drawn

    def check_functions(self) -> tuple[Any, ...]:
        """The check's own code: an error raised there is a bug of the check, not the learner's failure."""
        parts = (
            self.reference,
            self.judge,
            self.draw,
            self.hint,
            self.show,
            self.from_namespace,
            self.passed_namespace,
            self.arguments,
            self.calls,
            self.cleanup,
            self.around,
        )
        return tuple(part for part in parts if callable(part))

    def call(self, case: tuple) -> str:
        """How a hint shows the answer's call on ``case``."""
        if self.show is not None:
            return f"{self.answer}({self.show(case)})"
        if self.keywords:
            names = self.reference.__code__.co_varnames[: len(case)]
            return f"{self.answer}({', '.join(f'{n}={_shown(v)}' for n, v in zip(names, case))})"
        return f"{self.answer}({', '.join(map(_shown, case))})"

    def __post_init__(self):
        if (self.reference is None) == (self.judge is None):
            raise TypeError(f"check {self.exercise_id}: declare a reference or a judge, not both")
        if self.keywords and self.reference is None:
            raise TypeError(f"check {self.exercise_id}: keywords=True names the reference's parameters: declare one")
        if (self.arguments is not None or self.calls is not None) and self.show is None:
            raise TypeError(f"check {self.exercise_id}: arguments= or calls= makes the calls: declare show= too")
        if self.calls is not None and (self.arguments is not None or self.judge is None):
            raise TypeError(f"check {self.exercise_id}: calls= replaces arguments=, and its results need a judge")
        if self.processes and (self.launch is None or self.judge is None):
            raise TypeError(
                f"check {self.exercise_id}: processes= runs a case's calls as ranks: declare launch= and a judge="
            )

    def __call__(self, answer: Any) -> str:
        return drive(self.steps(answer), self.launch)

    def steps(self, answer: Any) -> Generator[tuple[int, Callable[..., Any], dict[str, Any]], Any, str]:
        """The check of ``answer`` as a generator that returns the success message; where the calls are made as
        ranks (``processes``), it first yields the job that makes them, ``(processes, job, kwargs)``, and is resumed
        when the job has ended (its ranks reported to the check's folder), or thrown the error that ended it (lesson
        3's ``check_answers`` runs the jobs of many answers as one)."""
        fn = require(answer, self.answer) if isinstance(answer, Mapping) else answer
        require_implemented(fn, *(getattr(fn, name, None) for name in self.methods))
        own = self.from_namespace(answer) if self.from_namespace and isinstance(answer, Mapping) else []
        every = [Case(args) for args in self.cases()] + own
        if not every:  # its cases all come from the notebook
            raise NotAttempted(
                f'check {self.exercise_id} reads the notebook\'s names: check("{self.exercise_id}", globals())'
            )
        cases, whys = [case.args for case in every], [case.why for case in every]
        # before the tripwire: the reference may use the helpers
        right = [self._expected(case.args, case.expected) for case in every]
        # the answer gets (and the judge sees) a copy of each case: an answer that changes its arguments changes
        # neither the case its hint shows nor the next call's
        given: list[Any] = []
        try:
            for case in cases:  # one at a time: what was made before a failure is cleaned up too
                given.append(self._made(case))
            if self.processes:
                gathered = yield from self._ranks(fn, cases, given)
                results = [self._every_rank(per_rank) for per_rank in gathered]
            else:
                results = self._results(fn, cases, given)
            for case, args, expected, why, result in zip(cases, given, right, whys, results):
                self._judge(case, args, expected, result, why)
        finally:
            for case, made in zip(cases, given) if self.cleanup else ():
                self.cleanup(case, made)
        message = self.passed.format(n=len(cases) - len(own))
        if not own:
            return message
        said = self.passed_namespace
        return message + (said(own) if callable(said) else said.format(m=len(own)))

    def _ranks(self, fn: Callable[..., Any], cases: list[tuple], given: list[Any]) -> Generator[tuple, Any, Any]:
        """Yield the job that makes every case's calls as ranks, its ranks reporting to a folder of the check's;
        per case, every rank's result (or raise the error that ended the job, with the hint)."""
        processes = self.processes(cases) if callable(self.processes) else self.processes
        job = {"check": self, "answer": fn, "cases": cases, "given": given}
        with report_folder(f"{self.exercise_id}-ranks") as folder, hinted(lambda error: self._hint(cases[0], error)):
            try:
                yield processes, _as_ranks, {**job, "record_dir": str(folder)}
            except CheckFailed:  # the launcher said which rank raised what
                raise
            except Exception as error:  # noqa: BLE001 - the ranks' reports say
                raise job_failure(folder, f"the job of {processes} processes", error) from None
            reports = rank_reports(folder)
        return [[reports[rank]["results"][index] for rank in range(processes)] for index in range(len(cases))]

    def _every_rank(self, per_rank: list[Any]) -> list[Any] | None:
        """Every rank's result of one case, or None (not written yet) where a rank returned nothing, unless the
        exercise asks for what the call does (only rank 0 returns)."""
        unwritten = not self.effect_only and any(_returned(got) is None for got in per_rank)
        return None if unwritten else per_rank

    def _results(self, fn: Callable[..., Any], cases: list[tuple], given: list[tuple]) -> list[Any]:
        """What the answer returned (or raised) for each of ``given`` (made from ``cases``), up to the first error,
        called inside the tripwire, each in the context ``around`` makes for its case."""
        results: list[Any] = []
        with own_work(*named_helpers(*self.forbid)):
            for case, args in zip(cases, given):
                with self.around(case, args) if self.around else nullcontext() as seen:
                    outcome = self._outcome(fn, args, case)
                watched = isinstance(seen, Seen) and not isinstance(outcome, _Raised)
                results.append(Watched(outcome, seen) if watched else outcome)
                if isinstance(results[-1], _Raised):
                    break
        return results

    def _made(self, case: tuple) -> Any:
        """What the answer is given for ``case``: the arguments of its call (a copy of the case by default), or the
        list of its calls' arguments."""
        if self.calls is not None:
            return self.calls(case)
        return self.arguments(case) if self.arguments else copy.deepcopy(case)

    def _outcome(self, fn: Callable[..., Any], made: Any, case: tuple) -> Any:
        """What the answer returned for ``case`` (the list of its calls' results, where it makes several), or the
        first error it raised, or None where a call returned nothing."""
        if self.calls is None:
            return _result(fn, made, self.collect, case)
        outcomes = []
        for args in made:
            outcome = _result(fn, args, self.collect, case)
            if outcome is None or isinstance(outcome, _Raised):
                return outcome
            outcomes.append(outcome)
        return outcomes

    def _expected(self, case: tuple, known: Any) -> Any:
        """The right result of ``case``: ``known`` where the case brought it, else the reference's; None for a
        judged check."""
        if self.reference is None:
            return None
        return self.reference(*case) if known is None else known

    def _judge(self, case: tuple, args: tuple, expected: Any, got: Any, why: str = "") -> None:
        """Fail unless ``got``, what the answer did with ``args`` (its copy of ``case``), is right: ``expected`` (one
        of them, for a set), or what the judge accepts; ``why`` replaces the hint where the case brought one."""
        if isinstance(got, _Raised):
            wanted = f"; expected {_shown(expected)}" if self.judge is None else ""
            raise CheckFailed(
                f"{self.call(case)} raised {type(got.error).__name__}: {_first_line(got.error)}{wanted}: "
                f"{why or self._hint(case, got.error)}"
            ) from got.error
        if not self.effect_only:
            returned(_returned(got), self.answer)
        if self.judge is not None:
            problem = self.judge(case, got, args)
            if problem:
                raise CheckFailed(f"{self.call(case)} {problem}")
        elif not self.returns.is_kind(got):
            raise CheckFailed(f"{self.call(case)} returned {got!r}: return {self.returns.kind}")
        elif not self.returns.matches(got, expected):
            raise CheckFailed(
                f"{self.call(case)} = {got!r}, expected {_shown(expected)}: {why or self._hint(case, got)}"
            )

    def _hint(self, case: tuple, got: Any) -> str:
        return self.hint if isinstance(self.hint, str) else self.hint(case, got)


@dataclass(frozen=True)
class FunctionChecks:
    """An exercise that asks for several functions: each one's declared check in turn, on the notebook's namespace
    (the first that fails gives the verdict); the success messages joined with ``"; "``."""

    parts: tuple[FunctionCheck, ...]

    def check_functions(self) -> tuple[Any, ...]:
        """Every part's own code (see :meth:`FunctionCheck.check_functions`)."""
        return tuple(code for part in self.parts for code in part.check_functions())

    def __call__(self, namespace: Mapping[str, Any]) -> str:
        return "; ".join(part(namespace) for part in self.parts)


def drive(judging: Generator[tuple, Any, str], launch: Callable[..., Any] | None) -> str:
    """Run a check made of steps (:meth:`FunctionCheck.steps`): ``launch`` the job it yields, if it yields one, then
    resume it (or throw in the launch's error); the success message."""
    try:
        job = next(judging)
    except StopIteration as done:
        return done.value
    try:
        launch(*job)
    except BaseException as error:  # noqa: BLE001 - the steps say what it means (and clean up)
        return resume(judging, error)
    return resume(judging)


def resume(judging: Generator[tuple, Any, str], error: BaseException | None = None) -> str:
    """Resume a check's steps once the job they yielded has ended (or throw in the ``error`` that ended it); the
    success message."""
    try:
        if error is not None:
            judging.throw(error)
        else:
            next(judging)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a check launched more than one job")


def _as_ranks(
    check: FunctionCheck, answer: Callable[..., Any], cases: list[tuple], given: list[Any], record_dir: str
) -> None:
    """In each process of a check's job, whatever its launcher: this rank's call of every case
    (``given[case][rank]`` of its ``calls``, else ``given[case]``), in the tripwire and the case's context, each
    result (collected) written to this rank's report in ``record_dir``. Nothing is started for the answer: an
    answer that must start Horovod itself (3.1) is not helped, and ``around`` starts it where the exercise's function
    runs in a started process."""
    with rank_report(record_dir, results=[]) as report, own_work(*named_helpers(*check.forbid, imported_only=True)):
        for case, made in zip(cases, given):
            with check.around(case, made) if check.around else nullcontext() as seen:
                result = _called(answer, made[report["rank"]] if check.calls is not None else made)
                got = check.collect(result, case) if check.collect is not None and result is not None else result
            report["results"].append(Watched(got, seen) if isinstance(seen, Seen) else got)


def _returned(got: Any) -> Any:
    """What a call returned, where the judge gets it with what ``around`` saw."""
    return got.returned if isinstance(got, Watched) else got


def _first_line(error: Exception) -> str:
    """An error's message up to its first line break (Spark's go on with the query plan)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


@dataclass(frozen=True)
class _Raised:
    """An error the answer raised on a case (the cases after it are not run)."""

    error: Exception


def _called(fn: Callable[..., Any], args: tuple | Call) -> Any:
    """``fn(*args)``, or ``fn(*args, **kwargs)`` of a :class:`Call`; None where ``around`` stopped it at ``fit``."""
    try:
        return fn(*args.args, **args.kwargs) if isinstance(args, Call) else fn(*args)
    except FitStopped:  # around has seen what the check judges
        return None


def _result(
    fn: Callable[..., Any], args: tuple | Call, collect: Callable[[Any, tuple], Any] | None, case: tuple
) -> Any:
    """``fn(*args)``, or ``fn(*args, **kwargs)`` of a :class:`Call` (passed through ``collect`` with its ``case``
    unless it is None), or the error it raised as a :class:`_Raised` (a check's own verdicts, from ``collect``, pass
    through)."""
    try:
        result = _called(fn, args)
        return collect(result, case) if collect is not None and result is not None else result
    except (CheckFailed, NotAttempted):
        raise
    except Exception as error:  # noqa: BLE001 - the learner's code may raise anything
        return _Raised(error)
