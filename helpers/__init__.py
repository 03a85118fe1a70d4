"""Helpers for the "Scaling Deep Learning on Spark" course.

Every lesson's real work lives here, one module per concern; the notebooks in ``solutions/`` and ``lessons/``
import from it and stay short.
"""

__all__ = ["CourseInputError"]


class CourseInputError(ValueError):
    """Bad input from a user of the course: the message is one line that says what is wrong and what to do."""

    def _render_traceback_(self) -> list[str]:
        """In a notebook (IPython asks for this): the one line, not a traceback; the message says what to do."""
        return [f"{type(self).__name__}: {self}"]
