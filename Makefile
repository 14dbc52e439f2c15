# Stepline's task runner: the README and .ci/run use these targets.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when the dependencies change.
STAMP := $(VENV)/.installed

.PHONY: install dev test check bench chaos deploy-check fuzz

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

# The image built with podman, the compose file and the Kubernetes manifests validated
# (deploy/check.sh says which tools it needs).
deploy-check: install
	BIN=$(BIN) deploy/check.sh

bench: install
	$(BIN)/python -m bench

# The chaos test (tests/chaos/README.md): the default size, then the lease-stress mode (1 s
# leases, steps of 0.3-1.5 s); fails when either breaks an invariant. Add flags with
# CHAOS_ARGS, e.g. `make chaos CHAOS_ARGS="--runs 500 --keep"`; `make chaos LEASE=1` runs the
# stress mode alone.
chaos: install
ifeq ($(LEASE),1)
	$(BIN)/python -m tests.chaos --stress $(CHAOS_ARGS)
else
	status=0; \
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS) || status=1; \
	$(BIN)/python -m tests.chaos --stress $(CHAOS_ARGS) || status=1; \
	exit $$status
endif

# Schemathesis over every operation of openapi.yaml and the dashboard's forms
# (tests/e2e/dashboard_forms.yaml), stateful phase included, against a live orchestrator on
# loopback, with an admin key (a signed-in session) and without one (`make test` runs the same
# at 3 examples per operation). Deeper
# here: FUZZ_EXAMPLES per operation, at most FUZZ_SECONDS per run, FUZZ_SEED for another draw.
FUZZ_EXAMPLES ?= 100
FUZZ_SECONDS ?= 900
FUZZ_SEED ?= 1
fuzz: install
	STEPLINE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) STEPLINE_FUZZ_SECONDS=$(FUZZ_SECONDS) \
	STEPLINE_FUZZ_SEED=$(FUZZ_SEED) $(BIN)/pytest -q -s tests/e2e/test_schemathesis.py
