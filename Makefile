# Two commands on a fresh clone: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# The C accelerators (setup.py) build in place at install: a changed source reinstalls.
C_SOURCES := setup.py $(wildcard amqp_gateway/codec/*.c streamq/log/*.c streamq/log/*.h)

.PHONY: run test check lint typecheck contracts pytest bench clean system-packages sanitize fuzz chaos dist

run: $(RUN_STAMP)
	$(BIN)/streamq serve

# pytest runs on 5 workers (pyproject's addopts, tests/parallel.py); PYTEST_ARGS adds to
# them: `make test PYTEST_ARGS="-n 0"` runs serially, in one process.
PYTEST_ARGS ?=
test: $(TEST_STAMP) system-packages
	$(MAKE) check
	$(BIN)/pytest $(PYTEST_ARGS)

# Debian packages the tests need (RabbitMQ, Chromium): installed as root, else named.
system-packages:
	@tools/install-system-packages.sh

check: lint typecheck contracts

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

contracts: $(TEST_STAMP)
	$(BIN)/lint-imports

# The C modules' tests with the modules built under ASan and UBSan (also one test of the
# suite: tests/integration/test_c_sanitizers.py).
sanitize: $(TEST_STAMP)
	tools/sanitize.sh

# The fuzz soak (docs/fuzzing.md): every parser a peer reaches, 1,000,000 inputs each
# (RUNS=...; FUZZ_SECONDS=... stops each after that long), atheris with the C modules
# under ASan and UBSan, one parser at a time at nice 19. `make test` runs a bounded,
# deterministic pass of the same modules (tests/fuzz/).
FUZZ_STAMP := $(VENV)/.installed-fuzz
fuzz: $(FUZZ_STAMP)
	PYTHON=$(BIN)/python tools/fuzz.sh

$(FUZZ_STAMP): $(TEST_STAMP)
	$(BIN)/pip install --quiet -e '.[test,fuzz]'
	touch $@

# The fault suite's soak (docs/durability.md#faults): random partitions, pauses and kills
# of a three-node cluster and etcd on test hosts (network namespaces: as root) for
# CHAOS_MINUTES, then the checker on the whole history. `make test` runs every kind once.
CHAOS_MINUTES ?= 30
chaos: $(TEST_STAMP) system-packages
	$(BIN)/python -m tests.faults.chaos --minutes $(CHAOS_MINUTES)

# An sdist and a manylinux wheel with the C modules built in, in dist/ (docs/operations.md,
# "Install from the wheel"); `make test` builds and installs them too (tests/packaging/).
dist: $(TEST_STAMP)
	rm -rf dist
	PYTHON=$(abspath $(BIN))/python tools/dist.sh dist

bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/log_bench.py

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=77"

$(RUN_STAMP): pyproject.toml $(C_SOURCES) | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(C_SOURCES) | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[test,spark,dev]'
	touch $(RUN_STAMP) $@

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist *.egg-info
	find amqp_gateway streamq -name '*.so' -delete
