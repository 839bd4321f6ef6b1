# verl-gigpo — one-command install, test, demo and benchmarks.
#   make install   create .venv/ (torch CPU 2.13.0 first, then verl[verl-core]==0.9.1, ALFWorld lean, this package)
#   make test      lint + format check + the whole CPU test suite (installs first on a fresh clone)
#                  (the quick subset without Ray, TransferQueue, verl's pipeline or the demo:
#                  .venv/bin/python -m pytest -m "not slow" tests)
#   make bench     estimator speed benchmark (benchmarks/RESULTS.md)
#   make e2e       verl's own pipeline end to end on this CPU (GiGPO, killed processes + resume, GRPO + LoRA; ~5 min)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --disable-pip-version-check
STAMP := $(VENV)/.install-stamp
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test lint pytest bench clean demo e2e

install: $(STAMP)

$(STAMP): pyproject.toml requirements.txt requirements-alfworld.txt Makefile
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: on these machines 2.13.0 is the local CPU build; anything else may pull CUDA wheels.
	$(PIP) torch==2.13.0
	$(PIP) "verl[verl-core]==0.9.1"
	$(PIP) --no-deps -r requirements-alfworld.txt
	$(PIP) -e ".[test]"
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two pytest workers (pytest-xdist; every test file runs on one worker, so its fixtures stay in one process, and the
# files that need Ray share one: tests/conftest.py):
# on 2 cores most tests keep one core busy and verl's pipeline tests wait on Ray processes, so two workers take ~6
# minutes where one takes ~9. One torch thread per worker: two OpenMP threads per worker spin against each other.
# PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
pytest: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=15 tests

test: lint pytest

# CPU demo: build artifacts/tiny-model if missing, train it with GiGPO on gridnav (a few minutes on 2 cores).
# DEMO_ITERS=2 make demo for a quick check; DEMO_SEED, DEMO_OUT (runs/demo) and DEMO_MODEL also apply.
# DEMO_START=imitate: start from a model that reads its observation, sampling over the full vocabulary (no
# action-token constraint; see verl_gigpo/dev/demo.py).
demo: $(STAMP)
	$(BIN)/python -m verl_gigpo.dev.demo

# verl's main_ppo with GiGPO on CPU (platform=cpu): validation, iterations + checkpoints until a kill after step 2, a
# refused training-key change, the resume to iteration 4 (metrics kept), GRPO with a LoRA adapter; builds
# artifacts/tiny-model-actions if missing; checks metrics, weight sync and resume (verl_gigpo/dev/smoke.py).
# E2E_OUT (runs/e2e) and E2E_RANKS (1) also apply. Then a tiny Qwen2.5-VL trains 2 iterations on Sokoban images
# (verl_gigpo/dev/vision_smoke.py, ~1 min; builds artifacts/tiny-vl if missing; docs/vision.md).
e2e: $(STAMP)
	$(BIN)/python -m verl_gigpo.dev.smoke --out $${E2E_OUT:-runs/e2e} --ranks $${E2E_RANKS:-1}
	$(BIN)/python -m verl_gigpo.dev.vision_smoke --out $${E2E_OUT:-runs/e2e}-vision

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_advantage.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
