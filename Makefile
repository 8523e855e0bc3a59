# The two commands: `make run` (default experiment, no download) and `make test` (lint: ruff,
# import layers, mypy --strict over src/ (pyproject's [tool.mypy]); the docs site; then the whole suite).
# `make test-fast`: the same lint, then the suite without the tests marked `integration`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: install run test test-fast lint docs notebooks clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all]'
	touch $(STAMP) $(DOCS_STAMP)

# `make docs` needs only protofed and the docs extra, not everything `install` puts in. It used
# to depend on `install`, whose stamp is older than pyproject.toml and constraints.txt whenever
# git rewrites them (a checkout, pull or rebase that changes them sets their mtime to now) and
# missing in a venv made by hand (`pip install -e '.[docs]'`): either way `make docs` reran the
# whole '.[all]' install, minutes of it. Its own stamp is remade on the same triggers, but the
# recipe first asks the venv whether protofed and every requirement of pyproject.toml's docs
# extra are installed at a version the extra allows (DOCS_CHECK, a second); only if not does it
# install, and then just '.[docs]'. `make install` (so `make test`) still installs everything.
DOCS_STAMP := $(VENV)/.installed-docs
define DOCS_CHECK
import sys
from importlib.metadata import version
from pip._vendor.packaging.requirements import Requirement
try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib
import protofed
with open("pyproject.toml", "rb") as f:
    docs = tomllib.load(f)["project"]["optional-dependencies"]["docs"]
for req in map(Requirement, docs):
    if not req.specifier.contains(version(req.name), prereleases=True):
        sys.exit(f"{req.name} {version(req.name)} is not {req}")
endef
export DOCS_CHECK

$(DOCS_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "$$DOCS_CHECK" 2>/dev/null \
	  || $(BIN)/python -m pip install --quiet -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

run: install
	$(BIN)/protofed run configs/quickstart.yaml --out runs/quickstart --force

# docs after lint, even under -j: lint's full install makes the docs stamp's check pass
test: lint
	$(MAKE) docs
	$(BIN)/python -m pytest -q

# The fast tier, for the edit-test loop: lint, then every test not marked `integration` (the unit
# tests and the small engine tests; integration = whole experiments, subprocesses, worker pools,
# real data). No docs site. Measured: 1m14s and 1m12s on two cores
# (other work running; pytest 65 s of it, 769 tests of 1274). `make test` still runs it all.
test-fast: lint
	$(BIN)/python -m pytest -q -m "not integration"

# the documentation site, offline, into site/; --strict: a broken link or API object fails
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the tutorials' notebooks (docs/tutorials/NAME.ipynb, the site's pages) executed anew from
# their scripts (NAME.py), to commit with their outputs: after editing a tutorial's script
# (tests/test_tutorials.py fails until then). Needs the tutorials' data sets in the data root
# (protofed data fetch uci_har wisdm_features, or PROTOFED_DATA=DIR); about 6 minutes on 2 shared
# cores, the FedAli comparison at its full size 3 to 4 of them.
# One of them: make notebooks TUTORIALS=own_csv
notebooks: install
	$(BIN)/python docs/tutorials/_notebooks.py $(TUTORIALS)

lint: install
	$(BIN)/ruff check src tests benchmarks experiments docs/tutorials/*.py
	$(BIN)/ruff format --check src tests benchmarks experiments docs/tutorials/*.py
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs site .pytest_cache
