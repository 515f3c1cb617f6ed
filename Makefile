# tfx-hpm: `make run` runs the taxi pipeline, `make test` runs the tests.
# Two TFX lanes, each with its own lock and venv: TFX=1.16 (Python 3.10,
# requirements-tfx1.16.lock, .venv-1.16) and TFX=1.21 (Python 3.11, glibc >=
# 2.38, requirements-tfx1.21.lock, .venv-1.21). Without TFX=, the newest lane
# this machine can run natively. TFX=1.21 on an older C library runs each
# target inside a Debian 13 root (.ci/debian13_root.sh, root only).

SHELL := /bin/bash
export TF_USE_LEGACY_KERAS := 1
export PYTHONUNBUFFERED := 1
# Silence TF's C++ info logs; Python progress logging stays on.
export TF_CPP_MIN_LOG_LEVEL ?= 1

# The C library decides which lanes run natively: TFX 1.21's ml-metadata and
# tensorflow-data-validation wheels need glibc >= 2.38.
GLIBC := $(shell getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $$2}')
GLIBC_FOR_121 := 2.38
GLIBC_NEW := $(shell [ "$$(printf '%s\n%s\n' '$(GLIBC_FOR_121)' '$(GLIBC)' | sort -V | head -1)" = '$(GLIBC_FOR_121)' ] && echo yes)

# A lane's interpreter: PYTHON=..., a working python3.X (the interpreter
# itself, not a pyenv shim: the Debian 13 root binds its folder in), or
# pyenv's 3.X (through the pyenv command, or its versions folder when pyenv is
# not on PATH).
find_python = $(shell \
  if python$(1) -c 'import sys' >/dev/null 2>&1; then python$(1) -c 'import sys; print(sys.executable)'; \
  elif command -v pyenv >/dev/null 2>&1 && \
       PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep -E '^$(subst .,\.,$(1))(\.|$$)' | tail -1) \
       pyenv which python$(1) >/dev/null 2>&1; then \
    PYENV_VERSION=$$(pyenv versions --bare | grep -E '^$(subst .,\.,$(1))(\.|$$)' | tail -1) pyenv which python$(1); \
  else \
    ls -1 "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/$(1)*/bin/python$(1) 2>/dev/null | tail -1; \
  fi)

ifeq ($(origin TFX),undefined)
  ifeq ($(GLIBC_NEW),yes)
    ifneq ($(call find_python,3.11),)
      TFX := 1.21
      LANE_WHY := the newest lane; glibc $(GLIBC) and Python 3.11 run it natively
    else
      TFX := 1.16
      LANE_WHY := no Python 3.11 found for TFX 1.21 (PYTHON=... with TFX=1.21 to choose it)
    endif
  else
    TFX := 1.16
    LANE_WHY := glibc $(GLIBC) is older than the $(GLIBC_FOR_121) TFX 1.21 needs; TFX=1.21 runs it in a Debian 13 root
  endif
else
  LANE_WHY := chosen by TFX=$(TFX)
endif
ifeq ($(TFX),1.21)
  PYVER := 3.11
  OTHER_TFX := 1.16
else ifeq ($(TFX),1.16)
  PYVER := 3.10
  OTHER_TFX := 1.21
else
  $(error TFX=$(TFX) is not a lane: TFX=1.16 or TFX=1.21)
endif
LOCK := requirements-tfx$(TFX).lock
VENV := .venv-$(TFX)
VPY := $(VENV)/bin/python
PYTHON ?= $(call find_python,$(PYVER))
# TFX 1.21 on an older C library: each lane target runs in the Debian 13 root.
DEBIAN13_ROOT ?= /var/cache/tfx-hpm/debian13
IN_ROOT := $(if $(and $(filter 1.21,$(TFX)),$(if $(GLIBC_NEW),,yes)),yes)
ROOT_RUN = PYTHON="$(PYTHON)" .ci/debian13_root.sh run $(DEBIAN13_ROOT)

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
# The lane's image: its Python, a base whose C library its wheels need, its
# lock and the apache-beam version of that lock (the SDK harness).
IMAGE_BASE_1.16 := python:3.10-slim
IMAGE_BASE_1.21 := python:3.11-slim-trixie
IMAGE_BUILD_ARGS = --build-arg PYTHON_VERSION=$(PYVER) \
  --build-arg BASE_IMAGE=$(IMAGE_BASE_$(TFX)) --build-arg LOCK=$(LOCK) \
  --build-arg BEAM_VERSION=$$(grep '^apache-beam==' $(LOCK) | cut -d= -f3)

.PHONY: help lane root ci-other-lane print-other-lane venv run run-stock lint test test-all test-conformance ci test-fast test-slow bench kubeflow image notebook clean

help:
	@echo "TFX=$(TFX) ($(LANE_WHY)); TFX=1.16|1.21 chooses the lane"
	@echo "make run        # full Chicago taxi pipeline with tfx-hpm components (LocalDagRunner)"
	@echo "make run-stock  # the same pipeline with the stock Transform and Trainer"
	@echo "make lint       # ruff (.ruff.toml) and the import contracts (.importlinter)"
	@echo "make test       # the core test suite (at most 20 min on 2 cores)"
	@echo "make test-all   # core and extended tests in one session (at most 40 min)"
	@echo "make test-conformance  # TFX's own executor tests on ours (about 21 min, two workers)"
	@echo "make ci         # what CI runs on this lane: lint, then test-all with test-conformance but conformance_repeat, one session"
	@echo "make ci-other-lane  # what CI runs on the other lane (TFX=$(OTHER_TFX)): test with test-conformance but conformance_repeat, one session"
	@echo "make test-fast  # tests without end-to-end pipeline runs and clusters"
	@echo "make bench      # side-by-side benchmarks -> benchmarks/results/"
	@echo "make kubeflow   # compile the pipeline for Kubeflow Pipelines (v2 JSON)"
	@echo "make notebook   # Jupyter on notebooks/ with the project venv (TF_USE_LEGACY_KERAS=1)"
	@echo "make image      # build the lane's pipeline image IMAGE=$(IMAGE) (docker or podman)"
	@echo "make root       # build the Debian 13 root the TFX 1.21 lane runs in on glibc < 2.38"

# setuptools and wheel first (the lock's sdists build with them), then the
# rest of the lock in two pip processes at once (pip is single-threaded);
# --no-deps, as the lock pins everything.
PIP_INSTALL := $(VPY) -m pip install --quiet --no-deps --disable-pip-version-check

$(VENV)/.installed: $(LOCK) setup.py
	@if [ -z "$(PYTHON)" ]; then \
	  echo "error: no Python $(PYVER) found for the TFX $(TFX) lane. Install it (e.g." \
	       "'pyenv install $(PYVER)') or pass PYTHON=/path/to/python$(PYVER)." >&2; exit 1; fi
	@"$(PYTHON)" -c 'import sys; assert sys.version_info[:2] == tuple(map(int, "$(PYVER)".split("."))), sys.version' || \
	  { echo "error: $(PYTHON) is not Python $(PYVER); the TFX $(TFX) lane needs $(PYVER)." >&2; exit 1; }
	@echo "Creating $(VENV) with $(PYTHON) and installing $(LOCK) (about 3 min)..."
	rm -rf $(VENV)
	"$(PYTHON)" -m venv $(VENV)
	$(PIP_INSTALL) $$(grep -E '^(setuptools|wheel)==' $(LOCK))
	grep -vE '^(#|setuptools==|wheel==|$$)' $(LOCK) > $(VENV)/lock.txt
	awk 'NR % 2' $(VENV)/lock.txt > $(VENV)/lock-1.txt
	awk '!(NR % 2)' $(VENV)/lock.txt > $(VENV)/lock-2.txt
	@set -e; $(PIP_INSTALL) -r $(VENV)/lock-1.txt & first=$$!; \
	  $(PIP_INSTALL) -r $(VENV)/lock-2.txt; wait $$first
	$(PIP_INSTALL) --no-build-isolation -e .
	@touch $@

# The targets that run in a lane's venv.
LANE_TARGETS := venv run run-stock lint test test-all test-conformance ci \
  test-fast test-slow bench kubeflow notebook

lane:
	@echo "tfx-hpm: TFX $(TFX) lane ($(LANE_WHY))."

# The Debian 13 root, built once outside the clone and reused (rebuilt when
# missing or stale).
root:
	@PYTHON="$(PYTHON)" .ci/debian13_root.sh build $(DEBIAN13_ROOT)

ifeq ($(IN_ROOT),yes)
# Each lane target runs again inside the root, where the C library is new
# enough; the variables given on the command line go along (MAKEFLAGS).
$(LANE_TARGETS): lane root
	@echo "tfx-hpm: running 'make $@' in the Debian 13 root $(DEBIAN13_ROOT)."
	$(ROOT_RUN) $(MAKE) --no-print-directory $@ TFX=$(TFX) PYTHON="$(PYTHON)"
else
venv: lane $(VENV)/.installed

run: venv
	$(VPY) -m pipelines.local_runner $(RUN_ARGS)

run-stock: venv
	$(VPY) -m pipelines.local_runner --stock --pipeline-root outputs/pipeline_stock $(RUN_ARGS)

# JUnit XML per target; `test-all` ends with the slowest tests and each set's
# time. It runs the core and extended sets in one session (core first within
# each file), so shared fixtures (Ray cluster, baselines, pipeline upstream)
# are built once.
TEST_RESULTS := outputs/test-results/tfx$(TFX)
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

# ALL picks test-all's set (a marker expression); `ci` adds conformance.
ALL ?= not conformance
test-all: venv
	@status=0; \
	$(VPY) -m pytest tests $(XDIST) -m "$(ALL)" --junitxml=$(TEST_RESULTS)/all.xml $(PYTEST_ARGS) || status=$$?; \
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

# What CI runs (.ci/run) on the native lane: the lint gate, then the whole
# suite and the conformance tests but the `conformance_repeat` ones (the
# 60-minute budget for both lanes) in one session: one start-up, and the
# conformance file fills a worker while the other runs the rest.
ci: lint
	$(MAKE) test-all ALL="not conformance_repeat"

test-fast: venv
	$(VPY) -m pytest tests -m "not slow and not extended and not conformance" $(PYTEST_ARGS)

test-slow: venv
	$(VPY) -m pytest tests -m slow $(PYTEST_ARGS)

bench: venv
	$(VPY) -m benchmarks.run_all $(BENCH_ARGS)

kubeflow: venv
	$(VPY) -m kubeflow.runner --output outputs/kubeflow/taxi_hpm_pipeline.json

# The kernel is the venv's python3 and inherits TF_USE_LEGACY_KERAS=1 from here.
NOTEBOOK_ARGS ?=
notebook: venv
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=notebooks $(NOTEBOOK_ARGS)
endif

print-other-lane:
	@echo $(OTHER_TFX)

# What CI runs (.ci/run) on the other lane: its core set and its TFX
# version's own Trainer and Transform tests on ours, in one session.
ci-other-lane:
	$(MAKE) test TFX=$(OTHER_TFX) CORE="not extended and not conformance_repeat"

# Only what the image needs goes into the build context (no .venv, outputs).
image:
	@if [ -z "$(CONTAINER_TOOL)" ]; then \
	  echo "error: 'make image' needs docker or podman; neither is installed." >&2; exit 1; fi
	@if [ "$(CONTAINER_TOOL)" = docker ] && ! docker info >/dev/null 2>&1; then \
	  echo "error: docker is installed but its daemon does not answer ('docker info'" \
	       "fails): start it, or install podman (CONTAINER_TOOL=podman)." >&2; exit 1; fi
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)
	tar --exclude=__pycache__ --exclude='*.pyc' --exclude=benchmarks/results -cf - \
	  $(LOCK) setup.py components pipelines kubeflow benchmarks | tar -xf - -C $(IMAGE_CONTEXT)
	$(CONTAINER_TOOL) build -f kubeflow/Dockerfile $(IMAGE_BUILD_ARGS) -t $(IMAGE) $(IMAGE_CONTEXT)

clean:
	rm -rf outputs
