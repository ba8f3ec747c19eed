# The README's two commands, `make demo` (the main job on the built-in
# example) and `make ci` (the whole CI), work on a fresh Debian 12 machine as
# root: they install and start what they need (`make provision`: Debian
# packages, dockerd with runc and runsc and its daemon.json, the images, the
# npm MCP clients, the dev environment). The day-to-day targets change
# nothing on the machine:
#   make check   lint, types and every test that needs no engine (fast)
#   make test    lint, types, the whole suite with coverage (subprocesses
#                included, fail_under in pyproject.toml) and a short fuzz
#                campaign; on a machine that is not provisioned it stops at
#                once, naming what is missing (.ci/require-provisioned)
PYTHON ?= python3
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Harmless with a venv or pyenv; lets a system python3 (PEP 668) install too.
export PIP_BREAK_SYSTEM_PACKAGES := 1

.PHONY: install engine images test-tools provision provisioned lint typecheck check test ci fuzz demo bench

install:
	$(PYTHON) -m pip install -q -e '.[dev]'

engine:
	.ci/provision-engine

images: install engine
	@if [ -x .ci/build-images ]; then .ci/build-images; fi

provision: install images test-tools

lint:
	ruff check broker sandbox wrapper seccomp harness tests
	ruff format --check broker sandbox wrapper seccomp harness tests

typecheck:
	.ci/typecheck

check: lint typecheck
	$(PYTHON) -m pytest -q -m "not engine"

# Checks only; installs and starts nothing.
provisioned:
	.ci/require-provisioned

test: provisioned lint typecheck
	rm -f .coverage .coverage.*
	$(PYTHON) -m coverage run -m pytest -q
	$(PYTHON) -m coverage combine -q
	$(PYTHON) -m coverage report
	@if [ -x .ci/fuzz ]; then .ci/fuzz --short; fi

ci: provision
	$(MAKE) test

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
	$(PYTHON) tests/bench/bench_apiproxy.py
	$(PYTHON) tests/bench/bench_realistic.py
	$(PYTHON) tests/bench/bench_enclave.py
	$(PYTHON) -m tests.wrapper.bench_mcp 100

demo: images
	bounded-query-harness demo
