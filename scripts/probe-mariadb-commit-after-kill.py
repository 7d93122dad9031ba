"""Probe (not a test): can an XA COMMIT by name lose a MariaDB branch whose preparing
process was just killed?

Each round, a child process prepares an XA branch that inserts one row and is killed with
SIGKILL at once; this process then commits the branch by name from its own connection,
retrying while MariaDB answers XAER_NOTA (the branch still attached to the dying
connection), as a state server finishing a dead client's phase two or a recovery right
after a crash would. At the end it counts the rows committed against the OKs received and
lists the InnoDB transactions left behind. A loss is an OK that committed nothing: the
branch's InnoDB transaction stays prepared, holding its locks, invisible to XA RECOVER
(ARCHITECTURE.md, "MariaDB 10.11"; docs/measurements.md, "MariaDB commit by name after the
preparer is killed").

With `--wait` it tries the remedy proposed there: the child puts its CONNECTION_ID() in
the branch qualifier, and the committer reads it back from XA RECOVER and first waits until
INNODB_TRX, read after a pause longer than its 100 ms cache, ties no transaction to that
thread (as decree-rm's `XaConnection::wait_detached` does).

Usage (the test servers of scripts/test-dbs.sh, PyMySQL from scripts/test-python.sh's venv):
    eval "$(scripts/test-dbs.sh env)"
    target/pyvenv/bin/python scripts/probe-mariadb-commit-after-kill.py 1000 [--wait]
"""

import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlparse

import pymysql

XAER_NOTA = 1397
# INNODB_TRX is a snapshot the server refreshes only when it was not read for 100 ms.
TRX_SNAPSHOT_PAUSE = 0.11
FORMAT_ID = 4242  # not decree's, so that decree's recovery never touches the probe's branches

CHILD = r"""
import json, sys, pymysql
args = json.loads(sys.argv[1])
connection = pymysql.connect(**args)
cursor = connection.cursor()
cursor.execute("SELECT CONNECTION_ID()")
thread = cursor.fetchone()[0]
xid = sys.argv[2].replace("THREAD", "%08x" % thread)
cursor.execute(f"XA START {xid}")
cursor.execute("INSERT INTO xa_kill_probe(id) VALUES (%s)", (int(sys.argv[3]),))
cursor.execute(f"XA END {xid}")
cursor.execute(f"XA PREPARE {xid}")
print("prepared", flush=True)
sys.stdin.read()  # until killed
"""


def connection_args():
    url = urlparse(os.environ.get("DECREE_TEST_MARIADB", ""))
    if url.scheme != "mysql" or not url.hostname:
        sys.exit("set DECREE_TEST_MARIADB=mysql://user@host:port/database (scripts/test-dbs.sh env)")
    return dict(
        host=url.hostname,
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=url.path.lstrip("/"),
        autocommit=True,
    )


def preparer_of(cursor, gtrid):
    """The thread id in the qualifier of the listed branch `gtrid`, or None if not listed."""
    cursor.execute("XA RECOVER")
    for format_id, gtrid_length, bqual_length, data in cursor.fetchall():
        if format_id == FORMAT_ID and data[:gtrid_length] == gtrid and bqual_length == 4:
            return int(data[gtrid_length:].hex(), 16)
    return None


def wait_detached(cursor, thread):
    """Until INNODB_TRX, read at least TRX_SNAPSHOT_PAUSE after XA RECOVER listed the branch,
    ties no transaction to `thread` (decree-rm's `XaConnection::wait_detached` does the same)."""
    while True:
        time.sleep(TRX_SNAPSHOT_PAUSE)
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = %s", (thread,)
        )
        if cursor.fetchone()[0] == 0:
            return


def main():
    wait = "--wait" in sys.argv
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(numbers[0]) if numbers else 200
    args = connection_args()
    cursor = pymysql.connect(**args).cursor()
    cursor.execute("CREATE TABLE IF NOT EXISTS xa_kill_probe(id INT PRIMARY KEY) ENGINE=InnoDB")
    cursor.execute("DELETE FROM xa_kill_probe")
    oks = retries = 0
    for i in range(rounds):
        gtrid = b"xa-kill-probe-%d" % i
        qualifier = "THREAD" if wait else ""
        xid = f"X'{gtrid.hex()}',X'{qualifier}',{FORMAT_ID}"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(args), xid, str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        if child.stdout.readline().strip() != b"prepared":
            sys.exit(f"round {i}: the child did not prepare its branch")
        os.kill(child.pid, signal.SIGKILL)
        if wait:
            thread = preparer_of(cursor, gtrid)
            if thread is None:
                sys.exit(f"round {i}: the branch is not listed by XA RECOVER")
            wait_detached(cursor, thread)
            xid = f"X'{gtrid.hex()}',X'{thread:08x}',{FORMAT_ID}"
        while True:
            try:
                cursor.execute(f"XA COMMIT {xid}")
                oks += 1
                break
            except pymysql.err.OperationalError as e:
                if e.args[0] != XAER_NOTA:
                    raise
                retries += 1
        child.wait()
    time.sleep(0.5)
    cursor.execute("SELECT id FROM xa_kill_probe")
    committed = {row[0] for row in cursor.fetchall()}
    cursor.execute("XA RECOVER")
    listed = [row for row in cursor.fetchall() if row[0] == FORMAT_ID]
    cursor.execute(
        "SELECT trx_id, trx_state, trx_mysql_thread_id, trx_rows_locked FROM information_schema.INNODB_TRX"
    )
    transactions = cursor.fetchall()
    lost = sorted(set(range(rounds)) - committed)
    print(
        f"{rounds} branches prepared by a process killed at once"
        f"{', committed after waiting for the preparing thread' if wait else ''}: XA COMMIT by name answered OK "
        f"{oks} times (after {retries} XAER_NOTA retries); rows committed {len(committed)}; "
        f"lost {lost}; probe branches still listed by XA RECOVER {len(listed)}; "
        f"InnoDB transactions left {transactions}"
    )
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
