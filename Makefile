# The README's two commands: `make demo` (main job on the built-in example)
# and `make test` (the full suite). Both work on a fresh Debian 12 machine as
# root: they install and start what they need.
PYTHON ?= python3
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Harmless with a venv or pyenv; lets a system python3 (PEP 668) install too.
export PIP_BREAK_SYSTEM_PACKAGES := 1

.PHONY: install engine images lint test test-tools fuzz demo bench

install:
	$(PYTHON) -m pip install -q -e '.[dev]'

engine:
	.ci/provision-engine

images: install engine
	@if [ -x .ci/build-images ]; then .ci/build-images; fi

lint: install
	ruff check broker sandbox wrapper seccomp harness tests
	ruff format --check broker sandbox wrapper seccomp harness tests
	.ci/typecheck

test: images lint test-tools
	$(PYTHON) -m pytest -q
	@if [ -x .ci/fuzz ]; then .ci/fuzz --short; fi

# Real MCP clients from the npm registry for tests/wrapper/test_mcp_clients.py.
test-tools:
	.ci/install-test-tools

fuzz: install
	.ci/fuzz --long

bench: images
	$(PYTHON) tests/bench/bench_protocol.py
	$(PYTHON) tests/bench/bench_timing.py
	$(PYTHON) tests/bench/bench_broker_load.py
	$(PYTHON) tests/bench/bench_sandbox.py
	$(PYTHON) tests/bench/bench_refusal_flood.py
	$(PYTHON) tests/bench/bench_agent_start.py
	$(PYTHON) tests/bench/bench_channels.py
	$(PYTHON) tests/bench/bench_contention.py
	$(PYTHON) -m tests.wrapper.bench_mcp 100

demo: images
	bounded-query-harness demo
