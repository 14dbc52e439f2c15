# Stepline's task runner: the README and .ci/run use these targets.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when the dependencies change.
STAMP := $(VENV)/.installed

.PHONY: install dev test check bench chaos failover deploy-check fuzz browser model mutate citus

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[server,dev]'
	touch $@

dev: install
	$(BIN)/stepline dev

test: install browser
	$(BIN)/pytest -q

# The dashboard's tests drive a real Chromium (Playwright, with the browser the system has; its
# own browser download is never used). As root with apt-get, Debian's chromium is installed
# when missing; otherwise this says how, and those tests are skipped. STEPLINE_CHROMIUM may name
# the browser's binary (e.g. Chrome's on macOS).
browser:
	@if [ -n "$$STEPLINE_CHROMIUM" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then \
	    true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium for the dashboard's browser tests (apt-get)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
	        || echo "chromium could not be installed: the dashboard's browser tests will be skipped"; \
	else \
	    echo "no chromium found: the dashboard's browser tests will be skipped." \
	         "Install it (Debian/Ubuntu: sudo apt-get install chromium; macOS: brew install --cask chromium," \
	         "then STEPLINE_CHROMIUM=/Applications/Chromium.app/Contents/MacOS/Chromium) and run make test again"; \
	fi

check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The tests on a local Citus cluster (tests/citus/README.md): Citus built and installed with
# ../shared/citus/build.sh (needs root the first time), a coordinator and two workers started on
# loopback from CITUS_PORT (default 9700), CITUS_TESTS (the e2e suite and the model-based test
# at its short budget) run against the coordinator, the cluster stopped; then the chaos run on
# a Citus cluster of its own (tests/chaos, --citus; CITUS_CHAOS_ARGS adds flags). Fails when
# either fails.
CITUS_TESTS ?= -q -rfE tests/e2e tests/model/test_model.py
CITUS_CHAOS_ARGS ?=
citus: install
	status=0; \
	tests/citus/run.sh $(CITUS_TESTS) || status=1; \
	$(BIN)/python -m tests.chaos --citus $(CITUS_CHAOS_ARGS) || status=1; \
	exit $$status

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

# The failover test (tests/failover/README.md): the chaos load with two orchestrators on a
# pg_auto_failover formation (a monitor, a primary, two standbys, one of which confirms each
# commit) whose primary's postmaster, then whole node, is killed; fails when an invariant breaks,
# a request answers 500 or none, or an orchestrator restarts. Needs root and Debian's
# postgresql-15-auto-failover and pg-auto-failover-cli. FAILOVER_ARGS adds flags, e.g.
# `make failover FAILOVER_ARGS="--async"` (asynchronous replication: losses reported).
failover: install
	$(BIN)/python -m tests.failover $(FAILOVER_ARGS)

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

# The model-based test of the run state machine (tests/model/test_model.py) run long: random
# interleavings, MODEL_EXAMPLES examples of MODEL_STEPS rules each, again and again until
# MODEL_MINUTES have passed (`make test` runs 4 derandomized examples of up to 20 rules). Fails on the first
# counterexample (shrunk with STEPLINE_MODEL_SHRINK=1). STEPLINE_MODEL_LEAVE_OUT and
# STEPLINE_MODEL_OPEN_DEFECTS (in the environment) choose the checks tests/model/test_model.py names.
MODEL_MINUTES ?= 30
MODEL_EXAMPLES ?= 20
MODEL_STEPS ?= 25
model: install
	@end=$$(( $$(date +%s) + $(MODEL_MINUTES) * 60 )); rounds=0; \
	while [ $$(date +%s) -lt $$end ]; do \
	    rounds=$$((rounds + 1)); \
	    STEPLINE_MODEL_RANDOM=1 STEPLINE_MODEL_EXAMPLES=$(MODEL_EXAMPLES) \
	    STEPLINE_MODEL_STEPS=$(MODEL_STEPS) $(BIN)/pytest -q -p no:cacheprovider \
	        tests/model/test_model.py --hypothesis-show-statistics || exit 1; \
	done; \
	echo "model: $$rounds rounds of $(MODEL_EXAMPLES) random examples of up to $(MODEL_STEPS) rules, no counterexample"

# Mutation testing (mutmut, configured in pyproject.toml's [tool.mutmut]) of engine/ and the
# SDK's _signing, _history and _parked against tests/unit. It runs in .mutate/, which links the
# two packages at its top level so that the mutants' module names are the imported ones.
# MUTATE_CHILDREN mutants at a time (default 1); `make mutate MUTATE_ARGS=name` runs one mutant.
MUTATE_CHILDREN ?= 1
mutate: install
	mkdir -p .mutate
	for p in sdk/stepline service/stepline_server tests pyproject.toml; do \
	    ln -sfn ../$$p .mutate/$$(basename $$p); \
	done
	cd .mutate && ../$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) $(MUTATE_ARGS); \
	    status=$$?; ../$(BIN)/mutmut results; exit $$status
