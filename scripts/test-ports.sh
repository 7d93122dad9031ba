# Sourced by scripts/test-dbs.sh and scripts/test-etcd.sh: the free-port search and the log
# excerpt their throwaway servers share. The sourcing script defines `die` and
# PORT_TRIES_MAX (a port search gives up after this many candidates).

# True when a server could not bind 127.0.0.1:$1: something accepts connections there, or
# (seen with ss) any TCP socket holds it as its local port, such as one end of an open
# connection whose ephemeral port it is (the defaults lie in Linux's ephemeral range).
port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    command -v ss >/dev/null 2>&1 && [ -n "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]
}

# The first port from $1 on that no socket holds.
free_port_from() {
    local p=$1 i
    for ((i = 0; i < PORT_TRIES_MAX; i++)); do
        if ! port_busy "$p"; then echo "$p"; return; fi
        p=$((p + 1))
    done
    die "no free TCP port in $1..$p on 127.0.0.1"
}

# The last lines of a server's log, for an error that says why it did not start.
log_tail() { [ -f "$1" ] && tail -n 15 "$1" | sed 's/^/    /' || true; }
