# rllib-ext: the two commands of the README are `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install train test test-fast test-slow test-learning lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[dev,smax]"
	touch $(STAMP)

install: $(STAMP)

## Main job: PPO on CartPole-v1 until the mean return reaches 450.
train: $(STAMP)
	$(VENV)/bin/rllib-ext train $(ARGS)

## ruff, then mypy (settings in pyproject.toml: strict on rllib_ext/ops and rllib_ext/distributed).
lint: $(STAMP)
	$(VENV)/bin/ruff check rllib_ext tests examples benchmarks
	$(VENV)/bin/ruff format --check rllib_ext tests examples benchmarks
	$(VENV)/bin/mypy

## What CI runs: lint, then every test except StarCraft II and the long learning comparisons.
test: lint
	$(VENV)/bin/pytest -m "not sc2 and not learning" -q

## Quick loop while developing: skips the end-to-end runs marked slow.
test-fast: lint
	$(VENV)/bin/pytest -q

test-slow: $(STAMP)
	$(VENV)/bin/pytest -m slow -q

test-learning: $(STAMP)
	$(VENV)/bin/pytest -m learning -q

bench: $(STAMP)
	$(PY) benchmarks/gae.py
	$(PY) benchmarks/train_cartpole.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
