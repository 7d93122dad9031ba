#!/usr/bin/env bash
# decree-jta with real databases against the Rust coordinator (issue 35): at THREADS (16)
# threads, decree-jta's ratio decree / independent commits (clients/java/decree-jta-bench,
# DbBench: a transfer between the two PostgreSQL test databases, through `decree serve` on
# its Unix socket, journal, rpo 0) against `decree bench --rm postgres`'s 2pc / independent,
# in alternated rounds (ROUNDS, default 3; each mode BENCH_SECONDS, default 10, after a
# warm-up of WARMUP seconds, default 2). Needs the
# databases of scripts/test-dbs.sh (eval "$(scripts/test-dbs.sh env)"). Results in
# target/jbench-db/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DECREE_TEST_PG_A:?run eval \"\$(scripts/test-dbs.sh env)\" first}"
THREADS="${THREADS:-16}"
RUN="${BENCH_SECONDS:-10}"
ROUNDS="${ROUNDS:-3}"
WARMUP="${WARMUP:-2}"
OUT=target/jbench-db
rm -rf "$OUT" && mkdir -p "$OUT"

. scripts/bench-java-serve.sh
jdbc() { # a libpq DSN "host=... port=... user=... dbname=..." as a JDBC URL
    python3 -c 'import sys; kv=dict(p.split("=",1) for p in sys.argv[1].split()); print("jdbc:postgresql://%s:%s/%s" % (kv.get("host","127.0.0.1"), kv.get("port","5432"), kv["dbname"]))' "$1"
}
user() { python3 -c 'import sys; kv=dict(p.split("=",1) for p in sys.argv[1].split()); print(kv.get("user","postgres"))' "$1"; }

serve_decree 8 "pg-a postgres $DECREE_TEST_PG_A" "pg-b postgres $DECREE_TEST_PG_B"

rust() {
    target/release/decree bench --rm postgres --threads "$THREADS" --duration "$RUN" \
        --dsn "$DECREE_TEST_PG_A" --dsn "$DECREE_TEST_PG_B" --format json 2>>"$OUT/stderr.log" \
        | grep '"mode"' | sed "s/^{/{\"who\":\"rust\",\"round\":$1,/" | tee -a "$OUT/results.jsonl"
}
java_() {
    java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$CP" dev.decree.bench.DbBench "$THREADS" "$RUN" "$WARMUP" \
        "$(jdbc "$DECREE_TEST_PG_A")" "$(jdbc "$DECREE_TEST_PG_B")" "$(user "$DECREE_TEST_PG_A")" "unix:$PWD/$OUT/decree.sock" \
        2>>"$OUT/stderr.log" | grep '"mode"' | sed "s/^{/{\"who\":\"java\",\"round\":$1,/" | tee -a "$OUT/results.jsonl"
}
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then rust "$round"; java_ "$round"; else java_ "$round"; rust "$round"; fi
done

python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ratios = []
for rnd in sorted({r["round"] for r in rows}):
    get = lambda who, mode: next(r["tps"] for r in rows if r["round"] == rnd and r["who"] == who and r["mode"] == mode)
    j = get("java", "decree") / get("java", "independent")
    r = get("rust", "2pc") / get("rust", "independent")
    ratios.append(j / r)
    print(f"round {rnd}: decree-jta decree/independent {j:.3f} ({get('java','decree'):.0f}/{get('java','independent'):.0f} tps, "
          f"native-2pc {get('java','native-2pc'):.0f}, sequential branch calls {get('java','decree-sequential'):.0f}), Rust 2pc/independent {r:.3f} ({get('rust','2pc'):.0f}/"
          f"{get('rust','independent'):.0f} tps, native-2pc {get('rust','native-2pc'):.0f}): {j / r:.2f}x")
print(f"median of {len(ratios)} rounds: {statistics.median(ratios):.2f}x (target: at least 0.9x)")
PY
