# Two entry points, each doing its own set-up on a fresh machine:
#   make train   set-up, then `rlmix train +experiment=sc_mis` on the embedded default
#   make test    set-up, then the whole test suite
# Set-up builds .venv/ from requirements.lock (exact pins, installed without resolution so the
# CPU builds stay what they are) and installs rlmix into it in editable mode.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlmix-installed
# torch's CPU build comes from the machine's local wheel folder where there is one.
WHEELS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP_FLAGS := --quiet --disable-pip-version-check --no-input $(WHEELS)

.PHONY: setup train test bench reproduce clean

setup: $(STAMP)
	@sh scripts/setup_sandbox.sh  # bubblewrap for the local agentic runtime's sandbox

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_FLAGS) "setuptools==78.1.1" "wheel==0.45.1"
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-deps -r requirements.lock
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	touch $@

train: setup
	$(BIN)/rlmix train +experiment=sc_mis

test: setup
	$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/python scripts/bench_correction.py

# The study's arms x 3 seeds on the emulated fleet, then report + hard51 pass@k (docs/results_*.md).
reproduce: setup
	$(BIN)/python scripts/reproduce.py --profile mild
	$(BIN)/python scripts/reproduce.py --profile stressed

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
