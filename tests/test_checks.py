"""The check framework: one line per check, a record for the grader, never an exception."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import IPython
import IPython.display
import pytest

import helpers.course.checks as checks
from helpers.course.checks import (
    ERROR,
    FAILED,
    MIMETYPE,
    NOT_ATTEMPTED,
    PASSED,
    CannotCheck,
    CheckFailed,
    NotAttempted,
    check,
    is_stub,
    register,
    require,
    require_implemented,
)
from helpers.course.checks.function_check import Call, Case, FunctionCheck, FunctionChecks, Returns, Seen, Watched


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Each test registers into an empty registry."""
    monkeypatch.setattr(checks, "_REGISTRY", {})


@pytest.fixture
def shown(monkeypatch) -> list[dict]:
    """Pretend to be inside IPython and collect what ``check`` displays."""
    captured: list[dict] = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda data, raw=False: captured.append({"data": data, "raw": raw}))
    return captured


@pytest.fixture
def lesson_dir(monkeypatch, tmp_path) -> Path:
    """A folder searched for ``helpers.course.checks.lessonN`` modules; what the test imports is forgotten after."""
    monkeypatch.setattr(checks, "__path__", [*checks.__path__, str(tmp_path)])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def register_total() -> None:
    @register("98.1")
    def total_is_55(answer) -> str:
        if answer != 55:
            raise CheckFailed(f"{answer} is not the sum of 1..10")
        return "the sum is 55"


def test_correct_answer_prints_one_line_and_returns_true(capsys):
    register_total()
    assert check("98.1", 55) is True
    assert capsys.readouterr().out == "✅ 98.1 correct: the sum is 55\n"


def test_wrong_answer_prints_the_hint_and_returns_false(capsys):
    register_total()
    assert check("98.1", 54) is False
    assert capsys.readouterr().out == "❌ 98.1 not yet: 54 is not the sum of 1..10\n"


def test_the_logged_record_is_the_shown_one_with_the_seconds_the_check_took(shown, monkeypatch, tmp_path):
    @register("98.11")
    def slow_square(answer) -> None:
        time.sleep(0.3)
        if answer(3) != 9:
            raise CheckFailed("square(3) should be 9")

    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(checks.LOG_ENV, str(log))
    check("98.11", lambda x: x * x)
    check("98.11", ...)
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [{key: value for key, value in record.items() if key != "seconds"} for record in logged] == [
        shown_record["data"][checks.MIMETYPE] for shown_record in shown
    ]
    assert logged[0]["seconds"] >= 0.3 and 0 <= logged[1]["seconds"] < 0.3


@pytest.mark.parametrize("answer", [..., (1, ...), [..., 2]])
def test_ellipsis_is_not_attempted(capsys, answer):
    register_total()
    assert check("98.1", answer) is False
    assert capsys.readouterr().out.startswith("⏳ 98.1 not attempted")


def test_namespace_without_the_name_or_with_ellipsis_is_not_attempted(capsys):
    @register("98.2")
    def needs_shards(namespace) -> str:
        evens, odds = require(namespace, "evens", "odds")
        return f"{len(evens)} + {len(odds)}"

    assert check("98.2", {"evens": [0, 2]}) is False
    assert "`odds` is not defined yet" in capsys.readouterr().out
    assert check("98.2", {"evens": [0], "odds": ...}) is False
    assert capsys.readouterr().out.startswith("⏳ 98.2 not attempted")
    assert check("98.2", {"evens": [0], "odds": [1]}) is True


def test_a_stub_function_is_not_attempted(capsys):
    @register("98.3")
    def square_works(namespace) -> str:
        square = require(namespace, "square")
        if square(3) != 9:
            raise CheckFailed("square(3) should be 9")
        return "ok"

    def square(x):
        """Return x squared."""
        # YOUR CODE HERE
        ...

    assert check("98.3", {"square": square}) is False
    assert "`square` is not written yet" in capsys.readouterr().out
    assert check("98.3", square) is False
    assert capsys.readouterr().out.startswith("⏳ 98.3 not attempted")
    assert check("98.3", {"square": lambda x: x * x}) is True


def test_a_check_that_cannot_run_here_is_an_error_with_its_reason_not_a_failure(capsys):
    @register("98.12")
    def needs_a_cluster(answer) -> str:
        raise CannotCheck("this check needs Horovod, which is not installed here: go on with the next exercise")

    assert check("98.12", lambda: 1) is False
    assert capsys.readouterr().out == (
        "⚠️ 98.12 could not be checked: this check needs Horovod, which is not installed here: go on with the next "
        "exercise\n"
    )


def test_an_unexpected_exception_is_a_failure_with_its_type(capsys):
    @register("98.4")
    def calls_student_code(answer) -> str:
        return str(answer(0))

    assert check("98.4", lambda x: 1 / x) is False
    assert capsys.readouterr().out == "❌ 98.4 not yet: ZeroDivisionError: division by zero\n"


def test_a_bug_in_the_check_itself_is_an_error_of_the_check_not_a_failure_of_the_learner(capsys):
    @register("98.9")
    def buggy_check(answer) -> str:
        answer(2)
        return {}["missing"]  # the check's own KeyError, after the answer returned

    assert check("98.9", lambda x: x * x) is False
    out = capsys.readouterr().out
    assert out.startswith("⚠️ 98.9 could not be checked: the check itself failed (KeyError: 'missing')"), out
    assert "not in your answer" in out


def test_an_answer_s_error_raised_inside_a_library_it_called_is_the_learner_s(capsys):
    @register("98.10")
    def calls_student_code(answer) -> str:
        return str(answer("x"))

    assert check("98.10", lambda text: int(text)) is False  # raised in int(), called from the answer
    assert capsys.readouterr().out.startswith("❌ 98.10 not yet: ValueError: invalid literal for int()")


def test_check_functions_may_raise_not_attempted(capsys):
    @register("98.5")
    def unfinished(answer) -> str:
        raise NotAttempted("train the model first")

    assert check("98.5", 1) is False
    assert capsys.readouterr().out == "⏳ 98.5 not attempted: train the model first\n"


@pytest.mark.parametrize("exercise_id", ["98.404", "bad id", "x.1"])
def test_unknown_or_malformed_ids_print_an_error_line(capsys, exercise_id):
    assert check(exercise_id, 1) is False
    assert capsys.readouterr().out.startswith(f"⚠️ {exercise_id} could not be checked")


def test_lesson_modules_are_imported_lazily(lesson_dir, capsys):
    (lesson_dir / "lesson97.py").write_text(
        "from helpers.course.checks import register\n\n"
        "@register('97.1')\n"
        "def always(answer):\n"
        "    return 'registered by lesson97'\n"
    )
    assert check("97.1", 1) is True
    assert "registered by lesson97" in capsys.readouterr().out


def test_a_broken_lesson_module_is_reported_not_raised(lesson_dir, capsys):
    (lesson_dir / "lesson96.py").write_text("import a_module_that_does_not_exist\n")
    assert check("96.1", 1) is False
    out = capsys.readouterr().out
    assert out.startswith("⚠️ 96.1 could not be checked: could not load the check: ModuleNotFoundError")


def test_inside_ipython_the_line_and_the_record_are_one_display(shown):
    register_total()
    check("98.1", 54)
    check("98.1", ...)
    assert [item["raw"] for item in shown] == [True, True]
    first, second = (item["data"] for item in shown)
    assert first["text/plain"] == "❌ 98.1 not yet: 54 is not the sum of 1..10"
    assert first[MIMETYPE] == {"exercise": "98.1", "status": FAILED, "message": "54 is not the sum of 1..10"}
    assert second[MIMETYPE]["status"] == NOT_ATTEMPTED
    assert json.loads(json.dumps(first[MIMETYPE])) == first[MIMETYPE]


def test_records_are_deterministic_and_use_the_four_statuses(shown):
    register_total()
    for answer in (55, 55, 1, ...):
        check("98.1", answer)
    check("98.9", 1)
    records = [item["data"][MIMETYPE] for item in shown]
    assert records[0] == records[1]
    assert [record["status"] for record in records] == [PASSED, PASSED, FAILED, NOT_ATTEMPTED, ERROR]


def test_require_reads_attributes_too():
    class Answers:
        learning_rate = 0.1

    assert require(Answers, "learning_rate") == 0.1
    with pytest.raises(NotAttempted):
        require(Answers, "momentum")


def test_stub_detection():
    def stub(self):
        """Docstring only."""

    def passes():
        pass

    def real(x):
        return x

    def prints(x):
        print(x)

    assert is_stub(stub) and is_stub(passes)
    assert not any(is_stub(thing) for thing in (real, prints, 3, print, int))
    with pytest.raises(NotAttempted, match="stub"):
        require_implemented(real, stub)


def _helper_total(values):
    return sum(values)


class _HelperModule:
    def loader(self):
        return "helper's loader"


def test_own_work_catches_a_call_by_any_name_and_restores_the_helper():
    alias = _helper_total
    with pytest.raises(checks.Delegated, match="_helper_total"):
        with checks.own_work(_helper_total):
            alias([1, 2])
    assert _helper_total([1, 2]) == 3


def test_own_work_catches_an_inherited_method_even_when_the_answer_swallows_the_error():
    class Lazy(_HelperModule):
        def loader(self):
            try:
                return super().loader()
            except Exception:
                return "own"

    with pytest.raises(checks.Delegated, match="_HelperModule.loader"):
        with checks.own_work(_HelperModule):
            Lazy().loader()


def test_own_work_lets_own_code_and_its_errors_through():
    class Own(_HelperModule):
        def loader(self):
            return "own"

    with checks.own_work(_HelperModule, _helper_total):
        assert Own().loader() == "own"
    with pytest.raises(ValueError):
        with checks.own_work(_helper_total):
            int("not a number")


def test_a_delegated_answer_fails_its_check_with_a_hint():
    @register("98.3")
    def total(answer) -> str:
        with checks.own_work(_helper_total):
            assert answer([4, 5]) == 9
        return "ok"

    assert checks._run("98.3", lambda v: _helper_total(v))[0] == FAILED
    assert "write it yourself" in checks._run("98.3", lambda v: _helper_total(v))[1]
    assert checks._run("98.3", lambda v: v[0] + v[1])[0] == PASSED


@pytest.mark.parametrize("value", [3, 3.0, __import__("numpy").int64(3), __import__("numpy").float32(3.0)])
def test_whole_number_accepts_any_integral_type(value):
    assert checks.whole_number(value, "f") == 3


@pytest.mark.parametrize("value", [True, 2.5, "3", None])
def test_whole_number_rejects_the_rest(value):
    with pytest.raises(CheckFailed, match="whole number"):
        checks.whole_number(value, "f")


def _ranks_reporting(record_dir: str, error: BaseException | None) -> None:
    """A stand-in launcher: ranks 0 and 1 in turn, each filling its report; rank 1 raises ``error`` (if any), and the
    launcher then fails with an error of its own, as TorchDistributor and Ray Train do."""
    from unittest import mock

    from helpers.course.checks.ranks import rank_report

    for rank in (0, 1):
        with mock.patch.dict("os.environ", {"RANK": str(rank)}):
            try:
                with rank_report(record_dir, seen=[]) as report:
                    report["seen"].append(rank * 10)
                    if rank == 1 and error is not None:
                        raise error
            except type(error):
                raise RuntimeError("the launcher's own summary") from None


def test_every_rank_s_report_is_read_and_the_folder_left_behind_is_none(work_dir):
    from helpers.course.checks.ranks import rank_reports, report_folder

    with report_folder("t-reports") as folder:
        _ranks_reporting(str(folder), None)
        reports = rank_reports(folder)
    assert {rank: report["seen"] for rank, report in reports.items()} == {0: [0], 1: [10]}
    assert not list(Path(work_dir).rglob("rank-*"))


@pytest.mark.parametrize(
    "error, verdict, says",
    [
        (ValueError("bad shard"), CheckFailed, "the test job failed: ValueError: bad shard"),
        (checks.Delegated("write it yourself"), checks.Delegated, "write it yourself"),
        (None, CheckFailed, "the test job failed: RuntimeError: the launcher's own summary"),
    ],
)
def test_a_failed_job_is_judged_by_the_rank_that_raised(work_dir, error, verdict, says):
    """The rank's own error (a delegated answer's verdict as it is), else the launcher's where no rank raised."""
    from helpers.course.checks.ranks import job_failure, report_folder

    with report_folder("t-reports") as folder:
        try:
            _ranks_reporting(str(folder), error)
            raise RuntimeError("the launcher's own summary")
        except RuntimeError as launcher_error:
            judged = job_failure(folder, "the test job", launcher_error)
    assert str(judged) == says and type(judged) is verdict


def _in_turn(processes, job, kwargs):
    """A launcher of real ranks one after the other in this process, each with its ``RANK``; like TorchDistributor
    and Ray Train, it fails with a summary of its own, not the rank's error."""
    from unittest import mock

    for rank in range(processes):
        with mock.patch.dict("os.environ", {"RANK": str(rank)}):
            try:
                job(**kwargs)
            except Exception:  # noqa: BLE001 - the launcher's own summary replaces it
                raise RuntimeError("the launcher's own summary") from None


def _total_on_ranks(exercise_id: str) -> FunctionCheck:
    return FunctionCheck(
        exercise_id,
        answer="total",
        fixed=[(1, 2)],
        calls=lambda case: [case, (case[0] * 10, case[1] * 10)],
        processes=2,
        launch=_in_turn,
        judge=lambda case, per_rank, given: None if per_rank == [sum(c) for c in given] else f"gave {per_rank}",
        show=lambda case: f"<{case} on rank 0, ten times it on rank 1>",
        hint="add them",
        passed="added on {n} ranks' cases",
    )


def _total_but_rank_1_raises(a, b):
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 gave up")
    return a + b


def test_ranks_report_to_the_check_whatever_the_launcher(work_dir):
    """The engine's rank checks under a launcher that is not Horovod: every rank's result comes back through its
    report, a rank's error is named from the reports with the hint, and no report is left behind."""
    check = _total_on_ranks("97.12")
    assert check(lambda a, b: a + b) == "added on 1 ranks' cases"
    with pytest.raises(CheckFailed, match=r"^total\(<\(1, 2\) on rank 0, ten times it on rank 1>\) gave \[1, 10\]$"):
        check(lambda a, b: a)
    with pytest.raises(CheckFailed, match="^the job of 2 processes failed: ValueError: rank 1 gave up: add them$"):
        check(_total_but_rank_1_raises)
    assert not list(Path(work_dir).rglob("rank-*"))


@contextlib.contextmanager
def _calls_seen(case, given):
    """An ``around`` that watches the call: what ``twice`` was called with, stopping it at the second call where the
    case says so (as a simulated rank stops at ``fit``)."""
    from unittest import mock

    from helpers.course.checks.ranks import FitStopped

    seen = Seen(calls=[])

    def twice(value):
        seen["calls"].append(value)
        if case[1] and len(seen["calls"]) == 2:
            raise FitStopped

    with mock.patch.object(sys.modules[__name__], "twice", twice, create=True):
        yield seen


def _twice_problem(case, got, given):
    if not isinstance(got, Watched):
        return f"was judged on {got!r}, not on what was seen"
    return None if got.seen["calls"] == [case[0]] * 2 else f"called twice({got.seen['calls']}): call it twice"


def _calls_twice(value, stopped):
    twice(value)  # noqa: F821 - put here by _calls_seen
    twice(value)  # noqa: F821
    return "done"


def _calls_once(value, stopped):
    twice(value)  # noqa: F821
    return "done"


@pytest.mark.parametrize("processes", [0, 2])
def test_what_around_sees_of_a_call_reaches_the_judge_in_process_and_from_ranks(work_dir, processes):
    """A record ``around`` yields reaches the judge with what the call returned (from every rank's report), and a
    call that ``around`` stops where it has seen enough returned nothing, which a check of what a call does judges."""
    declared = dict(
        answer="work",
        fixed=[(3, False), (4, True)],
        judge=lambda case, got, given: (
            _twice_problem(case, got, given)
            if not processes
            else next((p for p in (_twice_problem(case, g, given) for g in got) if p), None)
        ),
        around=_calls_seen,
        effect_only=True,
        show=lambda case: str(case[0]),
        hint="call it twice",
        passed="{n} calls watched",
    )
    if processes:
        declared.update(processes=processes, launch=_in_turn)
    check = FunctionCheck("97.13", **declared)
    assert check(_calls_twice) == "2 calls watched"
    with pytest.raises(CheckFailed, match=r"^work\(3\) called twice\(\[3\]\): call it twice$"):
        check(_calls_once)
    assert not hasattr(sys.modules[__name__], "twice")


def test_a_context_that_yields_something_else_leaves_the_result_as_it_is():
    """Only a :class:`Seen` is what ``around`` saw: a context that yields a value of its own (a mock) does not
    change what the judge gets."""
    check = FunctionCheck(
        "97.14",
        answer="double",
        fixed=[(2,)],
        reference=lambda n: 2 * n,
        around=lambda case, given: contextlib.nullcontext({"not": "seen"}),
        hint="double it",
        passed="doubled",
    )
    assert check(lambda n: n + n) == "doubled"


def test_a_failure_in_a_hinted_block_gets_the_hint_and_nothing_else_changes():
    with pytest.raises(CheckFailed, match=r"^the test job failed: ValueError: no: read the shard$"):
        with checks.hinted("read the shard"):
            raise CheckFailed("the test job failed: ValueError: no.")
    with pytest.raises(CheckFailed, match=r"^rank 1 raised: rank 1 raised, so fix rank 1$"):
        with checks.hinted(lambda error: f"{error}, so fix rank 1"):
            raise CheckFailed("rank 1 raised")
    with pytest.raises(checks.Delegated, match=r"^write it yourself$"):
        with checks.hinted("read the shard"):
            raise checks.Delegated("write it yourself")
    with pytest.raises(KeyError):
        with checks.hinted("read the shard"):
            raise KeyError("the check's own bug")


def _halved(n: int) -> set[int]:
    """A reference with two right results at a half."""
    return {n // 2, -(-n // 2)}


def _halves_check(exercise_id: str, reference=_halved, **more) -> FunctionCheck:
    return FunctionCheck(
        exercise_id,
        answer="half",
        fixed=[(4,), (5,)],
        draw=lambda rng: (rng.randint(6, 10**6),),
        draws=5,
        reference=reference,
        forbid=("helpers.loaders:steps_per_epoch",),
        hint=lambda case, got: f"split the {case[0]} in two",
        passed="halved {n} numbers",
        **more,
    )


def test_a_declared_check_meets_the_same_cases_every_run_drawn_from_its_exercise_id():
    cases = _halves_check("97.1").cases()
    assert cases[:2] == [(4,), (5,)] and len(cases) == 7
    assert cases == _halves_check("97.1").cases()
    assert cases[2:] != _halves_check("97.2").cases()[2:]


@pytest.mark.parametrize(
    "answer, status, message",
    [
        (lambda n: n // 2, PASSED, "halved 7 numbers"),
        (lambda n: float(-(-n // 2)), PASSED, "halved 7 numbers"),  # the other right result at a half, as a float
        (lambda n: n + 1, FAILED, "half(4) = 5, expected 2: split the 4 in two"),
        (lambda n: n / 2, FAILED, "half(5) returned 2.5: return a whole number"),
        (lambda n: print(n), NOT_ATTEMPTED, "half returns nothing yet: add a return"),
        (lambda n: n // 2 + n % 2 * 9, FAILED, "half(5) = 11, expected 2 or 3: split the 5 in two"),
        (lambda n: str(n // 2), FAILED, "half(4) returned '2': return a whole number"),
        (lambda n: [][n], FAILED, "half(4) raised IndexError: list index out of range; expected 2: split the 4 in two"),
        (
            lambda n: __import__("helpers.loaders").loaders.steps_per_epoch(n, 2, 1),
            FAILED,
            "your answer calls helpers.loaders.steps_per_epoch, which does this exercise for you: write it yourself",
        ),
    ],
)
def test_a_declared_check_names_the_call_what_came_back_and_the_hint(answer, status, message):
    register("97.3")(_halves_check("97.3"))
    assert checks._run("97.3", {"half": answer}) == (status, message)


def test_a_declared_check_refuses_a_stub_and_blames_itself_for_its_own_bug():
    def half(n): ...

    register("97.4")(_halves_check("97.4", reference=lambda n: n.bad_attribute))
    assert checks._run("97.4", {"half": half})[0] == NOT_ATTEMPTED
    status, message = checks._run("97.4", {"half": lambda n: n // 2})
    assert status == ERROR and message.startswith("the check itself failed (AttributeError"), message


def _tail_check(exercise_id: str) -> FunctionCheck:
    return FunctionCheck(
        exercise_id,
        answer="last",
        fixed=[([3, 1, 2],), (list(range(20, 0, -1)),), (list(range(60, 0, -1)),)],
        reference=lambda values: values[-1],
        hint="return the last item",
        passed="last of {n} lists",
    )


def test_a_declared_check_shows_the_case_as_it_was_given_and_a_long_list_by_its_first_items():
    def last_after_sorting(values):
        values.sort()
        return values[-1]

    register("97.5")(_tail_check("97.5"))
    assert checks._run("97.5", {"last": lambda values: values.pop()}) == (PASSED, "last of 3 lists")
    assert checks._run("97.5", {"last": last_after_sorting}) == (
        FAILED,
        "last([3, 1, 2]) = 3, expected 2: return the last item",
    )
    assert checks._run("97.5", {"last": lambda values: values[-1] if len(values) < 5 else 0}) == (
        FAILED,
        f"last({list(range(20, 0, -1))}) = 0, expected 1: return the last item",  # short enough to show whole
    )
    assert checks._run("97.5", {"last": lambda values: values[-1] if len(values) < 50 else 0}) == (
        FAILED,
        "last([60, 59, 58, 57, 56, 55, ... (60 items)]) = 0, expected 1: return the last item",
    )


def _runs_in(namespace) -> list[Case]:
    """The namespace's own cases: each run's number, with its right result and why where it brought one."""
    return [Case((n,), expected, f"run {n} says so" if expected else "") for n, expected in namespace.get("runs", [])]


def test_a_declared_check_meets_the_namespace_s_own_cases_last_with_their_own_result_and_why():
    register("97.9")(_halves_check("97.9", from_namespace=_runs_in, passed_namespace=" and {m} runs"))
    floor = lambda n: n // 2  # noqa: E731
    assert checks._run("97.9", {"half": floor}) == (PASSED, "halved 7 numbers")
    assert checks._run("97.9", {"half": floor, "runs": [(8, None), (9, {4, 7})]}) == (
        PASSED,
        "halved 7 numbers and 2 runs",
    )
    assert checks._run("97.9", {"half": floor, "runs": [(9, {7})]}) == (
        FAILED,
        "half(9) = 4, expected 7: run 9 says so",  # its own result, instead of the reference's 4 or 5
    )
    assert checks._run("97.9", {"half": lambda n: 0 if n == 8 else n // 2, "runs": [(8, None)]}) == (
        FAILED,
        "half(8) = 0, expected 4: split the 8 in two",  # the reference's result and the check's hint
    )


def test_a_declared_check_may_say_what_the_namespace_s_own_cases_showed():
    def said(own: list[Case]) -> str:
        return "; the runs halve to " + ", ".join(str(case.args[0] // 2) for case in own)

    register("97.8")(_halves_check("97.8", from_namespace=_runs_in, passed_namespace=said))
    floor = lambda n: n // 2  # noqa: E731
    assert checks._run("97.8", {"half": floor}) == (PASSED, "halved 7 numbers")
    assert checks._run("97.8", {"half": floor, "runs": [(8, None), (12, None)]}) == (
        PASSED,
        "halved 7 numbers; the runs halve to 4, 6",
    )


def test_a_declared_check_calls_with_arguments_made_from_the_case_and_judges_what_it_collects():
    def doubled_problem(case: tuple, got, given: tuple) -> str | None:
        if not isinstance(got, tuple):
            return f"returned {type(got).__name__}: return a generator"
        return None if got == tuple(2 * n for n in range(case[0])) else f"gave {got}: double each number"

    made, cleaned = [], []
    check = FunctionCheck(
        "97.7",
        answer="doubled",
        fixed=[(3,), (5,)],
        arguments=lambda case: (made.append(case[0]) or iter(range(case[0])),),  # made fresh for each call
        cleanup=lambda case, given: cleaned.append(given),
        collect=lambda got, case: tuple(got) if hasattr(got, "__next__") else got,  # run lazily, inside the tripwire
        judge=doubled_problem,
        show=lambda case: f"<iterator over {case[0]} numbers>",
        hint="yield each number twice over",
        passed="doubled {n} streams",
    )
    register("97.7")(check)
    assert checks._run("97.7", {"doubled": lambda numbers: (2 * n for n in numbers)}) == (PASSED, "doubled 2 streams")
    assert made == [3, 5] and len(cleaned) == 2  # what was made for each call is undone once it is judged
    assert checks._run("97.7", {"doubled": lambda numbers: [2 * n for n in numbers]}) == (
        FAILED,
        "doubled(<iterator over 3 numbers>) returned list: return a generator",
    )
    assert checks._run("97.7", {"doubled": lambda numbers: (2 // (n - 1) for n in numbers)}) == (
        FAILED,  # raised while the check collected it: the answer's error, with the hint
        "doubled(<iterator over 3 numbers>) raised ZeroDivisionError: integer division or modulo by zero: "
        "yield each number twice over",
    )
    with pytest.raises(TypeError, match="declare show= too"):
        FunctionCheck("97.7", answer="doubled", fixed=[], arguments=tuple, judge=doubled_problem, hint="", passed="")


def test_a_declared_check_runs_every_call_of_the_answer_in_the_context_of_its_case():
    entered: list[tuple] = []

    @contextlib.contextmanager
    def around(case, given):
        entered.append((case, given))
        os.environ[case[0]] = "set"
        try:
            yield
        finally:
            del os.environ[case[0]]

    register("97.4")(
        FunctionCheck(
            "97.4",
            answer="env",
            fixed=[("COURSE_CHECK_AROUND",), ("COURSE_CHECK_AROUND_TOO",)],
            reference=lambda name: "set",
            returns=Returns("a str", lambda got: isinstance(got, str), lambda got, expected: got == expected),
            around=around,
            hint="read it",
            passed="read {n} times",
        )
    )
    assert checks._run("97.4", {"env": lambda name: os.environ.get(name, "")}) == (PASSED, "read 2 times")
    assert entered == [(("COURSE_CHECK_AROUND",),) * 2, (("COURSE_CHECK_AROUND_TOO",),) * 2]
    assert "COURSE_CHECK_AROUND" not in os.environ and "COURSE_CHECK_AROUND_TOO" not in os.environ


def test_a_check_of_what_a_call_does_judges_an_answer_that_returns_nothing():
    def appended_problem(case, got, given):
        return None if given[0] == [*case[0], case[1]] else f"left the list as {given[0]}: append the item"

    declared = dict(answer="append", fixed=[([1, 2], 3)], judge=appended_problem, hint="append it", passed="appended")
    register("97.8")(FunctionCheck("97.8", effect_only=True, **declared))
    assert checks._run("97.8", {"append": lambda items, item: items.append(item)}) == (PASSED, "appended")
    assert checks._run("97.8", {"append": lambda items, item: items.extend([])}) == (
        FAILED,
        "append([1, 2], 3) left the list as [1, 2]: append the item",
    )
    register("97.8")(FunctionCheck("97.8", **declared))  # a result asked for: returning None is not written yet
    assert checks._run("97.8", {"append": lambda items, item: items.append(item)})[0] == NOT_ATTEMPTED


def test_a_declared_call_passes_keyword_arguments_on():
    register("97.9")(
        FunctionCheck(
            "97.9",
            answer="apply",
            fixed=[(3,)],
            arguments=lambda case: Call((lambda *, by: by * 2,), {"by": case[0]}),
            reference=lambda by: 6,
            show=lambda case: f"double, by={case[0]}",
            hint="call fn(**kwargs)",
            passed="applied",
        )
    )
    assert checks._run("97.9", {"apply": lambda fn, **kwargs: fn(**kwargs)}) == (PASSED, "applied")
    assert checks._run("97.9", {"apply": lambda fn, **kwargs: fn(by=1)}) == (
        FAILED,
        "apply(double, by=3) = 2, expected 6: call fn(**kwargs)",
    )


def test_calls_made_as_ranks_are_declared_with_their_job():
    declared = dict(answer="mean", fixed=[(1, 2)], hint="", passed="")
    with pytest.raises(TypeError, match="declare launch= and a judge="):
        FunctionCheck("97.10", processes=2, judge=lambda case, got, given: None, **declared)
    with pytest.raises(TypeError, match="declare launch= and a judge="):
        FunctionCheck("97.10", processes=2, launch=lambda processes, job, kwargs: None, reference=max, **declared)


def _failing_launch(error: Exception):
    def launch(processes, job, kwargs):
        raise error

    return launch


def test_a_job_that_fails_gets_the_hint_and_what_was_made_is_cleaned_up():
    """The launcher names the rank and its error; the check adds its hint (a delegated answer keeps its own
    message), and cleans up what it made for the calls either way."""
    cleaned = []
    declared = dict(
        answer="mean",
        fixed=[(1, 2)],
        calls=lambda case: [case, case],
        show=str,
        judge=lambda case, got, given: None,
        processes=2,
        cleanup=lambda case, made: cleaned.append(case),
        hint="average over every rank",
        passed="",
    )
    failed = FunctionCheck(
        "97.11", launch=_failing_launch(CheckFailed("rank 1 of 2 raised ValueError: no")), **declared
    )
    with pytest.raises(CheckFailed, match="^rank 1 of 2 raised ValueError: no: average over every rank$"):
        failed(lambda a, b: a)
    delegated = FunctionCheck("97.11", launch=_failing_launch(checks.Delegated("your answer calls h")), **declared)
    with pytest.raises(checks.Delegated, match="^your answer calls h$"):
        delegated(lambda a, b: a)
    assert cleaned == [(1, 2), (1, 2)]


def test_an_exercise_of_two_functions_is_checked_one_after_the_other():
    register("97.3")(FunctionChecks((_halves_check("97.3"), _tail_check("97.3"))))
    floor, last = (lambda n: n // 2), (lambda values: values[-1])  # noqa: E731
    assert checks._run("97.3", {"half": floor, "last": last}) == (PASSED, "halved 7 numbers; last of 3 lists")
    assert checks._run("97.3", {"half": floor, "last": lambda values: values[0]}) == (
        FAILED,
        "last([3, 1, 2]) = 3, expected 2: return the last item",
    )
    assert checks._run("97.3", {"half": floor})[0] == NOT_ATTEMPTED  # the second function not written yet


def test_a_class_with_a_method_still_a_stub_is_not_attempted():
    class Square:
        def __init__(self, side):
            self.side = side

        def area(self): ...

    class Written(Square):
        def area(self):
            return self.side**2

    register("97.2")(
        FunctionCheck(
            "97.2",
            answer="Square",
            fixed=[(3,)],
            collect=lambda square, case: square.area(),
            reference=lambda side: side**2,
            methods=("__init__", "area"),
            hint="multiply the side by itself",
            passed="{n} areas",
        )
    )
    assert checks._run("97.2", {"Square": Square}) == (
        NOT_ATTEMPTED,
        "test_a_class_with_a_method_still_a_stub_is_not_attempted.<locals>.Square.area is not written yet",
    )
    assert checks._run("97.2", {"Square": Written}) == (PASSED, "1 areas")


def test_a_case_of_several_calls_is_judged_on_all_of_their_results_together():
    def slices_problem(case: tuple, got: list, given: list) -> str | None:
        values = [value for part in got for value in part]
        return None if sorted(values) == list(range(case[0])) else f"gave {got}: together, every number once"

    register("97.1")(
        FunctionCheck(
            "97.1",
            answer="part",
            fixed=[(6, 2), (7, 3)],
            calls=lambda case: [(case[0], index, case[1]) for index in range(case[1])],
            judge=slices_problem,
            show=lambda case: f"{case[0]}, <each part>, {case[1]}",
            hint="take every count-th number from index",
            passed="{n} splits",
        )
    )
    strided = lambda n, index, count: list(range(index, n, count))  # noqa: E731
    assert checks._run("97.1", {"part": strided}) == (PASSED, "2 splits")
    assert checks._run("97.1", {"part": lambda n, index, count: list(range(0, n, count))}) == (
        FAILED,
        "part(6, <each part>, 2) gave [[0, 2, 4], [0, 2, 4]]: together, every number once",
    )
    assert checks._run("97.1", {"part": lambda n, index, count: strided(n, index, count) if index else None})[0] == (
        NOT_ATTEMPTED  # a call that returns nothing
    )


def test_a_check_whose_cases_all_come_from_the_notebook_asks_for_the_notebook():
    register("97.0")(dataclasses.replace(_halves_check("97.0", from_namespace=_runs_in), fixed=[], draws=0))
    floor = lambda n: n // 2  # noqa: E731
    assert checks._run("97.0", floor) == (
        NOT_ATTEMPTED,
        'check 97.0 reads the notebook\'s names: check("97.0", globals())',
    )
    assert checks._run("97.0", {"half": floor, "runs": [(8, None)]}) == (PASSED, "halved 0 numbers")


def test_what_was_made_for_a_call_is_cleaned_up_when_making_the_next_fails():
    cleaned = []

    def made(case):
        if case[0] == 5:
            raise RuntimeError("the check's own failure")
        return case

    register("96.9")(
        dataclasses.replace(
            _halves_check("96.9"), draws=0, arguments=made, show=str, cleanup=lambda case, given: cleaned.append(case)
        )
    )
    assert checks._run("96.9", {"half": lambda n: n // 2})[0] == ERROR
    assert cleaned == [(4,)]


def test_a_raised_error_shows_its_first_line_only():
    def raises(values):
        raise ValueError("no good\n  the plan, line by line\n  and more")

    register("97.5")(_tail_check("97.5"))
    assert checks._run("97.5", {"last": raises}) == (
        FAILED,
        "last([3, 1, 2]) raised ValueError: no good; expected 2: return the last item",
    )


def test_a_judge_sees_the_case_as_given_and_the_objects_the_answer_was_given():
    def same_list_summed(case: tuple, got, given: tuple) -> str | None:
        if got is not given[0]:
            return "returned another list: return the one given"
        return None if sum(got) == sum(case[0]) else f"summed to {sum(got)}, expected {sum(case[0])}: change nothing"

    check = FunctionCheck(
        "97.6",
        answer="itself",
        fixed=[([1, 2],)],
        judge=same_list_summed,
        hint="return it",
        passed="returned {n} lists",
    )
    register("97.6")(check)
    assert checks._run("97.6", {"itself": lambda values: values}) == (PASSED, "returned 1 lists")
    assert checks._run("97.6", {"itself": lambda values: list(values)}) == (
        FAILED,
        "itself([1, 2]) returned another list: return the one given",
    )

    def changes_it(values):
        values[0] = 5
        return values

    # judged on the case as it was given: an answer cannot pass by changing what it is judged on
    assert checks._run("97.6", {"itself": changes_it}) == (
        FAILED,
        "itself([1, 2]) summed to 7, expected 3: change nothing",
    )


def _even_pair(case: tuple, got, _given: tuple) -> str | None:
    """A judge: any pair of even numbers that sums to the case's number is right."""
    if not isinstance(got, tuple) or len(got) != 2:
        return f"returned {got!r}: return a pair"
    if sum(got) != case[0] or any(part % 2 for part in got):
        return f"= {got!r}: two even numbers that sum to {case[0]}"
    return None


def _pairs_check(exercise_id: str, judge=_even_pair) -> FunctionCheck:
    return FunctionCheck(
        exercise_id,
        answer="pair",
        fixed=[(4,), (10,)],
        judge=judge,
        forbid=("helpers.loaders:steps_per_epoch",),
        hint="split it into two even numbers",
        passed="{n} pairs",
    )


@pytest.mark.parametrize(
    "answer, status, message",
    [
        (lambda n: (n, 0), PASSED, "2 pairs"),
        (lambda n: (2, n - 2), PASSED, "2 pairs"),  # another right result: the judge, not one reference, decides
        (lambda n: (n - 1, 1), FAILED, "pair(4) = (3, 1): two even numbers that sum to 4"),
        (lambda n: [n, 0], FAILED, "pair(4) returned [4, 0]: return a pair"),
        (lambda n: print(n), NOT_ATTEMPTED, "pair returns nothing yet: add a return"),
        (
            lambda n: (n // 0, 0),
            FAILED,
            "pair(4) raised ZeroDivisionError: integer division or modulo by zero: split it into two even numbers",
        ),  # fmt: skip
        (
            lambda n: (__import__("helpers.loaders").loaders.steps_per_epoch(n, 2, 1), 0),
            FAILED,
            "your answer calls helpers.loaders.steps_per_epoch, which does this exercise for you: write it yourself",
        ),
    ],
)
def test_a_judged_check_says_what_is_wrong_with_what_came_back(answer, status, message):
    register("97.5")(_pairs_check("97.5"))
    assert checks._run("97.5", {"pair": answer}) == (status, message)


def test_a_judged_check_blames_itself_for_its_judge_s_bug_and_refuses_a_second_verdict():
    register("97.6")(_pairs_check("97.6", judge=lambda case, got, given: got.bad_attribute))
    status, message = checks._run("97.6", {"pair": lambda n: (n, 0)})
    assert status == ERROR and message.startswith("the check itself failed (AttributeError"), message
    with pytest.raises(TypeError, match="declare a reference or a judge, not both"):
        FunctionCheck("97.7", answer="pair", fixed=[(4,)], judge=_even_pair, reference=_halved, hint="", passed="")
