"""Whether an answer's code is the learner's own: not a course helper's code under another name, not a call of a
private course helper, not a method taken from the course's parent class.

The tripwire (:func:`helpers.course.checks.own_work`) catches an answer that *calls* the public helper doing the
exercise. What it cannot see, this module reads from the answer's byte code before the check runs it:

- **copied code**: a function (or method) of the answer whose byte code, names and constants are those of a course
  function: the helper's source pasted under another name. Docstrings, comments, line numbers and the function's
  own name do not count; a function shorter than :data:`MIN_INSTRUCTIONS` is never called a copy, because short
  code written from the exercise's own signature can match a helper by chance.
- **private helpers**: the answer's code names a module-level function or class of the ``helpers`` package whose
  name starts with ``_`` (however it was imported), or is one.
- **taken methods**: a class of the answer holds a course function in its own body (``step = Parent.step``).

The answer's code is followed into the notebook functions and classes it names, so wrapping a copy in a function of
one's own does not hide it.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["MIN_INSTRUCTIONS", "borrowed"]

#: Functions of fewer instructions than this are never called copies (``return max(1, round(n * f))`` is 11).
MIN_INSTRUCTIONS = 24

_PACKAGE = "helpers"
_COURSE = str(Path(__file__).resolve().parents[2])
_INTERPRETER = tuple({str(Path(root).resolve()) for root in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def borrowed(answer: Any) -> str | None:
    """Why ``answer`` is not the learner's own code, or None when it is.

    Args:
        answer: what a check receives: a function, a class, an instance, or any value (values without code are
            the learner's own by definition).

    Returns:
        A one-line hint ending in "write it yourself", or None.
    """
    course = _course_code()
    for code, namespace, taken in _answer_code(answer):
        if taken:
            return f"`{code.co_name}` is the course's {_module_of(code)}{code.co_qualname}: write it yourself"
        copy = course.get(_fingerprint(code))
        if copy is not None and _size(code) >= MIN_INSTRUCTIONS:
            return f"your `{code.co_name}` is the course's {copy} under another name: write it yourself"
        private = _private_helper(code, namespace)
        if private is not None:
            return f"your `{code.co_name}` calls {private}, a private course helper: write it yourself"
    return None


def _answer_code(answer: Any) -> Iterator[tuple[types.CodeType, dict[str, Any], bool]]:
    """``(code, globals, taken)`` for each code object of the answer: its functions and their nested code, its
    classes' own methods, and the notebook functions and classes they name. ``taken`` marks a course function the
    answer holds as its own: a private helper given as the answer, or a course base's method set in its class."""
    seen: set[int] = set()
    todo = [answer]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        item = item.func if isinstance(item, functools.partial) else item
        if not isinstance(item, (type, types.FunctionType, types.MethodType)) and _learners_class(type(item)):
            item = type(item)
        if isinstance(item, type):
            if _learners_class(item):
                yield from _taken_methods(item)
                todo += [fn for fn in map(_function_of, vars(item).values()) if fn is not None and _learners(fn)]
                todo += [base for base in item.__bases__ if _learners_class(base)]
            continue
        fn = _function_of(item)
        if fn is None:
            continue
        if not _learners(fn):
            if _is_private_helper(fn):
                yield fn.__code__, fn.__globals__, True
            continue
        for code in _nested(fn.__code__):
            yield code, fn.__globals__, False
            todo += [fn.__globals__[name] for name in code.co_names if name in fn.__globals__]


def _taken_methods(cls: type) -> Iterator[tuple[types.CodeType, dict[str, Any], bool]]:
    """The course functions a learner's class sets, in its own body, under a name a course base defines."""
    course_bases = [base for base in cls.__mro__[1:] if base.__module__.startswith(_PACKAGE + ".")]
    for name, value in vars(cls).items():
        fn = _function_of(value)
        if fn is not None and not _learners(fn) and any(name in vars(base) for base in course_bases):
            yield fn.__code__, fn.__globals__, True


def _function_of(value: Any) -> types.FunctionType | None:
    value = value.fget if isinstance(value, property) else value
    value = getattr(value, "__func__", value)
    return value if isinstance(value, types.FunctionType) else None


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


def _path(code: types.CodeType) -> str:
    return code.co_filename if code.co_filename.startswith("<") else str(Path(code.co_filename).resolve())


def _learners(fn: types.FunctionType) -> bool:
    """Written in a notebook or another file of the learner's, not in the course's package or a library."""
    return not _path(fn.__code__).startswith(("<frozen", _COURSE, *_INTERPRETER))


def _learners_class(cls: type) -> bool:
    if cls.__module__ == "__main__":
        return True
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return path is not None and not str(Path(path).resolve()).startswith((_COURSE, *_INTERPRETER))


def _fingerprint(code: types.CodeType) -> tuple:
    """What makes two functions the same code: byte code, names and constants; not names of the function, its
    file, its lines or its docstring."""
    consts = code.co_consts[1:] if code.co_consts and isinstance(code.co_consts[0], str) else code.co_consts
    return (
        code.co_code,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        tuple(_fingerprint(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c)) for c in consts),
    )


def _size(code: types.CodeType) -> int:
    return sum(1 for instruction in dis.get_instructions(code) if instruction.opname not in ("RESUME", "NOP"))


def _course_modules() -> list[types.ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if (name == _PACKAGE or name.startswith(_PACKAGE + ".")) and isinstance(module, types.ModuleType)
    ]


@functools.cache
def _course_code() -> dict[tuple, str]:
    """Fingerprint -> qualified name of every function, nested function and method in the course's source files
    (compiled, not imported: a copy of a module the notebook never loaded counts too)."""
    found: dict[tuple, str] = {}
    root = Path(_COURSE)
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for code in list(_nested(compile(path.read_text(encoding="utf-8"), str(path), "exec")))[1:]:
            found.setdefault(_fingerprint(code), f"{module}.{code.co_qualname}")
    return found


def _private_helper(code: types.CodeType, namespace: dict[str, Any]) -> str | None:
    """The private course helper ``code`` names, if any: a global bound to one, or ``_name`` read from a course
    module the code reaches (by a global name, an attribute of a course package, or an import)."""
    modules = {module.__name__: module for module in _course_modules()}
    reached = {name: modules[name] for name in code.co_names if name in modules}
    for name in code.co_names:
        value = namespace.get(name)
        if _is_private_helper(value):
            return f"{value.__module__}.{value.__name__}"
        if isinstance(value, types.ModuleType) and value.__name__ in modules:
            reached[value.__name__] = value
    while True:
        more = {
            getattr(module, name).__name__: getattr(module, name)
            for module in reached.values()
            for name in code.co_names
            if isinstance(getattr(module, name, None), types.ModuleType) and getattr(module, name).__name__ in modules
        }
        if more.keys() <= reached.keys():
            break
        reached.update(more)
    for module in reached.values():
        for name in code.co_names:
            value = getattr(module, name, None)
            if name.startswith("_") and _is_private_helper(value):
                return f"{value.__module__}.{value.__name__}"
    return None


def _is_private_helper(value: Any) -> bool:
    if not isinstance(value, (type, types.FunctionType)):
        return False
    name, module = value.__name__, getattr(value, "__module__", "") or ""
    in_course = module == _PACKAGE or module.startswith(_PACKAGE + ".")
    return in_course and name.startswith("_") and not name.startswith("__")


def _module_of(code: types.CodeType) -> str:
    """``helpers.x.`` for a code object of the course's file ``helpers/x.py``."""
    relative = Path(_path(code)).relative_to(Path(_COURSE).parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__") + "."
