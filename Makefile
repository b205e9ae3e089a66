# rllib-ext: the two commands of the README are `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The oldest Ray release of the supported range (pyproject.toml); constraints.txt pins the newest.
OLDEST_RAY   ?= 2.58.0
OLDEST_VENV  ?= .venv-ray$(OLDEST_RAY)
OLDEST_STAMP := $(OLDEST_VENV)/.installed
# The whole conformance set's venv: the dev install plus the `conformance` extra (Atari, OpenSpiel,
# Ray Serve, which brings Ray's dashboard into every ray.init: kept out of $(VENV)).
CONF_VENV  ?= .venv-conformance
CONF_PY    := $(CONF_VENV)/bin/python
CONF_STAMP := $(CONF_VENV)/.installed

.PHONY: install install-oldest train test test-oldest test-fast test-slow test-learning conformance conformance-all conformance-table lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[dev,smax]"
	touch $(STAMP)

install: $(STAMP)

# The same pins, with Ray at the oldest supported release.
$(OLDEST_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q --upgrade pip
	sed 's/^ray==.*/ray==$(OLDEST_RAY)/' constraints.txt > $(OLDEST_VENV)/constraints.txt
	$(OLDEST_VENV)/bin/python -m pip install -q -c $(OLDEST_VENV)/constraints.txt -e ".[dev,smax]"
	touch $(OLDEST_STAMP)

install-oldest: $(OLDEST_STAMP)

$(CONF_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(CONF_VENV)
	$(CONF_PY) -m pip install -q --upgrade pip
	$(CONF_PY) -m pip install -q -c constraints.txt -e ".[dev,smax,conformance]"
	touch $(CONF_STAMP)

## Main job: PPO on CartPole-v1 until the mean return reaches 450.
train: $(STAMP)
	$(VENV)/bin/rllib-ext train $(ARGS)

## ruff, then mypy (settings in pyproject.toml: strict on rllib_ext/ops and rllib_ext/distributed).
lint: $(STAMP)
	$(VENV)/bin/ruff check rllib_ext tests examples benchmarks
	$(VENV)/bin/ruff format --check rllib_ext tests examples benchmarks
	$(VENV)/bin/mypy

## The README's test command: lint, then every test except StarCraft II, the long learning
## comparisons and the whole conformance set (its fast subset runs here; CI, `.ci/run`, runs
## `make conformance` right after it).
TEST_MARKERS = not sc2 and not learning and not conformance and not conformance_all
test: lint
	$(VENV)/bin/pytest -m "$(TEST_MARKERS)" -q

## Quick loop while developing: skips the end-to-end runs marked slow.
test-fast: lint
	$(VENV)/bin/pytest -q

## The smoke selection on the oldest supported Ray (CI runs it after `make test`): the fast
## tests of learners, connectors and envs, the private-name and version checks, and one short
## `rllib-ext train` each on CartPole and SMAX.
SMOKE ?= tests/learners tests/connectors tests/envs tests/test_rllib_private.py tests/test_versions.py tests/cli/test_train_smoke.py
test-oldest: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/pytest -q $(SMOKE)

test-slow: $(STAMP)
	$(VENV)/bin/pytest -m slow -q

test-learning: $(STAMP)
	$(VENV)/bin/pytest -m learning -q

## RLlib's own PPO example scripts, stock vs rllib_ext (tests/conformance/rllib_examples.py):
## `conformance` runs CI's set as tests (`make test` runs the fast subset only), `conformance-all`
## every PPO example script in ray/rllib/examples (about an hour on 2 cores; not in CI);
## `conformance-table` runs them all once more and prints the table of README's "Reliability"
## section (exit 1 where a row does not conform).
## CI's set: the 11 core rows (with the harness's own tests). `.ci/run`, right after `make test`,
## passes CONFORMANCE_MARKERS="conformance and not conformance_all": the 8 rows `make test` left out.
CONFORMANCE_MARKERS ?= not conformance_all
conformance: $(STAMP)
	$(VENV)/bin/pytest -q -m "$(CONFORMANCE_MARKERS)" tests/conformance/test_rllib_examples.py

conformance-all: $(CONF_STAMP)
	$(CONF_VENV)/bin/pytest -q -m "conformance or not conformance" tests/conformance/test_rllib_examples.py

conformance-table: $(CONF_STAMP)
	$(CONF_PY) -m tests.conformance.rllib_examples --json benchmarks/results/conformance/rllib_examples.json

bench: $(STAMP)
	$(PY) benchmarks/gae.py
	$(PY) benchmarks/train_cartpole.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(CONF_VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
