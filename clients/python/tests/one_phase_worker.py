"""The client process test_one_phase kills: one transaction with one branch, committed in
one phase, then SIGKILL before anything else is sent (its ``Complete`` is still buffered).

    python one_phase_worker.py ENDPOINT TABLE ID OUT_FILE

It inserts ID into TABLE of ``DECREE_TEST_PG_A``, and once the commit returned writes the
transaction's gtrid (hex) and the session's protocol version to OUT_FILE (fsynced), which
sends nothing to the server, then kills itself.
"""

from __future__ import annotations

import os
import signal
import sys

import psycopg

import decree


def main() -> None:
    endpoint, table, tid, out = sys.argv[1:5]
    tm = decree.connect(endpoint, client_name="one-phase-worker")
    a = psycopg.connect(os.environ["DECREE_TEST_PG_A"])
    with tm.transaction() as tx:
        version = tx._session.version if tx._session is not None else 0
        tx.enlist(a, "pg-a")
        a.execute(f"INSERT INTO {table} VALUES (%s, 0)", (int(tid),))
    assert tx.report is not None and tx.report.kind == "one_phase"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, f"{tx.xid.gtrid.hex()} {version}\n".encode())
    os.fsync(fd)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
