# One-command set-up for the course. `make course` for attendees, `make test` for CI (see README.md).
SHELL := /bin/bash
PY := .venv/bin/python
SETUP_DONE := .venv/.setup-done
DEEPSPEED_OP_DONE := .venv/.deepspeed-op-done
KERNEL_DONE := .venv/.kernel-done
GPU ?= 0

.PHONY: setup course lint test test-fast test-lesson lessons lab mlflow clean bench test-packages

setup: $(SETUP_DONE) $(KERNEL_DONE) $(DEEPSPEED_OP_DONE)

# Re-runs only when the pins, the package metadata or the Horovod build script change: seconds otherwise.
$(SETUP_DONE): requirements.txt pyproject.toml scripts/install_horovod.sh
	@command -v java >/dev/null || [ -n "$$JAVA_HOME" ] || echo "note: no Java found; Spark needs Java 17 (see README, Troubleshooting)"
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	GPU=$(GPU) PYTHON=$(PY) scripts/install_horovod.sh
	touch $@

# The course's Jupyter kernel, registered again whenever how it is registered or the warnings it ignores change.
# PYDEVD_DISABLE_FILE_VALIDATION: no debugger note about frozen modules each time ipykernel starts.
$(KERNEL_DONE): $(SETUP_DONE) Makefile helpers/logs.py
	PYDEVD_DISABLE_FILE_VALIDATION=1 $(PY) -m ipykernel install --sys-prefix --name scaling-dl-spark \
		--display-name "Scaling DL on Spark" --env PYDEVD_DISABLE_FILE_VALIDATION 1 \
		--env PYTHONWARNINGS "$$($(PY) -c 'from helpers.logs import python_warnings; print(python_warnings())')" >/dev/null
	touch $@

# DeepSpeed's CPU communication op, built once (about a minute) where helpers.deepspeed_train.ops_build_dir() says,
# instead of in lesson 6's first job.
$(DEEPSPEED_OP_DONE): $(SETUP_DONE) helpers/deepspeed_train.py
	$(PY) -m helpers.deepspeed_train --build-ops
	touch $@

# Executes every solution notebook on the embedded data into build/ (the environment check first).
course: setup
	$(PY) -m helpers.course run --params params/laptop.yaml --out build

# ruff's lint and format check (configured in pyproject.toml); part of both test targets.
lint: setup
	$(PY) -m ruff check --quiet .
	$(PY) -m ruff format --check --quiet .

# Debian's chromium (the browser test) and nftables (the multi-host firewall faults); nothing to do once installed.
test-packages:
	scripts/install_test_packages.sh

# The multi-host cluster's tests alone first: its hosts share these cores, and the heartbeat and stall bounds they
# test are not to be measured against the rest of the suite's load. Then the rest on two pytest-xdist workers
# (tests/conftest.py keeps each module's tests on one worker); the slowest tests listed last.
test: lint test-packages
	$(PY) -m helpers.course build --check
	$(PY) -m pytest -q -m multihost --durations=10; hosts=$$?; \
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not multihost" --durations=25 && [ $$hosts -eq 0 ]

# The inner loop (< 3 min on 2 cores): everything not marked slow (no notebook runs, no multi-process trainings).
test-fast: lint
	$(PY) -m helpers.course build --check
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow"

# One lesson's tests for the inner loop (its notebook runs, its answer corpus, the helpers and launchers it teaches
# with; tests/conftest.py lists them), e.g. `make test-lesson L=4`.
test-lesson: lint
	$(PY) -m pytest -q -n 2 --dist loadgroup --lesson $(L)

lessons: setup
	$(PY) -m helpers.course build

# 127.0.0.1 only, with a token, as root too; tests/test_browser.py starts it with the same script.
lab: setup
	PYTHON=$(PY) scripts/lab.sh

# Benchmarks (not tests): loading (32 and 224 px), Lightning overhead, Horovod scaling, course timings, grading a
# class, and Ray Train vs TorchDistributor vs Horovod -> benchmarks/results.md.
bench: setup
	$(PY) -m benchmarks

mlflow: setup
	$(PY) -m mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri "$$($(PY) -c 'from helpers.tracking import tracking_uri; print(tracking_uri())')"

# Removes build outputs and caches; keeps work/ (your lake tables, checkpoints and MLflow runs).
clean:
	rm -rf build work/petastorm_cache .cache/horovod-build.log .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# GPU smoke check (any machine with one NVIDIA GPU, < 5 min): lesson 2's model with train(accelerator="gpu"), a
# HorovodRunner(np=-1) run with HorovodStrategy on the GPU, mixed precision, and lesson 6's DeepSpeed distributor
# (ZeRO stage 2, mixed precision); prints images/s. Skipped without a GPU. Build Horovod with NCCL first:
# make setup GPU=1.
.PHONY: gpu-smoke
gpu-smoke: setup
	$(PY) -m pytest -m gpu -s -q -p no:cacheprovider tests/test_gpu_smoke.py
