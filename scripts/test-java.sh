#!/usr/bin/env bash
# Runs the Java client's tests (clients/java: decree-jta, and the Spring Boot starter when
# present) against a real `decree serve` built from this repository and the databases of
# scripts/test-dbs.sh (their DECREE_TEST_* variables must be exported; without them the
# database tests skip, or fail under CI=true).
#
# Needs a JDK 17 or later and Maven 3.8+. The first run downloads the dependencies from
# Maven Central into ~/.m2; later runs need no network (Maven does not look again for
# released versions it already has; set DECREE_MVN_OFFLINE=1 to forbid it outright).
# Extra arguments go to Maven, e.g. `scripts/test-java.sh -Dtest=CrashTest`.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in java mvn; do
    if ! command -v "$tool" >/dev/null; then
        echo "test-java: $tool is missing; install a JDK 17+ and Maven (Debian: openjdk-17-jdk-headless maven)" >&2
        exit 1
    fi
done
if ! java -version 2>&1 | awk -F'"' '/version/ { split($2, v, "."); exit !(v[1] >= 17) }'; then
    echo "test-java: java is older than 17: $(java -version 2>&1 | head -1)" >&2
    exit 1
fi

# scripts/test.sh hands over the `decree` its Rust tests built (DECREE_BIN) instead of
# building it a second time without their features.
if [ -z "${DECREE_BIN:-}" ]; then
    cargo build --release -p decree-cli --quiet
    export DECREE_BIN="$PWD/target/release/decree"
fi

offline=()
if [ "${DECREE_MVN_OFFLINE:-0}" = 1 ]; then
    offline=(-o)
fi
cd clients/java
rm -rf decree-jta/target/surefire-reports
status=0
# (Debian's Maven 3.8 prints colour resets even in batch mode: filtered out.)
mvn -q -B "${offline[@]}" -Dsurefire.failIfNoSpecifiedTests=false test "$@" 2>&1 | sed -e 's/\x1b\[0m//g' || status=$?

# Surefire prints nothing on success under -q: one closing line from its reports.
python3 - <<'PY' || true
import glob, xml.etree.ElementTree as ET
tests = failures = errors = skipped = 0
for path in glob.glob("*/target/surefire-reports/TEST-*.xml"):
    r = ET.parse(path).getroot()
    tests += int(r.get("tests", 0)); failures += int(r.get("failures", 0))
    errors += int(r.get("errors", 0)); skipped += int(r.get("skipped", 0))
print(f"java: {tests - failures - errors - skipped} passed, {failures + errors} failed, {skipped} skipped")
PY
exit "$status"
