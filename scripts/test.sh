#!/usr/bin/env bash
# Runs the whole test suite: starts throwaway PostgreSQL and MariaDB servers on loopback
# (installing them from the distribution's packages when missing and running as root),
# runs every workspace test against them, and stops them again, whatever the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-dbs.sh start
trap 'scripts/test-dbs.sh stop' EXIT
eval "$(scripts/test-dbs.sh env)"

cargo test --workspace --release "$@"
