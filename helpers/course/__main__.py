"""``python -m helpers.course {build,grade,run} ...``: see :mod:`helpers.course.cli`."""

import sys

from helpers.course.cli import main

if __name__ == "__main__":
    sys.exit(main())
