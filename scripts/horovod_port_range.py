"""Patch Horovod's ``find_port`` (``horovod/runner/util/network.py`` of its sdist) to take its ports from
``COURSE_HOROVOD_PORTS=P-Q`` where that is set, so that Horovod on Spark can run behind a firewall that opens only
P..Q (docs/instructor.md, section 2, *Ports*). Unset, it keeps Horovod's own range, 1024-65535.
The course checks the value before it starts Horovod on Spark (:func:`helpers.ports.horovod_ports`).

Usage: python scripts/horovod_port_range.py PATH/TO/horovod/runner/util/network.py  (scripts/install_horovod.sh)
"""

import sys
from pathlib import Path

STOCK = "    min_port = 1024\n    max_port = 65536\n"
PINNED = "    min_port, max_port = _course_port_range()  # the course's build: COURSE_HOROVOD_PORTS\n"
RANGE = '''

def _course_port_range():
    """(P, Q + 1) of COURSE_HOROVOD_PORTS=P-Q (checked by helpers.ports.horovod_ports), else Horovod's own range."""
    import os

    value = os.environ.get("COURSE_HOROVOD_PORTS", "").strip()
    if not value:
        return 1024, 65536
    first, last = value.split("-")
    return int(first), int(last) + 1
'''


def main(path: str) -> None:
    source = Path(path)
    text = source.read_text()
    if STOCK not in text:
        sys.exit(f"{path}: Horovod's find_port has changed; update scripts/horovod_port_range.py for it.")
    source.write_text(text.replace(STOCK, PINNED) + RANGE)


if __name__ == "__main__":
    main(sys.argv[1])
