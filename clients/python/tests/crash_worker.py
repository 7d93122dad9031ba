"""The client process the crash tests kill: runs bank transfers through decree and records
each acknowledged transfer id (fsynced) before starting the next one.

    python crash_worker.py ENDPOINT RM_B PREFIX FIRST_ID COUNT ACK_FILE [POINT N]

With POINT and N it kills itself with SIGKILL in the N-th transfer at that protocol point:
``prepare`` (the first branch prepared, the second not), ``decide_sent`` (the Decide frame
written, its answer not read), ``decide_ok`` (DecideOk read, no branch committed) or
``phase_two`` (the first branch committed, the second not). This is fault injection around
the real package, server and databases: the wrapped methods run unchanged until the kill.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decree  # noqa: E402
from bank import Bank  # noqa: E402
from decree import branches, connection  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, nth: int) -> None:
    """Wraps the method of ``point`` so that the ``nth`` transfer dies there."""
    count = {"transfers": 0, "calls": 0}

    def in_target() -> bool:
        return count["transfers"] == nth

    original_begin = decree.TransactionManager.transaction

    def transaction(self: decree.TransactionManager) -> decree.Transaction:
        count["transfers"] += 1
        count["calls"] = 0
        return original_begin(self)

    decree.TransactionManager.transaction = transaction  # type: ignore[method-assign]

    if point in ("prepare", "phase_two"):
        name = "prepare" if point == "prepare" else "commit_prepared"
        for cls in (branches.PsycopgBranch, branches.PyMySQLBranch):
            original = getattr(cls, name)

            def wrapped(self: Any, *args: Any, _original: Any = original) -> Any:
                if in_target() and count["calls"] == 1:
                    die()
                count["calls"] += 1
                return _original(self, *args)

            setattr(cls, name, wrapped)
    elif point == "decide_sent":
        original_send = connection.ServerConnection._send

        def send(self: connection.ServerConnection, frame: bytes) -> None:
            original_send(self, frame)
            if in_target() and len(frame) > 5 and frame[5] == decree.protocol.MessageType.DECIDE:
                die()

        connection.ServerConnection._send = send  # type: ignore[method-assign]
    elif point == "decide_ok":
        original_decide = connection.ServerConnection.decide

        def decide(self: connection.ServerConnection, *args: Any) -> None:
            original_decide(self, *args)
            if in_target():
                die()

        connection.ServerConnection.decide = decide  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown crash point {point}")


def main() -> None:
    endpoint, rm_b, prefix, first, count, ack_file = sys.argv[1:7]
    if len(sys.argv) > 7:
        arm(sys.argv[7], int(sys.argv[8]))
    dsns = {
        "pg-a": os.environ["DECREE_TEST_PG_A"],
        "pg-b": os.environ["DECREE_TEST_PG_B"],
        "maria": os.environ["DECREE_TEST_MARIADB"],
    }
    bank = Bank(dsns, rm_b, prefix=prefix)
    tm = decree.connect(endpoint, client_name="crash-worker")
    a, b = bank.connect_a(), bank.connect_b()
    acks = os.open(ack_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for tid in range(int(first), int(first) + int(count)):
        try:
            bank.transfer(tm, a, b, tid)
        except decree.RolledBack:
            continue
        os.write(acks, f"{tid}\n".encode())
        os.fsync(acks)
    tm.close()


if __name__ == "__main__":
    main()
