# tfx-hpm: `make run` runs the taxi pipeline, `make test` runs the tests.
# Both create .venv (Python 3.10) and install the pinned lock first.

SHELL := /bin/bash
VENV := .venv
VPY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export PYTHONUNBUFFERED := 1
# Silence TF's C++ info logs; Python progress logging stays on.
export TF_CPP_MIN_LOG_LEVEL ?= 1

# The 3.10 interpreter: PYTHON=..., a working python3.10, or pyenv's 3.10
# (through the pyenv command, or its versions folder when pyenv is not on PATH).
PYTHON ?= $(shell \
  if python3.10 -c 'import sys' >/dev/null 2>&1; then command -v python3.10; \
  elif command -v pyenv >/dev/null 2>&1 && \
       PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.10(\.|$$)' | tail -1) \
       pyenv which python3.10 >/dev/null 2>&1; then \
    PYENV_VERSION=$$(pyenv versions --bare | grep -E '^3\.10(\.|$$)' | tail -1) pyenv which python3.10; \
  else \
    ls -1 "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.10*/bin/python3.10 2>/dev/null | tail -1; \
  fi)

RUN_ARGS ?=
PYTEST_ARGS ?=
# The pipeline image (kubeflow/Dockerfile); kubeflow.runner's default --image.
IMAGE ?= tfx-hpm:0.1.0
# docker when its daemon answers, else podman, else docker (to show its error).
CONTAINER_TOOL ?= $(shell \
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker; \
  elif command -v podman >/dev/null 2>&1; then echo podman; \
  elif command -v docker >/dev/null 2>&1; then echo docker; fi)
IMAGE_CONTEXT := build/image-context

.PHONY: help venv run run-stock lint test test-all test-conformance ci test-fast test-slow bench kubeflow image notebook clean

help:
	@echo "make run        # full Chicago taxi pipeline with tfx-hpm components (LocalDagRunner)"
	@echo "make run-stock  # the same pipeline with the stock Transform and Trainer"
	@echo "make lint       # ruff (.ruff.toml) and the import contracts (.importlinter)"
	@echo "make test       # the core test suite (at most 20 min on 2 cores)"
	@echo "make test-all   # core and extended tests in one session (at most 40 min)"
	@echo "make test-conformance  # TFX's own executor tests on ours (about 21 min, two workers)"
	@echo "make ci         # what CI runs: lint, test-all, then test-conformance without conformance_repeat"
	@echo "make test-fast  # tests without end-to-end pipeline runs and clusters"
	@echo "make bench      # side-by-side benchmarks -> benchmarks/results/"
	@echo "make kubeflow   # compile the pipeline for Kubeflow Pipelines (v2 JSON)"
	@echo "make notebook   # Jupyter on notebooks/ with the project venv (TF_USE_LEGACY_KERAS=1)"
	@echo "make image      # build the pipeline image IMAGE=$(IMAGE) (docker or podman)"

# setuptools and wheel first (the lock's sdists build with them), then the
# rest of the lock in two pip processes at once (pip is single-threaded);
# --no-deps, as the lock pins everything.
PIP_INSTALL := $(VPY) -m pip install --quiet --no-deps --disable-pip-version-check

$(VENV)/.installed: requirements.lock setup.py
	@if [ -z "$(PYTHON)" ]; then \
	  echo "error: no Python 3.10 found. Install it (e.g. 'pyenv install 3.10.13')" \
	       "or pass PYTHON=/path/to/python3.10." >&2; exit 1; fi
	@"$(PYTHON)" -c 'import sys; assert sys.version_info[:2] == (3, 10), sys.version' || \
	  { echo "error: $(PYTHON) is not Python 3.10; TFX 1.16 needs 3.10." >&2; exit 1; }
	@echo "Creating $(VENV) with $(PYTHON) and installing requirements.lock (about 3 min)..."
	"$(PYTHON)" -m venv $(VENV)
	$(PIP_INSTALL) $$(grep -E '^(setuptools|wheel)==' requirements.lock)
	grep -vE '^(#|setuptools==|wheel==|$$)' requirements.lock > $(VENV)/lock.txt
	awk 'NR % 2' $(VENV)/lock.txt > $(VENV)/lock-1.txt
	awk '!(NR % 2)' $(VENV)/lock.txt > $(VENV)/lock-2.txt
	@set -e; $(PIP_INSTALL) -r $(VENV)/lock-1.txt & first=$$!; \
	  $(PIP_INSTALL) -r $(VENV)/lock-2.txt; wait $$first
	$(PIP_INSTALL) --no-build-isolation -e .
	@touch $@

venv: $(VENV)/.installed

run: venv
	$(VPY) -m pipelines.local_runner $(RUN_ARGS)

run-stock: venv
	$(VPY) -m pipelines.local_runner --stock --pipeline-root outputs/pipeline_stock $(RUN_ARGS)

# JUnit XML per target; `test-all` ends with the slowest tests and each set's
# time. It runs the core and extended sets in one session (core first within
# each file), so shared fixtures (Ray cluster, baselines, pipeline upstream)
# are built once.
TEST_RESULTS := outputs/test-results
# Two test processes (pytest-xdist), each file's tests in one of them so its
# module fixtures are built once: most tests leave half of the 2 cores idle
# (Python-bound Beam runs, process start-ups). TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

CORE := not extended and not conformance

# pyflakes and pycodestyle at 80 columns over every Python folder, then the
# import contracts (components do not import each other).
LINTED := components pipelines kubeflow benchmarks tests
lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/lint-imports --no-cache

test: venv
	$(VPY) -m pytest tests $(XDIST) -m "$(CORE)" --junitxml=$(TEST_RESULTS)/core.xml $(PYTEST_ARGS)

test-all: venv
	@status=0; \
	$(VPY) -m pytest tests $(XDIST) -m "not conformance" --junitxml=$(TEST_RESULTS)/all.xml $(PYTEST_ARGS) || status=$$?; \
	$(VPY) -m tests.support.timing_report $(TEST_RESULTS)/all.xml; \
	exit $$status

# TFX's own Trainer and Transform executor tests on ours (tests/test_tfx_conformance.py;
# its quick ones are in the core set): one file, so its tests go to the
# workers one by one. CONFORMANCE picks the set (a marker expression).
CONFORMANCE ?= conformance
test-conformance: venv
	@status=0; \
	$(VPY) -m pytest tests $(if $(XDIST),-n $(TEST_WORKERS) --dist load) -m "$(CONFORMANCE)" --junitxml=$(TEST_RESULTS)/conformance.xml $(PYTEST_ARGS) || status=$$?; \
	$(VPY) -m tests.support.timing_report $(TEST_RESULTS)/conformance.xml; \
	exit $$status

# What CI runs (.ci/run): the lint gate, the whole suite, then the
# conformance tests but the `conformance_repeat` ones (the 90-minute limit).
ci: lint test-all
	$(MAKE) test-conformance CONFORMANCE="conformance and not conformance_repeat"

test-fast: venv
	$(VPY) -m pytest tests -m "not slow and not extended and not conformance" $(PYTEST_ARGS)

test-slow: venv
	$(VPY) -m pytest tests -m slow $(PYTEST_ARGS)

bench: venv
	$(VPY) -m benchmarks.run_all $(BENCH_ARGS)

kubeflow: venv
	$(VPY) -m kubeflow.runner --output outputs/kubeflow/taxi_hpm_pipeline.json

# Only what the image needs goes into the build context (no .venv, outputs).
image:
	@if [ -z "$(CONTAINER_TOOL)" ]; then \
	  echo "error: 'make image' needs docker or podman; neither is installed." >&2; exit 1; fi
	@if [ "$(CONTAINER_TOOL)" = docker ] && ! docker info >/dev/null 2>&1; then \
	  echo "error: docker is installed but its daemon does not answer ('docker info'" \
	       "fails): start it, or install podman (CONTAINER_TOOL=podman)." >&2; exit 1; fi
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)
	tar --exclude=__pycache__ --exclude='*.pyc' --exclude=benchmarks/results -cf - \
	  requirements.lock setup.py components pipelines kubeflow benchmarks | tar -xf - -C $(IMAGE_CONTEXT)
	$(CONTAINER_TOOL) build -f kubeflow/Dockerfile -t $(IMAGE) $(IMAGE_CONTEXT)

# The kernel is the venv's python3 and inherits TF_USE_LEGACY_KERAS=1 from here.
NOTEBOOK_ARGS ?=
notebook: venv
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=notebooks $(NOTEBOOK_ARGS)

clean:
	rm -rf outputs
