#!/usr/bin/env bash
# A throwaway 3-member etcd cluster for decree's tests (the pair's election, issue 33).
#
#   scripts/test-etcd.sh start         # start the cluster (idempotent: running members are left alone)
#   scripts/test-etcd.sh env           # print `export DECREE_TEST_ETCD...=...` lines for the tests
#   scripts/test-etcd.sh status        # say which member runs where
#   scripts/test-etcd.sh stop          # stop every member and delete the data
#   scripts/test-etcd.sh kill NAME...     # SIGKILL members (etcd0, etcd1, etcd2), keeping their data
#   scripts/test-etcd.sh restart NAME...  # start killed members again on their ports, with their data
#
# Typical use:
#   scripts/test-etcd.sh start && eval "$(scripts/test-etcd.sh env)" && cargo test -p decree-etcd
#   scripts/test-etcd.sh stop
#
# The members listen on 127.0.0.1 only (client and peer ports), with heartbeat 10 ms and
# election timeout 100 ms (the settings issue 33's failover figures are taken with), and keep
# their data in one directory: $DECREE_TEST_ETCD_DIR, default /dev/shm/decree-test-etcd when
# /dev/shm is a writable tmpfs, else ${TMPDIR:-/tmp}/decree-test-etcd. Its files name the
# ports (NAME.client-port, NAME.peer-port), the pids (NAME.pid) and the logs (NAME.log).
#
# When run as root on a machine without etcd, it installs Debian's `etcd-server` with apt-get,
# and `protobuf-compiler` too: the etcd client crate (crates/decree-etcd) runs protoc when
# it is built, and `cargo test --workspace` builds it.
#
# The default ports lie below Linux's ephemeral range (32768-60999): a member killed and
# restarted on its ports must find them free, and one end of an open connection may take a port
# of that range while its member is down (CI saw a restart fail so, "bind: address already in
# use", when the default was 42379). A port taken is skipped, and a cluster that
# still fails to bind is started again on the next ports; a member that does not start gets an
# error with the end of its log.
#
# Knobs (environment): DECREE_TEST_ETCD_DIR, DECREE_TEST_ETCD_PORT (the first port tried,
# default 22379; six are needed: a client and a peer port per member).
set -euo pipefail

if [ -n "${DECREE_TEST_ETCD_DIR:-}" ]; then
    BASE="$DECREE_TEST_ETCD_DIR"
elif [ -d /dev/shm ] && [ -w /dev/shm ]; then
    BASE=/dev/shm/decree-test-etcd
else
    BASE="${TMPDIR:-/tmp}/decree-test-etcd"
fi
PORT_DEFAULT="${DECREE_TEST_ETCD_PORT:-22379}"
MEMBERS=(etcd0 etcd1 etcd2)
CLUSTER_TOKEN=decree-test-etcd
HEARTBEAT_MS=10
ELECTION_MS=100
# A port search gives up after this many candidates.
PORT_TRIES_MAX=50
# Start attempts, for a cluster stopped by a port taken between the check and its bind.
START_TRIES_MAX=3
# How long a member (or the cluster) may take to answer /health as healthy, in tenths of a second.
HEALTH_WAIT_TENTHS=300

die() { echo "test-etcd: $*" >&2; exit 1; }
say() { echo "test-etcd: $*" >&2; }

is_root() { [ "$(id -u)" = 0 ]; }

install_missing() {
    local pkgs=()
    command -v etcd >/dev/null 2>&1 || pkgs+=(etcd-server)
    command -v protoc >/dev/null 2>&1 || pkgs+=(protobuf-compiler)
    [ ${#pkgs[@]} -eq 0 ] && return
    is_root || die "missing ${pkgs[*]}: install them (apt-get install ${pkgs[*]}) or run as root"
    say "installing ${pkgs[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${pkgs[@]}" >/dev/null || die "apt-get install ${pkgs[*]} failed"
    # The package may start the distribution's own etcd on 2379; the tests use their own.
    service etcd stop >/dev/null 2>&1 || true
}

. "$(dirname "$0")/test-ports.sh"

client_port() { cat "$BASE/$1.client-port" 2>/dev/null; }
peer_port() { cat "$BASE/$1.peer-port" 2>/dev/null; }

known_member() {
    local m
    for m in "${MEMBERS[@]}"; do [ "$m" = "$1" ] && return 0; done
    die "no member '$1': the members are ${MEMBERS[*]}"
}

member_running() {
    [ -f "$BASE/$1.pid" ] && kill -0 "$(cat "$BASE/$1.pid")" 2>/dev/null
}

# True when the member answers /health with a healthy cluster (it sees a leader).
member_healthy() {
    local port reply
    port=$(client_port "$1") || return 1
    reply=$({
        exec 3<>"/dev/tcp/127.0.0.1/$port" \
            && printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 \
            && timeout 2 cat <&3
    } 2>/dev/null) || return 1
    [[ "$reply" == *'"health":"true"'* ]]
}

initial_cluster() {
    local m out=""
    for m in "${MEMBERS[@]}"; do out+="${out:+,}$m=http://127.0.0.1:$(peer_port "$m")"; done
    echo "$out"
}

# Starts one member in the background on the ports its files name; $2 is the cluster state
# (new for a first start, existing when its data directory is there already).
launch_member() {
    local m=$1 state=$2 cport pport
    cport=$(client_port "$m")
    pport=$(peer_port "$m")
    # setsid: the member must outlive this script and not get its terminal's signals.
    setsid etcd --name "$m" --data-dir "$BASE/$m.data" \
        --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "$(initial_cluster)" --initial-cluster-token "$CLUSTER_TOKEN" \
        --initial-cluster-state "$state" \
        --heartbeat-interval "$HEARTBEAT_MS" --election-timeout "$ELECTION_MS" \
        --logger zap --log-outputs stderr \
        </dev/null >>"$BASE/$m.log" 2>&1 &
    echo $! >"$BASE/$m.pid"
}

# Waits until every named member answers healthy; fails when one is gone or time runs out.
wait_healthy() {
    local i m all
    for ((i = 0; i < HEALTH_WAIT_TENTHS; i++)); do
        all=1
        for m in "$@"; do
            member_running "$m" || return 1
            member_healthy "$m" || all=0
        done
        [ "$all" = 1 ] && return 0
        sleep 0.1
    done
    return 1
}

kill_member() {
    local pid
    member_running "$1" || return 0
    pid=$(cat "$BASE/$1.pid")
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

# Says which member failed and why, from the end of its log.
start_failure() {
    local m msg="the etcd cluster did not become healthy on 127.0.0.1:"
    for m in "${MEMBERS[@]}"; do msg+=" $m=$(client_port "$m")"; done
    for m in "${MEMBERS[@]}"; do
        if member_running "$m"; then msg+="
  $m: running but not healthy; the end of $BASE/$m.log:"
        else msg+="
  $m: exited; the end of $BASE/$m.log:"
        fi
        msg+="
$(log_tail "$BASE/$m.log")"
    done
    echo "$msg"
}

start_cluster() {
    local m running=0
    for m in "${MEMBERS[@]}"; do member_running "$m" && running=$((running + 1)); done
    if [ "$running" = ${#MEMBERS[@]} ]; then
        say "etcd already running: $(endpoints)"
        return
    fi
    if [ "$running" != 0 ]; then
        local stopped=()
        for m in "${MEMBERS[@]}"; do member_running "$m" || stopped+=("$m"); done
        restart_members "${stopped[@]}"
        return
    fi
    mkdir -p "$BASE"
    local try port=$PORT_DEFAULT failure=""
    for ((try = 0; try < START_TRIES_MAX; try++)); do
        rm -rf "${BASE:?}"/*
        for m in "${MEMBERS[@]}"; do
            port=$(free_port_from "$port")
            echo "$port" >"$BASE/$m.client-port"
            port=$(free_port_from $((port + 1)))
            echo "$port" >"$BASE/$m.peer-port"
            port=$((port + 1))
        done
        for m in "${MEMBERS[@]}"; do launch_member "$m" new; done
        if wait_healthy "${MEMBERS[@]}"; then
            say "etcd started: $(endpoints) (data in $BASE)"
            return
        fi
        failure=$(start_failure)
        for m in "${MEMBERS[@]}"; do kill_member "$m"; done
        grep -q "address already in use" "$BASE"/*.log 2>/dev/null || break
        say "a member could not bind its port, trying the next ones"
    done
    die "$failure"
}

# Starts the named members again on their ports, with their data, and waits until each is
# healthy: members killed together are restarted together (one alone has no quorum).
restart_members() {
    local m
    [ -f "$BASE/${MEMBERS[0]}.client-port" ] \
        || die "the test etcd cluster is not started: run scripts/test-etcd.sh start"
    for m in "$@"; do
        known_member "$m"
        if member_running "$m"; then say "$m already running"; else launch_member "$m" existing; fi
    done
    if ! wait_healthy "$@"; then
        local msg="not healthy again after a restart:"
        for m in "$@"; do msg+="
  $m on 127.0.0.1:$(client_port "$m"); the end of $BASE/$m.log:
$(log_tail "$BASE/$m.log")"; done
        die "$msg"
    fi
    say "$* restarted"
}

endpoints() {
    local m out=""
    for m in "${MEMBERS[@]}"; do out+="${out:+,}http://127.0.0.1:$(client_port "$m")"; done
    echo "$out"
}

print_env() {
    [ -f "$BASE/${MEMBERS[0]}.client-port" ] \
        || die "the test etcd cluster is not started: run scripts/test-etcd.sh start"
    local m members=""
    for m in "${MEMBERS[@]}"; do members+="${members:+ }$m=$(client_port "$m")"; done
    echo "export DECREE_TEST_ETCD=$(endpoints)"
    # What a test needs to kill and restart one member: the script, its directory and each
    # member's name with its client port (`scripts/test-etcd.sh kill|restart NAME`).
    echo "export DECREE_TEST_ETCD_DIR='$BASE'"
    echo "export DECREE_TEST_ETCD_MEMBERS='$members'"
    echo "export DECREE_TEST_ETCD_SCRIPT='$(cd "$(dirname "$0")" && pwd)/$(basename "$0")'"
}

status() {
    local m
    for m in "${MEMBERS[@]}"; do
        if member_healthy "$m"; then
            echo "$m: running on 127.0.0.1:$(client_port "$m") (peer $(peer_port "$m")), healthy"
        elif member_running "$m"; then
            echo "$m: running on 127.0.0.1:$(client_port "$m"), not healthy (no leader?)"
        else
            echo "$m: stopped"
        fi
    done
}

stop_all() {
    local m pid i
    for m in "${MEMBERS[@]}"; do
        member_running "$m" || continue
        pid=$(cat "$BASE/$m.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill_member "$m"
    done
    rm -rf "$BASE"
    say "stopped; removed $BASE"
}

case "${1:-}" in
    start)
        install_missing
        start_cluster
        ;;
    stop) stop_all ;;
    env) print_env ;;
    status) status ;;
    kill)
        shift
        [ $# -gt 0 ] || die "usage: $0 kill NAME..."
        for m in "$@"; do known_member "$m"; done
        for m in "$@"; do kill_member "$m"; done
        say "$* killed"
        ;;
    restart)
        shift
        [ $# -gt 0 ] || die "usage: $0 restart NAME..."
        restart_members "$@"
        ;;
    *) die "usage: $0 start|stop|env|status|kill NAME...|restart NAME..." ;;
esac
