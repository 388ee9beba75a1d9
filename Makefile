# Entry points, each doing its own set-up on a fresh machine:
#   make train   set-up, then `rlmix train +experiment=sc_mis model=embedded_v2` on the embedded v2
#                model (a small Qwen3-MoE with a byte-level BPE, built on first use)
#   make test    set-up, then the whole test suite
#   make test-fast   set-up, then the tests not marked slow (no Ray, no subprocess, no model build of
#                seconds): the tier to run on every change
#   make bench-peer   set-up, then rlmix against TRL's GRPOTrainer on one workload (scripts/bench_peer.py);
#                TRL runs in its own .venv-peer/, built once from requirements/peer.lock
# Set-up builds .venv/ from the lock of the machine's target and installs rlmix into it in
# editable mode (docs/install.md):
#   TARGET=cpu   requirements/cpu.lock, installed without resolution (--no-deps) so the CPU builds
#                stay what they are; torch's CPU build comes from WHEELS_DIR when it holds a torch
#                wheel, otherwise from TORCH_CPU_INDEX
#   TARGET=gpu   requirements/gpu.lock from INDEX_URL (PyPI: CUDA torch, vllm, deepspeed), resolved
#                by pip, which must agree with the lock
# TARGET defaults to gpu where `nvidia-smi -L` lists a GPU, else cpu.
#   make setup TARGET=gpu DRY_RUN=1   resolve the lock for its platform; install nothing

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TARGET ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo gpu || echo cpu)
LOCK := requirements/$(TARGET).lock
STAMP := $(VENV)/.rlmix-$(TARGET)
OTHER_STAMP := $(VENV)/.rlmix-$(if $(filter cpu,$(TARGET)),gpu,cpu)
WHEELS_DIR ?= /opt/wheels
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
CPU_SOURCE := $(if $(wildcard $(WHEELS_DIR)/torch-*.whl),\
	--find-links $(WHEELS_DIR),--extra-index-url $(TORCH_CPU_INDEX))
PIP := $(BIN)/python -m pip --disable-pip-version-check
PIP_FLAGS := --quiet --no-input
# The GPU set-up takes everything from INDEX_URL, with the user's pip settings off (--isolated):
# a CPU wheel folder configured there must not stand in for the CUDA torch.
INDEX_URL ?= https://pypi.org/simple

.PHONY: setup train test test-fast bench bench-perf bench-peer reproduce reproduce-quick clean

ifneq ($(filter-out cpu gpu,$(TARGET)),)
$(error TARGET=$(TARGET): use TARGET=cpu or TARGET=gpu)
endif

ifeq ($(DRY_RUN),1)
setup:
	RLMIX_INDEX_URL=$(INDEX_URL) $(PYTHON) scripts/lock.py check $(LOCK)
else
setup: $(STAMP)
	@sh scripts/setup_sandbox.sh  # bubblewrap for the local agentic runtime's sandbox
endif

$(STAMP): $(LOCK) pyproject.toml
	@# A venv built for the other target is rebuilt, not mixed: the two locks hold different torch builds.
	@if [ -e $(OTHER_STAMP) ]; then echo "rebuilding $(VENV) for TARGET=$(TARGET)"; rm -rf $(VENV); fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) "setuptools==78.1.1" "wheel==0.45.1"
ifeq ($(TARGET),cpu)
	$(PIP) install $(PIP_FLAGS) $(CPU_SOURCE) --no-deps -r $(LOCK)
else
	$(PIP) install --isolated $(PIP_FLAGS) --index-url $(INDEX_URL) -r $(LOCK)
endif
	$(PIP) install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	touch $@

train: setup
	$(BIN)/rlmix train +experiment=sc_mis model=embedded_v2

# Two pytest workers (pytest-xdist), each given whole test files: a file's tests share its module
# fixtures (one Ray instance for the in-process runs) and run in order, as they would alone.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(PYTEST) --durations=15 tests

test-fast: setup
	$(PYTEST) -m "not slow" tests

bench: setup
	$(BIN)/python scripts/bench_correction.py

# Start-up, the loop against its compute floor, the hand-offs between processes, per-job sweep
# overhead, multi-turn generation against single-turn (docs/performance.md).
bench-perf: setup
	$(BIN)/python scripts/bench_startup.py
	$(BIN)/python scripts/bench_loop.py
	$(BIN)/python scripts/bench_transport.py
	$(BIN)/python scripts/bench_sweep.py
	$(BIN)/python scripts/bench_agentic.py --model v2 --concurrency 16 --batching continuous whole --prefix-cache on --repeats 3

# rlmix against TRL's GRPOTrainer on the same workload, runs interleaved, ratios per round
# (docs/performance.md, "Against TRL"); PEER_REPEATS=6 for the issue's six rounds. TRL lives in its own
# environment: requirements/peer.lock installed with --no-deps, so it is exactly the lock, with the CPU
# torch from where the CPU set-up takes it; rebuilt from scratch when the lock changes.
PEER_VENV := .venv-peer
PEER_STAMP := $(PEER_VENV)/.rlmix-peer
PEER_LOCK := requirements/peer.lock
PEER_REPEATS ?= 3

$(PEER_STAMP): $(PEER_LOCK)
	rm -rf $(PEER_VENV)
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip --disable-pip-version-check install $(PIP_FLAGS) $(CPU_SOURCE) \
		--no-deps -r $(PEER_LOCK)
	touch $@

bench-peer: setup $(PEER_STAMP)
	$(BIN)/python scripts/bench_peer.py --repeats $(PEER_REPEATS) --peer-python $(PEER_VENV)/bin/python

# The study's comparison on the embedded default, every run scored on held-out pass@1 (docs/results.md).
# reproduce-quick: the headline on the v2 workload with the lag removed (loop.lag=0): reinforce, grpo
# and sc_mis on the six-pool fleet with fp8 KV caches, grpo on the matched bf16 control; seeds 0-2,
# 12 runs of 300 steps. reproduce: the map on v2 (10 arms x 5 precision doses and a lag dose x seeds
# 0-2, 177 runs of 300 steps: ~10-12 h on 2 cores; a stopped one goes on with
# `scripts/reproduce.py --profile v2_map --resume multirun/reproduce_<stamp>`). Run times: docs/results.md.
reproduce: setup
	$(BIN)/python scripts/reproduce.py --profile v2_map

reproduce-quick: setup
	$(BIN)/python scripts/reproduce.py --profile quick

clean:
	rm -rf $(VENV) $(PEER_VENV) outputs multirun .pytest_cache
