# The two commands: `make run` (default experiment, no download) and `make test` (lint: ruff,
# import layers, mypy over src/ at pyproject's [tool.mypy] strictness; the docs site; then the whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: install run test lint docs clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all]'
	touch $(STAMP)

run: install
	$(BIN)/protofed run configs/quickstart.yaml --out runs/quickstart --force

test: lint docs
	$(BIN)/python -m pytest -q

# the documentation site, offline, into site/; --strict: a broken link or API object fails
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: install
	$(BIN)/ruff check src tests benchmarks experiments docs/tutorials/*.py
	$(BIN)/ruff format --check src tests benchmarks experiments docs/tutorials/*.py
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs site .pytest_cache
