#!/usr/bin/env bash
# Throwaway PostgreSQL and MariaDB servers for decree's tests.
#
#   scripts/test-dbs.sh start   # start both (idempotent: a running server is left alone)
#   scripts/test-dbs.sh env     # print `export DECREE_TEST_...=...` lines for the tests
#   scripts/test-dbs.sh status  # say what runs where
#   scripts/test-dbs.sh stop    # stop both and delete their data
#
# Typical use:
#   scripts/test-dbs.sh start && eval "$(scripts/test-dbs.sh env)" && cargo test --workspace
#   scripts/test-dbs.sh stop
#
# Both servers live in one directory ($DECREE_TEST_DBS_DIR, default
# ${TMPDIR:-/tmp}/decree-test-dbs), listen on 127.0.0.1 only, keep their Unix sockets inside
# that directory and never touch the system's own database clusters. PostgreSQL gets
# max_prepared_transactions = 100 (PREPARE TRANSACTION is disabled by default) and trust
# authentication for the user `decree`; MariaDB gets a password-less user `decree` limited to
# 127.0.0.1. Databases: decree_a and decree_b (PostgreSQL), decree_m and decree_m2 (MariaDB).
#
# PostgreSQL and MariaDB refuse to run as root, so when this script runs as root it runs the
# servers as an unprivileged user (`postgres` if it exists, else a created `decree-test`).
# When run as root on a machine without the servers, it installs them with apt-get.
#
# A port taken (by a listener, or by one end of an open connection: the defaults lie in Linux's
# ephemeral range) is skipped, and a server that still fails to bind is started again on the
# next port; a server that does not start gets an error with the end of its log.
#
# Knobs (environment): DECREE_TEST_DBS_DIR, DECREE_TEST_PG_PORT (default 55432),
# DECREE_TEST_MARIADB_PORT (default 53306), DECREE_TEST_DBS_FSYNC (on|off, default off:
# the data is thrown away anyway and a killed server loses nothing the OS already holds),
# DECREE_TEST_DBS_ONLY (postgres|mariadb: start that one alone; default both).
set -euo pipefail

BASE="${DECREE_TEST_DBS_DIR:-${TMPDIR:-/tmp}/decree-test-dbs}"
PG_PORT_DEFAULT="${DECREE_TEST_PG_PORT:-55432}"
MARIADB_PORT_DEFAULT="${DECREE_TEST_MARIADB_PORT:-53306}"
FSYNC="${DECREE_TEST_DBS_FSYNC:-off}"
ONLY="${DECREE_TEST_DBS_ONLY:-}"
DB_USER_NAME=decree
# A port search gives up after this many candidates.
PORT_TRIES_MAX=50

PG_DATA="$BASE/pg"
PG_SOCK="$BASE/sock-pg"
PG_LOG="$BASE/pg.log"
MARIADB_DATA="$BASE/mariadb"
MARIADB_SOCK="$BASE/sock-mariadb/mariadb.sock"
MARIADB_PID="$BASE/mariadb.pid"
MARIADB_LOG="$BASE/mariadb.log"

die() { echo "test-dbs: $*" >&2; exit 1; }
say() { echo "test-dbs: $*" >&2; }

is_root() { [ "$(id -u)" = 0 ]; }

# The OS user that runs the servers.
os_user() {
    if ! is_root; then id -un; return; fi
    if id postgres >/dev/null 2>&1; then echo postgres; return; fi
    if ! id decree-test >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin decree-test >/dev/null 2>&1 \
            || die "cannot create the unprivileged user decree-test (useradd failed)"
    fi
    echo decree-test
}

# Runs a command as the server user.
as_user() {
    if is_root; then runuser -u "$(os_user)" -- "$@"; else "$@"; fi
}

pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
    return 1
}

mariadbd_bin() {
    local b
    for b in mariadbd mysqld /usr/sbin/mariadbd /usr/sbin/mysqld; do
        if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return; fi
    done
    return 1
}

install_missing() {
    local pkgs=()
    pg_bindir >/dev/null || pkgs+=(postgresql)
    mariadbd_bin >/dev/null || pkgs+=(mariadb-server)
    command -v psql >/dev/null 2>&1 || pkgs+=(postgresql-client)
    command -v mariadb >/dev/null 2>&1 || command -v mysql >/dev/null 2>&1 || pkgs+=(mariadb-client)
    [ ${#pkgs[@]} -eq 0 ] && return
    is_root || die "missing ${pkgs[*]}: install them (apt-get install ${pkgs[*]}) or run as root"
    say "installing ${pkgs[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${pkgs[@]}" >/dev/null
}

. "$(dirname "$0")/test-ports.sh"

# Start attempts, for a server stopped by a port taken between the check and its bind.
START_TRIES_MAX=3

prepare_base() {
    mkdir -p "$BASE"
    chmod 0755 "$BASE"
    if is_root; then chown "$(os_user)" "$BASE"; fi
    as_user test -w "$BASE" || die "$BASE is not writable by $(os_user): set DECREE_TEST_DBS_DIR"
}

psql_admin() {
    as_user psql -X -q -h "$PG_SOCK" -p "$(cat "$BASE/pg.port")" -U "$DB_USER_NAME" -d postgres \
        -v ON_ERROR_STOP=1 "$@"
}

pg_running() {
    local bin
    bin=$(pg_bindir) || return 1
    [ -f "$PG_DATA/PG_VERSION" ] && as_user "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1
}

start_pg() {
    local bin port
    bin=$(pg_bindir) || die "PostgreSQL (initdb) not found"
    if pg_running; then
        say "PostgreSQL already running on port $(cat "$BASE/pg.port")"
    else
        if [ ! -f "$PG_DATA/PG_VERSION" ]; then
            rm -rf "$PG_DATA"
            as_user "$bin/initdb" -D "$PG_DATA" -U "$DB_USER_NAME" --auth=trust -E UTF8 \
                --no-instructions >"$BASE/initdb.log" 2>&1 \
                || die "initdb failed, see $BASE/initdb.log"
        fi
        as_user mkdir -p "$PG_SOCK"
        local try started=0
        port=$PG_PORT_DEFAULT
        for ((try = 0; try < START_TRIES_MAX; try++)); do
            port=$(free_port_from "$port")
            # Settings are rewritten at every start so that a changed port takes effect.
            as_user tee "$PG_DATA/postgresql.auto.conf" >/dev/null <<EOF
# Written by scripts/test-dbs.sh at each start.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PG_SOCK'
max_prepared_transactions = 100
max_connections = 200
fsync = $FSYNC
full_page_writes = $FSYNC
# A test that waits for a row held by a forgotten prepared transaction fails instead of
# hanging (MariaDB's innodb_lock_wait_timeout does the same, 50 s by default).
lock_timeout = '60s'
EOF
            echo "$port" >"$BASE/pg.port"
            if as_user "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start >/dev/null; then
                started=1
                break
            fi
            grep -q "could not bind" "$PG_LOG" 2>/dev/null || break
            say "PostgreSQL could not bind port $port, trying the next one"
            port=$((port + 1))
        done
        [ "$started" = 1 ] || die "PostgreSQL did not start on 127.0.0.1:$port; the end of $PG_LOG:
$(log_tail "$PG_LOG")"
        say "PostgreSQL started on 127.0.0.1:$port"
    fi
    local db
    for db in decree_a decree_b; do
        if [ "$(psql_admin -tA -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]; then
            psql_admin -c "CREATE DATABASE $db"
        fi
    done
}

mariadb_client() {
    local c
    c=$(command -v mariadb || command -v mysql) || die "the mariadb client is not installed"
    as_user "$c" --no-defaults --protocol=socket --socket="$MARIADB_SOCK" -uroot "$@"
}

mariadb_running() {
    [ -f "$MARIADB_PID" ] && kill -0 "$(cat "$MARIADB_PID")" 2>/dev/null \
        && mariadb_client -e 'SELECT 1' >/dev/null 2>&1
}

start_mariadb() {
    local bin port i
    bin=$(mariadbd_bin) || die "MariaDB (mariadbd) not found"
    if mariadb_running; then
        say "MariaDB already running on port $(cat "$BASE/mariadb.port")"
    else
        if [ ! -d "$MARIADB_DATA/mysql" ]; then
            rm -rf "$MARIADB_DATA"
            as_user mkdir -p "$MARIADB_DATA"
            # root@localhost without a password, reachable through the socket only.
            as_user mariadb-install-db --no-defaults --datadir="$MARIADB_DATA" \
                --auth-root-authentication-method=normal --skip-test-db \
                >"$BASE/mariadb-install-db.log" 2>&1 \
                || die "mariadb-install-db failed, see $BASE/mariadb-install-db.log"
        fi
        as_user mkdir -p "$(dirname "$MARIADB_SOCK")"
        local flush=1 try server
        [ "$FSYNC" = off ] && flush=2
        port=$MARIADB_PORT_DEFAULT
        for ((try = 0; try < START_TRIES_MAX; try++)); do
            port=$(free_port_from "$port")
            as_user rm -f "$MARIADB_LOG"
            # setsid: the server must outlive this script and not get its terminal's signals.
            as_user setsid "$bin" --no-defaults --datadir="$MARIADB_DATA" --bind-address=127.0.0.1 \
                --port="$port" --socket="$MARIADB_SOCK" --pid-file="$MARIADB_PID" \
                --log-error="$MARIADB_LOG" --skip-name-resolve --innodb-buffer-pool-size=64M \
                --innodb-log-file-size=48M --innodb-flush-log-at-trx-commit="$flush" \
                --max-connections=200 </dev/null >/dev/null 2>&1 &
            server=$!
            echo "$port" >"$BASE/mariadb.port"
            for ((i = 0; i < 300; i++)); do
                if mariadb_running; then break; fi
                # Gone (runuser waits for it): no point waiting the full 30 s.
                kill -0 "$server" 2>/dev/null || break
                sleep 0.1
            done
            mariadb_running && break
            grep -q "Bind on TCP/IP port" "$MARIADB_LOG" 2>/dev/null || break
            say "MariaDB could not bind port $port, trying the next one"
            port=$((port + 1))
        done
        mariadb_running || die "MariaDB did not start on 127.0.0.1:$port; the end of $MARIADB_LOG:
$(log_tail "$MARIADB_LOG")"
        say "MariaDB started on 127.0.0.1:$port"
    fi
    mariadb_client -e "CREATE DATABASE IF NOT EXISTS decree_m;
        CREATE DATABASE IF NOT EXISTS decree_m2;
        CREATE USER IF NOT EXISTS '$DB_USER_NAME'@'127.0.0.1';
        GRANT ALL PRIVILEGES ON *.* TO '$DB_USER_NAME'@'127.0.0.1' WITH GRANT OPTION;"
}

stop_all() {
    local bin
    if [ -d "$PG_DATA" ] && bin=$(pg_bindir) && pg_running; then
        as_user "$bin/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ -f "$MARIADB_PID" ]; then
        local pid i
        pid=$(cat "$MARIADB_PID")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for ((i = 0; i < 300; i++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -rf "$BASE"
    say "stopped; removed $BASE"
}

print_env() {
    [ -f "$BASE/pg.port" ] || [ -f "$BASE/mariadb.port" ] \
        || die "the test databases are not started: run scripts/test-dbs.sh start"
    local pg_port mariadb_port
    if [ -f "$BASE/pg.port" ]; then
        pg_port=$(cat "$BASE/pg.port")
        echo "export DECREE_TEST_PG_A='host=127.0.0.1 port=$pg_port user=$DB_USER_NAME dbname=decree_a'"
        echo "export DECREE_TEST_PG_B='host=127.0.0.1 port=$pg_port user=$DB_USER_NAME dbname=decree_b'"
    fi
    if [ -f "$BASE/mariadb.port" ]; then
        mariadb_port=$(cat "$BASE/mariadb.port")
        echo "export DECREE_TEST_MARIADB='mysql://$DB_USER_NAME@127.0.0.1:$mariadb_port/decree_m'"
        echo "export DECREE_TEST_MARIADB_B='mysql://$DB_USER_NAME@127.0.0.1:$mariadb_port/decree_m2'"
    fi
}

status() {
    if pg_running; then echo "postgres: running on 127.0.0.1:$(cat "$BASE/pg.port")"; else echo "postgres: stopped"; fi
    if mariadb_running; then
        echo "mariadb: running on 127.0.0.1:$(cat "$BASE/mariadb.port")"
    else
        echo "mariadb: stopped"
    fi
}

case "${1:-}" in
    start)
        install_missing
        prepare_base
        case "$ONLY" in
            "") start_pg; start_mariadb ;;
            postgres) start_pg ;;
            mariadb) start_mariadb ;;
            *) die "DECREE_TEST_DBS_ONLY must be postgres or mariadb, not '$ONLY'" ;;
        esac
        ;;
    stop) stop_all ;;
    env) print_env ;;
    status) status ;;
    *) die "usage: $0 start|stop|env|status" ;;
esac
