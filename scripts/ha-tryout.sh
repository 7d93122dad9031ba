#!/usr/bin/env bash
# High availability on etcd, to try (issue 34): starts a 3-member etcd cluster and two pairs
# ("orders", node 1, and "payments", node 2), each two `decree serve` members elected on
# etcd, all on loopback. It shows the cluster, runs a short benchmark through each pair,
# kills the orders primary with SIGKILL (a failover, timed), switches payments over to its
# backup, shows the cluster again and stops everything.
# Everything lives in a throwaway directory (printed); nothing is left running.
# Needs etcd (Debian's etcd-server; scripts/test-etcd.sh installs it when run as root) and a
# decree built with the etcd feature: built here, or the one DECREE_BIN names.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DECREE_BIN:-}" ]; then
    cargo build --release -q -p decree-cli --features etcd
    DECREE_BIN=target/release/decree
fi
decree=$DECREE_BIN
$decree --version | grep -q etcd || { echo "$decree was built without the etcd feature" >&2; exit 1; }
dir=$(mktemp -d /tmp/decree-ha.XXXXXX)
pids=()
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd() { DECREE_TEST_ETCD_DIR="$dir/etcd" DECREE_TEST_ETCD_PORT="$etcd_port" scripts/test-etcd.sh "$@"; }
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    etcd stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

etcd_port=$(( ($(port) % 20000) + 30000 ))
echo "== a 3-member etcd cluster (heartbeat 10 ms, election 100 ms), data in $dir/etcd"
etcd start
eval "$(etcd env)"
endpoints=$(echo "$DECREE_TEST_ETCD" | sed 's/[^,]*/"&"/g; s/,/, /g')

member() { # pair node name id link peer_link peer
    local pair=$1 node=$2 name=$3 id=$4
    cat > "$dir/$name.toml" <<TOML
node = $node
log_dir = "$dir/$name"
unix = "$dir/$name.sock"
[pair]
member = $id
link = "127.0.0.1:$5"
peer_link = "127.0.0.1:$6"
peer_clients = "unix:$dir/$7.sock"
secret_file = "$dir/$pair.secret"
[pair.etcd]
endpoints = [$endpoints]
pair = "$pair"
lease_ttl_s = 1
[[rm]]
name = "dummy-0"
kind = "dummy"
[[rm]]
name = "dummy-1"
kind = "dummy"
TOML
}
declare -A pid_of
serve() { $decree serve --config "$dir/$1.toml" 2>>"$dir/$1.log" & pids+=($!); pid_of[$1]=$!; }
# The role of member $1 ("primary strict", "backup caught up", ...), empty while it cannot answer.
role() {
    $decree status --format json --config "$dir/$1.toml" 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(s.get("role", ""), "strict" if s.get("strict") else "", "caught-up" if s.get("caught_up") else "")' 2>/dev/null || true
}
# Whether member $1 leads strictly with member $2 caught up.
strict() { [[ "$(role "$1")" == "primary strict"* && "$(role "$2")" == "backup"*"caught-up" ]]; }
# Waits until one of members $1 and $2 leads strictly with the other caught up; prints the primary.
wait_strict() {
    for _ in $(seq 600); do
        if strict "$1" "$2"; then echo "$1"; return; fi
        if strict "$2" "$1"; then echo "$2"; return; fi
        sleep 0.05
    done
    echo "no strict pair of $1 and $2; logs in $dir" >&2
    exit 1
}

for pair in orders payments; do
    (umask 077; head -c 32 /dev/urandom | base64 > "$dir/$pair.secret")
done
la=$(port); lb=$(port); lc=$(port); ld=$(port)
member orders 1 orders-a 1 "$la" "$lb" orders-b
member orders 1 orders-b 2 "$lb" "$la" orders-a
member payments 2 payments-a 1 "$lc" "$ld" payments-b
member payments 2 payments-b 2 "$ld" "$lc" payments-a
echo "== two pairs, four members; etcd elects each pair's primary (no decree promote)"
for m in orders-a orders-b payments-a payments-b; do serve "$m"; done
orders=$(wait_strict orders-a orders-b)
payments=$(wait_strict payments-a payments-b)
$decree status --etcd --config "$dir/orders-a.toml"

echo "== a short benchmark through each pair's primary (every commit waits for its backup's disk)"
for primary in "$orders" "$payments"; do
    $decree bench --mode unix --connect "unix:$dir/$primary.sock" --threads 4 --cycles 200 --t1 0 --t2 0 | tail -2
done

echo "== SIGKILL of the orders primary ($orders): its backup leads once the 1 s lease expires"
other=orders-a; [ "$orders" = orders-a ] && other=orders-b
killed_at=$(date +%s%N)
kill -9 "${pid_of[$orders]}"
until [[ "$(role "$other")" == primary* ]]; do sleep 0.01; done
echo "   $other leads $(( ($(date +%s%N) - killed_at) / 1000000 )) ms after the kill"
echo "== the killed member restarts and follows the new primary as its backup"
serve "$orders"
orders=$(wait_strict orders-a orders-b)
$decree status --config "$dir/$orders.toml"

echo "== switchover: the payments primary ($payments) hands the lead to its in-sync backup"
$decree switchover --config "$dir/$payments.toml"
payments=$(wait_strict payments-a payments-b)
echo "   payments is led by $payments"
$decree status --etcd --config "$dir/orders-a.toml"
echo "== done; logs in $dir/*.log"
