# Sourced by scripts/bench-java.sh and scripts/bench-java-db.sh (from the repository root, with
# OUT set): builds `decree` and the benchmark jar (CP: its class path), and `serve_decree NODE
# RM...` starts `decree serve` (journal engine, rpo 0) on the Unix socket $OUT/decree.sock,
# one [[rm]] entry per RM ("name kind [dsn]"), stopped when the script exits.

cargo build --release -p decree-cli --quiet
(cd clients/java && mvn -q -B -P bench -DskipTests package 2>&1 | sed -e 's/\x1b\[0m//g')
CP="clients/java/decree-jta-bench/target/decree-jta-bench-0.1.0-SNAPSHOT.jar:clients/java/decree-jta-bench/target/lib/*"

serve_decree() {
    local node=$1 spec name kind dsn
    shift
    {
        printf 'node = %s\nlog_dir = "%s"\nengine = "journal"\nrpo_ms = 0\nunix = "%s"\n' "$node" "$PWD/$OUT/decree-log" \
            "$PWD/$OUT/decree.sock"
        for spec in "$@"; do
            read -r name kind dsn <<<"$spec"
            printf '[[rm]]\nname = "%s"\nkind = "%s"\n' "$name" "$kind"
            if [ -n "$dsn" ]; then
                printf 'dsn = "%s"\n' "$dsn"
            fi
        done
    } > "$OUT/decree.toml"
    target/release/decree serve --config "$OUT/decree.toml" > "$OUT/serve.log" 2>&1 &
    SERVER=$!
    trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
    for _ in $(seq 100); do [ -S "$OUT/decree.sock" ] && break; sleep 0.1; done
}
