# The two commands a newcomer needs: `make run` and `make test`. Everything else is a helper they call.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= var/data
PORT   ?= 8080
MOCK_PORT ?= 8001
ADMIN_PORT ?= 8081

.PHONY: run test venv native lint typecheck unit bench profile-native clean system-deps agents

$(STAMP): pyproject.toml setup.py native/*.c native/*.h native/_ffi_build.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel cffi
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python setup.py -q build_ext --inplace --force
	touch $(STAMP)

venv: $(STAMP)

native: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace --force

# Debian packages the test suite drives for real (installed only when missing).
system-deps:
	@./scripts/system-deps.sh test

# The coding-agent CLIs (Claude Code, Codex CLI) the suite drives, pinned in .agents/, installed there.
agents: system-deps
	@./scripts/agents.sh

run: venv
	./scripts/run-demo.sh $(PORT) $(MOCK_PORT) $(DATA) $(ADMIN_PORT)

lint: venv
	$(BIN)/ruff check gateway tests perf
	$(BIN)/ruff format --check gateway tests perf

typecheck: venv
	$(BIN)/mypy

test: venv system-deps agents lint typecheck
	./scripts/run-tests.sh

bench: venv
	./scripts/system-deps.sh bench
	-./scripts/bench-peers.sh  # LiteLLM, Portkey and smg under perf/.peers/; a peer that fails is skipped
	$(BIN)/python -m perf.bench $(BENCH_ARGS)

# The C parts under valgrind's callgrind: instructions per call of each entry point (valgrind if missing).
profile-native: venv
	./scripts/system-deps.sh profile
	$(BIN)/python -m perf.native_profile

clean:
	rm -rf $(VENV) build *.egg-info gateway/_gateway_native* var
