"""``python -m helpers.course {build,grade,run} ...``: see :mod:`helpers.course.cli`."""

import sys

from helpers.course.cli import main

__all__: list[str] = []  # a script: `python -m helpers.course` runs it

if __name__ == "__main__":
    sys.exit(main())
