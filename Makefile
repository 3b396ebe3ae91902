# The README's quick start: `make demo` and `make test` on a fresh machine with Python 3.11.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-frameworks lint typecheck bench clean

$(BIN)/python:
	$(shell command -v $(PYTHON) >/dev/null 2>&1 && echo $(PYTHON) || echo python3) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,postgres]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py
	@echo
	$(BIN)/python -m nous_session demo

# Our suite, then the frameworks' own tests against our adapters (each in its own virtualenv).
test: $(STAMP)
	$(BIN)/python -m pytest
	$(MAKE) test-frameworks

test-frameworks:
	PYTHON=$(PYTHON) bash .ci/openai_agents
	PYTHON=$(PYTHON) bash .ci/google_adk

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check nous_session

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .venv-openai-agents .venv-google-adk build dist *.egg-info

# The side-by-side run against the peers (issue 6), in its own virtualenv: the peers and
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
