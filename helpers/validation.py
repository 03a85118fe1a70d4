"""Checks of user input shared by every helper: each raises :class:`~helpers.CourseInputError` with one line that
says what is wrong and what to pass instead."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

from helpers import CourseInputError

__all__ = ["check_flag", "one_of", "whole_number"]


def check_flag(name: str, value: Any, allow_none: bool = False) -> None:
    """Refuse a flag that is not True or False.

    A flag such as ``use_gpu`` given as ``"yes"`` or ``1`` is a mistake, not a truthy value.

    Args:
        name: the parameter's name, for the message.
        value: what the caller passed.
        allow_none: also accept None ("decide for me").

    Raises:
        CourseInputError: ``value`` is not a bool (nor None with ``allow_none``).
    """
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        extra = ", or None to use a GPU when there is one" if allow_none else ""
        raise CourseInputError(f"{name}={value!r}: pass True or False{extra}.")


def whole_number(name: str, value: Any, minimum: int = 1, hint: str = "") -> int:
    """``value`` as an int, if it is a whole number of at least ``minimum`` (numpy integers count; True does not).

    Args:
        name: the parameter's name, for the message.
        value: what the caller passed.
        minimum: the smallest value allowed.
        hint: a sentence added to the message, e.g. what the number means.

    Returns:
        ``value`` as a Python int.

    Raises:
        CourseInputError: ``value`` is a bool, not integral, or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        extra = f" {hint}" if hint else ""
        raise CourseInputError(f"{name}={value!r}: pass a whole number of at least {minimum}.{extra}")
    return int(value)


def one_of(name: str, value: Any, choices: Iterable[Any], hint: str = "") -> Any:
    """``value``, if it is one of ``choices``.

    Args:
        name: the parameter's name, for the message.
        value: what the caller passed.
        choices: the values allowed.
        hint: a sentence added to the message, e.g. what each choice does.

    Returns:
        ``value`` unchanged.

    Raises:
        CourseInputError: ``value`` is not among ``choices``.
    """
    choices = tuple(choices)
    if value not in choices:
        extra = f" {hint}" if hint else ""
        raise CourseInputError(f"{name}={value!r}: use one of {', '.join(map(repr, choices))}.{extra}")
    return value
