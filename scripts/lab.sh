#!/usr/bin/env bash
# JupyterLab for the course, the one way it is started: `make lab`, and tests/test_browser.py (which adds a port).
# Listens on 127.0.0.1 only and asks for a token (a random one, shown in the URL it prints, or $JUPYTER_TOKEN);
# the repository is its root. Runs as root too (containers, cloud machines): Jupyter refuses that without
# --allow-root. Extra arguments go to `jupyter lab` (e.g. --port 8890).
set -euo pipefail

PYTHON=${PYTHON:-.venv/bin/python}
cd "$(dirname "$0")/.."
args=(--ip 127.0.0.1 --no-browser --ServerApp.root_dir .)
if [ "$(id -u)" = 0 ]; then
  args+=(--allow-root)
fi
exec "$PYTHON" -m jupyter lab "${args[@]}" "$@"
