# mmfleet: `make test` (lint, type check, tests) and `make demo` (local control plane + operator).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint typecheck test unit crds docs clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $@

install: $(STAMP)

lint: install
	$(BIN)/ruff check operator tests
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

## Fast tier: pure functions and contracts, no cluster.
unit: install
	$(BIN)/pytest -q tests/unit tests/contract

test: lint typecheck
	$(BIN)/pytest -q

## Regenerate what is generated from the models; tests fail when these drift.
crds: install
	$(BIN)/mmfleet crd > crds/multimodalinferences.mmfleet.io.yaml
	cp crds/multimodalinferences.mmfleet.io.yaml charts/mmfleet/crds/
	$(BIN)/mmfleet docs api > docs/api.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
