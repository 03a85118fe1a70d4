#!/usr/bin/env bash
# Builds horovod 0.28.1 from its PyPI sdist for the torch in $PYTHON's environment, caches the wheel under
# .cache/wheels/, and installs it. A second run installs the cached wheel without rebuilding.
#
# Two fixes that upstream made after 0.28.1 but never released:
#   - torch >= 2.1 headers need C++17 (CMAKE_CXX_STANDARD 14 -> 17 in both CMakeLists.txt, upstream PR #3998);
#   - CMake 4 refuses horovod's bundled gloo (cmake_minimum_required < 3.5): CMAKE_POLICY_VERSION_MINIMUM=3.5.
# One change of the course's own, for clusters behind a firewall: stock horovod.spark binds its driver service,
# rendezvous server and task services to random ports in 1024-65535 (horovod.runner.util.network.find_port);
# this build takes them from COURSE_HOROVOD_PORTS=P-Q where it is set (scripts/horovod_port_range.py).
# GPU=1 builds the NCCL variant (needs CUDA and NCCL on the machine); otherwise Gloo on CPU only.
set -euo pipefail

PYTHON=${PYTHON:-.venv/bin/python}
GPU=${GPU:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
HOROVOD_VERSION=$(sed -n 's/^# build: horovod==//p' requirements.txt)

torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__.replace("+", "_"))')
variant=$([ "$GPU" = 1 ] && echo nccl || echo cpu)
cache="$root/.cache/wheels/horovod-$HOROVOD_VERSION-ports-torch-$torch_version-$variant"

installed=$("$PYTHON" -c 'import horovod.torch, horovod; print(horovod.__version__)' 2>/dev/null || true)
if [ "$installed" = "$HOROVOD_VERSION" ] && [ -f "$cache/.installed" ]; then
  exit 0
fi

wheel=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "Building horovod $HOROVOD_VERSION for torch $torch_version ($variant); about 2 minutes on 2 cores..."
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
  tar xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  "$PYTHON" scripts/horovod_port_range.py "$src/horovod/runner/util/network.py"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)"
  if [ "$GPU" = 1 ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
  mkdir -p "$cache"
  if ! "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$cache" "$src" >"$work/build.log" 2>&1; then
    grep -iE "error|failed" "$work/build.log" | head -15 >&2
    cp "$work/build.log" "$root/.cache/horovod-build.log"
    echo "horovod build failed (full log: .cache/horovod-build.log). Try: install cmake 3.25+ and g++ >= 9 (apt-get install cmake g++), then 'make setup' again." >&2
    exit 1
  fi
  wheel=$(ls "$cache"/horovod-*.whl | head -1)
fi
"$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$wheel"
# horovod's runtime dependencies (cloudpickle, psutil, pyyaml, packaging) come with the pinned requirements.
touch "$cache/.installed"
