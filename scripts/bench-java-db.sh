#!/usr/bin/env bash
# decree-jta with real databases against the Rust coordinator (issue 35): at THREADS (16)
# threads, decree-jta's ratio decree / independent commits (decree: its default branch
# calls, in parallel while no more transactions call theirs than there are processors;
# decree-sequential and decree-parallel are printed beside it; clients/java/decree-jta-bench,
# DbBench: a transfer between the two PostgreSQL test databases, through `decree serve` on
# its Unix socket, journal, rpo 0) against `decree bench --rm postgres`'s 2pc / independent,
# the Rust coordinator on its embedded log (the issue's reference) and, beside it, with its
# decisions on the same server (--connect: the same socket to cross), in alternated rounds (ROUNDS, default 3; each mode BENCH_SECONDS, default 10; JAVA_MODES
# the DbBench modes, all five by default). Each
# DbBench mode runs in a JVM of its own after a warm-up of WARMUP seconds (default 60): a
# method called once per transfer reaches C2's compile thresholds only after some 10^4
# calls, 10-20 s at this rate, and on two busy cores the C2 compiler thread was still
# compiling 25-40 s into a run (a third of the JVM's CPU; -XX:+PrintCompilation, perf);
# by 60 s it is idle. A JVM that ran another mode first would recompile what a changed
# profile invalidates (docs/measurements.md). Needs the
# databases of scripts/test-dbs.sh (eval "$(scripts/test-dbs.sh env)"). JDBC_PARAMS (for example
# preferQueryMode=extendedForPrepared) goes on the JDBC URLs of every Java mode. Results in
# target/jbench-db/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DECREE_TEST_PG_A:?run eval \"\$(scripts/test-dbs.sh env)\" first}"
THREADS="${THREADS:-16}"
RUN="${BENCH_SECONDS:-10}"
ROUNDS="${ROUNDS:-3}"
WARMUP="${WARMUP:-60}"
# The DbBench modes run (the ratio needs independent and decree; the others are printed beside).
JAVA_MODES="${JAVA_MODES:-independent native-2pc decree-sequential decree-parallel decree}"
OUT=target/jbench-db
rm -rf "$OUT" && mkdir -p "$OUT"

. scripts/bench-java-serve.sh
jdbc() { # a libpq DSN "host=... port=... user=... dbname=..." as a JDBC URL
    python3 -c 'import sys; kv=dict(p.split("=",1) for p in sys.argv[1].split()); print("jdbc:postgresql://%s:%s/%s%s" % (kv.get("host","127.0.0.1"), kv.get("port","5432"), kv["dbname"], sys.argv[2]))' "$1" "${JDBC_PARAMS:+?$JDBC_PARAMS}"
}
user() { python3 -c 'import sys; kv=dict(p.split("=",1) for p in sys.argv[1].split()); print(kv.get("user","postgres"))' "$1"; }

# bench-a and bench-b: the branches of the Rust coordinator when its decisions go to this server.
serve_decree 8 "pg-a postgres $DECREE_TEST_PG_A" "pg-b postgres $DECREE_TEST_PG_B" \
    "bench-a postgres $DECREE_TEST_PG_A" "bench-b postgres $DECREE_TEST_PG_B"

# The Rust coordinator: with its log embedded (who=rust, the issue's reference), and with its
# decisions on the same server as decree-jta's (who=rust-served: the same socket to cross).
rust() {
    local who=rust connect=()
    if [ "${2:-}" = served ]; then who=rust-served connect=(--connect "unix:$PWD/$OUT/decree.sock"); fi
    target/release/decree bench --rm postgres --threads "$THREADS" --duration "$RUN" "${connect[@]}" \
        --dsn "$DECREE_TEST_PG_A" --dsn "$DECREE_TEST_PG_B" --format json 2>>"$OUT/stderr.log" \
        | grep '"mode"' | sed "s/^{/{\"who\":\"$who\",\"round\":$1,/" | tee -a "$OUT/results.jsonl"
}
java_() {
    local mode
    for mode in $JAVA_MODES; do
        java -Ddecree.bench.modes="$mode" -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$CP" dev.decree.bench.DbBench \
            "$THREADS" "$RUN" "$WARMUP" "$(jdbc "$DECREE_TEST_PG_A")" "$(jdbc "$DECREE_TEST_PG_B")" "$(user "$DECREE_TEST_PG_A")" \
            "unix:$PWD/$OUT/decree.sock" \
            2>>"$OUT/stderr.log" | grep '"mode"' | sed "s/^{/{\"who\":\"java\",\"round\":$1,/" | tee -a "$OUT/results.jsonl"
    done
}
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then rust "$round"; java_ "$round"; rust "$round" served
    else rust "$round" served; java_ "$round"; rust "$round"; fi
done

python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ratios, served_ratios = [], []
for rnd in sorted({r["round"] for r in rows}):
    get = lambda who, mode: next((r["tps"] for r in rows if r["round"] == rnd and r["who"] == who and r["mode"] == mode), float("nan"))
    j = get("java", "decree") / get("java", "independent")
    r = get("rust", "2pc") / get("rust", "independent")
    ratios.append(j / r)
    rs = get("rust-served", "2pc") / get("rust-served", "independent")
    served_ratios.append(j / rs)
    beside = "".join(f", {name} {get('java', mode):.0f}" for mode, name in
                     (("native-2pc", "native-2pc"), ("decree-sequential", "branch calls one after the other"),
                      ("decree-parallel", "always parallel")) if get("java", mode) == get("java", mode))
    print(f"round {rnd}: decree-jta decree/independent {j:.3f} ({get('java','decree'):.0f}/{get('java','independent'):.0f} tps"
          f"{beside}), Rust 2pc/independent {r:.3f} ({get('rust','2pc'):.0f}/"
          f"{get('rust','independent'):.0f} tps, native-2pc {get('rust','native-2pc'):.0f}): {j / r:.2f}x; "
          f"through the server {rs:.3f} ({get('rust-served','2pc'):.0f}/{get('rust-served','independent'):.0f} tps): {j / rs:.2f}x")
print(f"median of {len(ratios)} rounds: {statistics.median(ratios):.2f}x against the Rust coordinator on its embedded log "
      f"(target: at least 0.9x); {statistics.median(served_ratios):.2f}x against it through the same server")
PY
