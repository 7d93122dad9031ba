#!/usr/bin/env bash
# Runs the Python client's tests (clients/python/tests) against a real `decree serve` built
# from this repository and the databases of scripts/test-dbs.sh (their DECREE_TEST_*
# variables must be exported; without them the database tests skip, or fail under CI=true).
#
# The client is installed into a virtual environment in target/pyvenv (created when
# missing) the way a user installs it, `pip install ./clients/python`, together with what
# the tests use (pytest, psycopg 3 with its binary build, PyMySQL, aiomysql, and opentelemetry-sdk for
# test_tracing.py: the client itself only imports OpenTelemetry when it is installed). Extra arguments go to
# pytest, e.g. `scripts/test-python.sh -k tls -v`. Knobs: PYTHON (default python3, 3.10 or
# later), DECREE_PY_KILL_CYCLES (kills per protocol point in the crash tests, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=target/pyvenv

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
    echo "test-python: $PYTHON is missing or older than 3.10; install Python 3.10+ (with venv) or set PYTHON" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "pytest>=7" "psycopg[binary]>=3.1" "PyMySQL>=1.0" "aiomysql>=0.2" "opentelemetry-sdk>=1.20"
# Reinstalled every run, so that the tests see the client as it is now.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./clients/python

# scripts/test.sh hands over the `decree` its Rust tests built (DECREE_BIN) instead of
# building it a second time without their features.
if [ -z "${DECREE_BIN:-}" ]; then
    cargo build --release -p decree-cli --quiet
    export DECREE_BIN="$PWD/target/release/decree"
fi
# From outside the source tree, so that `import decree` is the installed package.
cd clients/python/tests
exec "../../../$VENV/bin/python" -m pytest -p no:cacheprovider -o faulthandler_timeout=300 "$@" .
