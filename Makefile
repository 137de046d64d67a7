# `make run` and `make test` set everything up on a fresh machine (Python >= 3.10 with pip).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch: keep a torch the user already has in the venv; otherwise install the CPU build pinned here
# (on this project's machines it lies on disk). Override e.g. TORCH_SPEC="torch" for a CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run test test-fast test-e2e test-all lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[dev,launchers]"
	touch $@

# the first run: about three minutes on two cores (conf/experiment/first_run.yaml); `python train.py` is the
# full default run
run: setup
	$(BIN)/python train.py +experiment=first_run $(ARGS)

# Two tiers (docs/tests.md): the fast tier runs in-process (what plain `pytest` runs); the e2e tier runs
# train.py, torchrun, the scripts and `wandb leet` in subprocesses. `make test` (and CI) runs both, fast first.
FAST_TESTS := -m "not slow and not e2e"
E2E_TESTS := -m "e2e and not slow"

test: setup
	$(BIN)/python -m pytest -q $(FAST_TESTS) $(ARGS)
	$(BIN)/python -m pytest -q $(E2E_TESTS) $(ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q $(FAST_TESTS) $(ARGS)

test-e2e: setup
	$(BIN)/python -m pytest -q $(E2E_TESTS) $(ARGS)

test-all: setup
	$(BIN)/python -m pytest -q -m "slow or not slow" $(ARGS)

lint: setup
	$(BIN)/ruff check src tests scripts train.py

clean:
	rm -rf $(VENV) .cache outputs multirun wandb
