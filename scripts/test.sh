#!/usr/bin/env bash
# Runs the whole test suite: starts throwaway PostgreSQL and MariaDB servers and a 3-member
# etcd cluster on loopback (installing them from the distribution's packages when missing and
# running as root), runs every workspace test against them, then the Python client's tests
# (scripts/test-python.sh: a real `decree serve` and the same databases), and stops the
# databases and etcd again, whatever the outcome. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-dbs.sh start
trap 'scripts/test-dbs.sh stop' EXIT
eval "$(scripts/test-dbs.sh env)"
# A 3-member etcd cluster on loopback for the pair's election (installs etcd-server and
# protobuf-compiler, which the etcd client crate's build runs, when missing and root).
scripts/test-etcd.sh start
trap 'scripts/test-etcd.sh stop; scripts/test-dbs.sh stop' EXIT
eval "$(scripts/test-etcd.sh env)"

# The `decree` the tests run is built with the pair kill loop's crash points and the election
# on etcd, which the crash tests then use as it is (crates/decree-crashtest/tests/common:
# `decree_bin`) instead of building decree-server and decree-cli a second time.
export DECREE_TEST_WORKSPACE_FEATURES=crash-points,etcd
cargo test --workspace --release --features decree-cli/crash-points,decree-cli/etcd "$@"
# The Python and Java tests run that same binary (its crash points act only when a test
# names one), which spares a second build of decree-server and decree-cli.
export DECREE_BIN="$PWD/target/release/decree"
scripts/test-python.sh
scripts/test-java.sh
