#!/usr/bin/env bash
# Runs tests against a local Citus cluster (README.md beside this script): builds and installs
# Citus with ../shared/citus/build.sh (once), starts a coordinator and two workers on loopback
# in a temporary folder, runs pytest with STEPLINE_TEST_CITUS pointing the fixtures at it, and
# stops the cluster at the end, whatever the outcome.
#   tests/citus/run.sh [PYTEST ARGS...]      (default: tests/e2e)
# CITUS_PORT: the coordinator's port (default 9700; the workers take the next two).
# CITUS_SCRIPTS: the folder of build.sh and cluster.sh (default ../shared/citus/).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
scripts="${CITUS_SCRIPTS:-$root/../shared/citus}"
port="${CITUS_PORT:-9700}"
bash "$scripts/build.sh"
dir="$(mktemp -d "${TMPDIR:-/tmp}/stepline-citus-XXXXXX")"
chmod 755 "$dir"
trap 'bash "$scripts/cluster.sh" stop "$dir/cluster"; rm -rf "$dir"' EXIT
bash "$scripts/cluster.sh" start "$dir/cluster" "$port" 2
[ $# -gt 0 ] || set -- tests/e2e
cd "$root"
STEPLINE_TEST_CITUS="$dir/cluster" .venv/bin/pytest "$@"
