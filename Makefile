# The README's quick start: `make demo` and `make test` on a fresh machine with Python 3.11.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean

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

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check nous_session

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build dist *.egg-info
