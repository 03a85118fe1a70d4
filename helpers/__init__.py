"""Helpers for the "Scaling Deep Learning on Spark" course.

Every lesson's real work lives here, one module per concern; the notebooks in ``solutions/`` and ``lessons/``
import from it and stay short.

Importing the package switches Ray Train to its current API (V2, ``RAY_TRAIN_V2_ENABLED=1``, read once when
``ray.train`` is first imported) unless the environment says otherwise: Ray 2.44's V1 API warns that
``ScalingConfig(trainer_resources)`` and ``RunConfig(verbose)`` are deprecated, and its trainer actor takes a CPU.

It also silences, in this process, what libraries say that a learner cannot act on: the warnings of
:data:`helpers.logs.LIBRARY_WARNINGS` (when they are raised after this import) and Ray's note that ipywidgets is
missing (the course's progress bars are text).
"""

import logging
import os

from helpers.logs import quiet_library_warnings

__all__ = ["RAY_TRAIN_V2", "CourseInputError"]

RAY_TRAIN_V2 = "RAY_TRAIN_V2_ENABLED"  # Ray Train's switch to its V2 API
os.environ.setdefault(RAY_TRAIN_V2, "1")
quiet_library_warnings()
# Ray logs "Missing packages: ['ipywidgets']" at INFO level in a kernel, for its rich widgets (ray.widgets.util)
logging.getLogger("ray.widgets").setLevel(logging.WARNING)


class CourseInputError(ValueError):
    """Bad input from a user of the course: the message is one line that says what is wrong and what to do."""

    def _render_traceback_(self) -> list[str]:
        """In a notebook (IPython asks for this): the one line, not a traceback; the message says what to do."""
        return [f"{type(self).__name__}: {self}"]
