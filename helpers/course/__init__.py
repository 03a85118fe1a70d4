"""The course's tooling, apart from what the notebooks teach with (the rest of ``helpers``).

- :mod:`helpers.course.build`: ``lessons/`` generated from ``solutions/``, and the checks on both.
- :mod:`helpers.course.checks`: the exercise checks the notebooks' check cells call.
- :mod:`helpers.course.grade`: grading a class's submitted notebooks.
- :mod:`helpers.course.run`: running notebooks with papermill, and the solutions with a parameter file.
- :mod:`helpers.course.pages`: the solutions' generated markdown (the lessons' diagrams, drawn by
  :mod:`helpers.course.diagrams`, and the run time each header states); :mod:`helpers.course.refresh` updates it.
- :mod:`helpers.course.cli`: the one command line, ``python -m helpers.course {build,grade,pages,run} ...``.

The domain modules (the rest of ``helpers``) never import this package: ``tests/test_layout.py``.
"""

__all__ = ["build", "checks", "cli", "diagrams", "grade", "pages", "refresh", "run"]
