#!/usr/bin/env bash
# A primary + backup pair on loopback, to try: starts two `decree serve` members with their
# own log directories, promotes member 1, runs a short benchmark through it, kills it with
# SIGKILL and promotes member 2, then stops everything.
# Everything lives in a throwaway directory (printed); nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p decree-cli
decree=target/release/decree
dir=$(mktemp -d /tmp/decree-pair.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
link_a=$(port); link_b=$(port)
# The members prove this shared secret to each other before any link frame is read.
(umask 077; head -c 32 /dev/urandom | base64 > "$dir/pair.secret")
member() { # name id link peer_link peer
  cat > "$dir/$1.toml" <<TOML
node = 1
log_dir = "$dir/$1"
unix = "$dir/$1.sock"
[pair]
member = $2
link = "127.0.0.1:$3"
peer_link = "127.0.0.1:$4"
peer_clients = "unix:$dir/$5.sock"
secret_file = "$dir/pair.secret"
[[rm]]
name = "dummy-0"
kind = "dummy"
[[rm]]
name = "dummy-1"
kind = "dummy"
TOML
}
member a 1 "$link_a" "$link_b" b
member b 2 "$link_b" "$link_a" a
wait_for() { for _ in $(seq 200); do [ -S "$1" ] && return; sleep 0.05; done; echo "no $1" >&2; exit 1; }

echo "== two members in $dir, both start as backups"
$decree serve --config "$dir/a.toml" 2>"$dir/a.log" & pids+=($!); pid_a=$!
$decree serve --config "$dir/b.toml" 2>"$dir/b.log" & pids+=($!)
wait_for "$dir/a.sock"; wait_for "$dir/b.sock"
$decree status --config "$dir/a.toml"
echo "== the first promotion of a new pair is forced (nobody holds anything yet)"
$decree promote --force --config "$dir/a.toml"
for _ in $(seq 100); do $decree status --format json --config "$dir/a.toml" | grep -q '"strict":true' && break; sleep 0.05; done
$decree status --config "$dir/a.toml"
$decree status --config "$dir/b.toml"
echo "== a short benchmark through the primary (every commit waits for the backup's disk)"
$decree bench --mode unix --connect "unix:$dir/a.sock" --threads 4 --cycles 200 --t1 0 --t2 0 | tail -3
echo "== member 1 is killed; the operator promotes member 2"
kill -9 "$pid_a"
$decree promote --config "$dir/b.toml"
$decree status --config "$dir/b.toml"
echo "== done; logs in $dir/a.log and $dir/b.log"
