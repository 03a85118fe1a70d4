"""``python -m helpers.course build [--check]``."""

import sys

from helpers.course.build import main

if __name__ == "__main__":
    sys.exit(main())
