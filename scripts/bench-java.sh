#!/usr/bin/env bash
# The Java JTA benchmark (issue 35): decree-jta (through `decree serve` over its Unix socket,
# journal engine, rpo 0) against Narayana 7.3.4 (its slot store on disk and its journal,
# both syncing every write) and Atomikos 6.0, in the shape of Narayana's own performance
# suite: each thread begins, enlists two no-op XAResources that vote yes, and commits; a
# fresh JVM per run with a warm-up; the transaction managers alternate within each round,
# all logs on the same disk (under target/), and the disk's synced 4 KiB write rate is
# measured in the same run. Prints a table (tps, p50/p99 latency in µs, decree's ratio to
# Narayana's best durable store and to Atomikos) and keeps the JSON lines in
# target/jbench/results.jsonl.
#
# Knobs: THREADS (default "1 4 16 64"), BENCH_SECONDS (measured, default 10), WARMUP (default 3),
# ROUNDS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS="${THREADS:-1 4 16 64}"
SECONDS_RUN="${BENCH_SECONDS:-10}"
WARMUP="${WARMUP:-3}"
ROUNDS="${ROUNDS:-2}"
OUT=target/jbench
rm -rf "$OUT" && mkdir -p "$OUT"

. scripts/bench-java-serve.sh
JAVA=(java -Djava.util.logging.config.file=/dev/null -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$CP")
serve_decree 7 "d1 dummy" "d2 dummy"

run() { # tm threads
    local dir="$OUT/run-$1-$2-$RANDOM"
    "${JAVA[@]}" dev.decree.bench.JtaBench "$1" "$2" "$SECONDS_RUN" "$WARMUP" "$dir" "unix:$PWD/$OUT/decree.sock" \
        2>>"$OUT/stderr.log" | grep '^{' | tee -a "$OUT/results.jsonl"
    rm -rf "$dir"
}

for round in $(seq "$ROUNDS"); do
    "${JAVA[@]}" dev.decree.bench.JtaBench fsync 1 2 0 "$OUT/fsync" | tee -a "$OUT/results.jsonl"
    for t in $THREADS; do
        for tm in decree narayana-slot narayana-journal atomikos; do
            run "$tm" "$t"
        done
    done
done

python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fs = [r["writes_per_s"] for r in rows if r["tm"] == "fsync"]
print(f"\ndisk: synced 4 KiB writes/s (median of {len(fs)}): {statistics.median(fs):.0f}")
best = {}
for r in rows:
    if r["tm"] == "fsync":
        continue
    key = (r["tm"], r["threads"])
    if key not in best or r["tps"] > best[key]["tps"]:
        best[key] = r
threads = sorted({k[1] for k in best})
tms = ["decree", "narayana-slot", "narayana-journal", "atomikos"]
print("\nbest run of each (tps, p50/p99 µs); ratios: decree-jta's tps over Narayana's best durable store and over Atomikos")
print("| threads | " + " | ".join(tms) + " | decree / Narayana best | decree / Atomikos |")
print("|---|" + "---|" * (len(tms) + 2))
for t in threads:
    cells = []
    for tm in tms:
        r = best.get((tm, t))
        cells.append(f"{r['tps']:.0f} ({r['p50_us']:.0f}/{r['p99_us']:.0f})" if r else "-")
    d = best.get(("decree", t))
    nb = max((best[(tm, t)]["tps"] for tm in ("narayana-slot", "narayana-journal") if (tm, t) in best), default=None)
    at = best.get(("atomikos", t))
    r1 = f"{d['tps'] / nb:.2f}x" if d and nb else "-"
    r2 = f"{d['tps'] / at['tps']:.2f}x" if d and at and at["tps"] else "-"
    print(f"| {t} | " + " | ".join(cells) + f" | {r1} | {r2} |")
PY
