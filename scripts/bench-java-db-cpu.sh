#!/usr/bin/env bash
# The CPU one transfer costs in each process, for one DbBench mode (issue 35): runs
# `scripts/bench-java-db.sh`'s set-up (decree serve, journal, rpo 0, on its Unix socket), then
# DbBench with only MODE (independent, native-2pc, decree-sequential, decree-parallel,
# decree) in a fresh JVM at THREADS (16) threads, warm-up WARMUP (60) s, BENCH_SECONDS (10)
# s, and samples /proc over the measured window but its first and last second: CPU
# microseconds per transfer of the JVM, of `decree serve`, of the PostgreSQL processes
# (postmaster and backends), and of everything else (PostgreSQL included, the kernel's work
# outside processes), and how many of the machine's cores were busy. Needs the
# databases of scripts/test-dbs.sh; JAVA_OPTS goes to the JVM, JDBC_PARAMS on the JDBC URLs. Usage: scripts/bench-java-db-cpu.sh MODE
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DECREE_TEST_PG_A:?run eval \"\$(scripts/test-dbs.sh env)\" first}"
MODE="${1:?usage: scripts/bench-java-db-cpu.sh MODE}"
THREADS="${THREADS:-16}"
RUN="${BENCH_SECONDS:-10}"
WARMUP="${WARMUP:-60}"
OUT=target/jbench-db-cpu
rm -rf "$OUT" && mkdir -p "$OUT"
[ "$RUN" -ge 4 ] || { echo "BENCH_SECONDS must be at least 4" >&2; exit 2; }

. scripts/bench-java-serve.sh
jdbc() { python3 -c 'import sys; kv=dict(p.split("=",1) for p in sys.argv[1].split()); print("jdbc:postgresql://%s:%s/%s%s" % (kv.get("host","127.0.0.1"), kv.get("port","5432"), kv["dbname"], sys.argv[2]))' "$1" "${JDBC_PARAMS:+?$JDBC_PARAMS}"; }
user() { python3 -c 'import sys; kv=dict(p.split("=",1) for p in sys.argv[1].split()); print(kv.get("user","postgres"))' "$1"; }
serve_decree 8 "pg-a postgres $DECREE_TEST_PG_A" "pg-b postgres $DECREE_TEST_PG_B"

java ${JAVA_OPTS:-} -Ddecree.bench.modes="$MODE" -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$CP" dev.decree.bench.DbBench \
    "$THREADS" "$RUN" "$WARMUP" "$(jdbc "$DECREE_TEST_PG_A")" "$(jdbc "$DECREE_TEST_PG_B")" "$(user "$DECREE_TEST_PG_A")" \
    "unix:$PWD/$OUT/decree.sock" > "$OUT/dbbench.out" 2> "$OUT/dbbench.err" &
JAVA=$!
cpu() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; } # utime + stime of a process, in seconds
# utime + stime of every process named postgres, in seconds (a process that exits meanwhile is skipped)
pg() { awk '$2 == "(postgres)" { t += $14 + $15 } END { print t / 100 }' /proc/[0-9]*/stat 2>/dev/null || true; }
busy() { awk '/^cpu /{print ($2 + $3 + $4 + $7 + $8) / 100}' /proc/stat; } # the machine's busy seconds
sleep $((WARMUP + 1))
j0=$(cpu $JAVA) s0=$(cpu $SERVER) p0=$(pg) b0=$(busy) t0=$(date +%s.%N)
sleep $((RUN - 2))
j1=$(cpu $JAVA) s1=$(cpu $SERVER) p1=$(pg) b1=$(busy) t1=$(date +%s.%N)
wait $JAVA
python3 - "$MODE" "$OUT/dbbench.out" $j0 $j1 $s0 $s1 $p0 $p1 $b0 $b1 $t0 $t1 <<'PY'
import json, sys
mode, out = sys.argv[1:3]
j0, j1, s0, s1, p0, p1, b0, b1, t0, t1 = map(float, sys.argv[3:])
tps = [json.loads(l) for l in open(out) if l.startswith('{"mode"')][-1]["tps"]
n = tps * (t1 - t0)  # transfers in the sampled window, at the run's rate
us = lambda s: 1e6 * s / n
print(json.dumps({"mode": mode, "tps": tps, "jvm_us": round(us(j1 - j0)), "serve_us": round(us(s1 - s0)),
                  "postgres_us": round(us(p1 - p0)),
                  "rest_us": round(us((b1 - b0) - (j1 - j0) - (s1 - s0))), "total_us": round(us(b1 - b0)),
                  "busy_cores": round((b1 - b0) / (t1 - t0), 2)}))
PY
