# The README's quick start: `make demo` and `make test` on a fresh machine with Python 3.11.
# Two stamps: `make demo` installs the library and its runtime dependencies only (anyio, attrs,
# structlog, orjson: seconds), `make test` adds the test tools, the frameworks and the providers'
# SDKs (minutes), so trying the library does not wait for what only its tests need.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test test-suite test-frameworks lint typecheck bench docs clean

# The venv's own pip (3.11's installs editable pyproject projects) does for the runtime; the test
# install, with its hundreds of packages, upgrades it first.
$(BIN)/python:
	$(shell command -v $(PYTHON) >/dev/null 2>&1 && echo $(PYTHON) || echo python3) -m venv $(VENV)

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,postgres]'
	touch $(TEST_STAMP)

# The quickstart, then the main demo, which writes its session to nous_session_demo.sqlite3 in
# this directory (it prints the path before it writes anything).
demo: $(RUNTIME_STAMP)
	$(BIN)/python examples/quickstart.py
	@echo
	$(BIN)/python -m nous_session demo

# Our suite, then the frameworks' own tests against our adapters (each in its own virtualenv).
test: test-suite
	$(MAKE) test-frameworks

# Our suite alone, on every core; .ci/run runs it on other Pythons too, in virtualenvs of their own:
# `make PYTHON=python3.13 VENV=.venv-3.13 test-suite`.
# TEST_WORKERS: pytest-xdist's workers (one per core by default; 0 runs in this process, for
# a debugger). worksteal: the long property tests do not leave a worker idle at the end.
# TESTS: which test files or node ids (all of tests/ by default).
TEST_WORKERS ?= auto
TESTS ?=
test-suite: $(TEST_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(TESTS)

test-frameworks:
	PYTHON=$(PYTHON) bash .ci/openai_agents
	PYTHON=$(PYTHON) bash .ci/google_adk

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check nous_session

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

# BENCH_ARGS: more options for benchmarks/run.py, e.g. `--only web --full-load` (1,000 SSE clients).
BENCH_ARGS ?=
bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/, in a virtualenv of its own built from
# the `docs` extra; --strict turns every warning (a broken link or cross-reference) into a failure.
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed

$(DOCS_VENV)/bin/python:
	$(shell command -v $(PYTHON) >/dev/null 2>&1 && echo $(PYTHON) || echo python3) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --upgrade pip

$(DOCS_STAMP): pyproject.toml | $(DOCS_VENV)/bin/python
	$(DOCS_VENV)/bin/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-openai-agents .venv-google-adk .venv-docs .venv-3.12 .venv-3.13 site \
		build dist *.egg-info

# The side-by-side run against the peers, in its own virtualenv: the peers and
# matplotlib come from the `bench` extra and never enter .venv. Writes
# benchmarks/results/peers.{json,md} (latest.* stays `make bench`'s) and the PNG plots.
BENCH_VENV := .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.installed
PEERS_RUN := benchmarks/results/peers.tmp

.PHONY: bench-peers

$(BENCH_BIN)/python:
	$(shell command -v $(PYTHON) >/dev/null 2>&1 && echo $(PYTHON) || echo python3) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install --quiet --upgrade pip

$(BENCH_STAMP): pyproject.toml | $(BENCH_BIN)/python
	$(BENCH_BIN)/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench-peers: $(BENCH_STAMP)
	rm -rf $(PEERS_RUN)
	$(BENCH_BIN)/python benchmarks/run.py --only scaling peers --output $(PEERS_RUN); \
	status=$$?; \
	mv $(PEERS_RUN)/latest.json benchmarks/results/peers.json && \
	mv $(PEERS_RUN)/latest.md benchmarks/results/peers.md && \
	rmdir $(PEERS_RUN) && \
	$(BENCH_BIN)/python benchmarks/plots.py && exit $$status
