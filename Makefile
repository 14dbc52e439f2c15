# Stepline's task runner: the README and .ci/run use these targets.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when the dependencies change.
STAMP := $(VENV)/.installed

.PHONY: install dev test check bench

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[server,dev]'
	touch $@

dev: install
	$(BIN)/stepline dev

test: install
	$(BIN)/pytest -q

check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench
