"""A bank across two databases, the workload of the tests: every transfer debits an account
in database A (PostgreSQL), credits one in database B (PostgreSQL or MariaDB) and records
its id in both, in one decree transaction. The invariant is checked in the databases
themselves: the total balance never changes, every acknowledged transfer is in both
databases, none is in one only, and no branch of the test's node stays prepared."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pymysql

import decree

from conftest import mysql_kwargs


@dataclass
class Snapshot:
    total: int
    in_a: set[int]
    in_b: set[int]
    prepared: list[str]

    def violations(self, expected_total: int, acknowledged: set[int]) -> list[str]:
        problems = []
        if self.total != expected_total:
            problems.append(f"total {self.total} != {expected_total}")
        one_only = self.in_a ^ self.in_b
        if one_only:
            problems.append(f"transfers in one database only: {sorted(one_only)[:20]}")
        lost = acknowledged - (self.in_a & self.in_b)
        if lost:
            problems.append(f"acknowledged transfers missing: {sorted(lost)[:20]}")
        if self.prepared:
            problems.append(f"branches left prepared: {self.prepared[:10]}")
        return problems


@dataclass
class Bank:
    dsns: dict[str, str]
    rm_b: str  # "pg-b" or "maria"
    prefix: str = field(default_factory=lambda: f"py{os.getpid()}_{time.monotonic_ns() % 10**9}")
    accounts: int = 10
    balance: int = 1000

    @property
    def total(self) -> int:
        return 2 * self.accounts * self.balance

    @property
    def maria(self) -> bool:
        return self.rm_b == "maria"

    def connect_a(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsns["pg-a"])

    def connect_b(self) -> Any:
        if self.maria:
            return pymysql.connect(**mysql_kwargs(self.dsns["maria"]), autocommit=True)
        return psycopg.connect(self.dsns["pg-b"])

    def closed(self, b: Any) -> bool:
        """Whether connection ``b`` was closed (the client closes a MariaDB connection whose
        prepared branch it leaves to the server)."""
        return not b.open if self.maria else bool(b.closed)

    def _sql_b(self, statements: list[str]) -> None:
        b = self.connect_b()
        try:
            if self.maria:
                with b.cursor() as cur:
                    for s in statements:
                        cur.execute(s)
            else:
                for s in statements:
                    b.execute(s)
                b.commit()
        finally:
            b.close()

    def create(self) -> Bank:
        p = self.prefix
        rows = ", ".join(f"({i}, {self.balance})" for i in range(self.accounts))
        with psycopg.connect(self.dsns["pg-a"], autocommit=True) as a:
            a.execute(f"CREATE TABLE {p}_accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
            a.execute(f"CREATE TABLE {p}_transfers (id bigint PRIMARY KEY, amount bigint NOT NULL)")
            a.execute(f"INSERT INTO {p}_accounts VALUES {rows}")
        engine = " ENGINE=InnoDB" if self.maria else ""
        self._sql_b([
            f"CREATE TABLE {p}_accounts (id int PRIMARY KEY, balance bigint NOT NULL){engine}",
            f"CREATE TABLE {p}_transfers (id bigint PRIMARY KEY, amount bigint NOT NULL){engine}",
            f"INSERT INTO {p}_accounts VALUES {rows}",
        ])
        return self

    def drop(self) -> None:
        p = self.prefix
        with psycopg.connect(self.dsns["pg-a"], autocommit=True) as a:
            a.execute(f"DROP TABLE IF EXISTS {p}_accounts, {p}_transfers")
        self._sql_b([f"DROP TABLE IF EXISTS {p}_accounts, {p}_transfers"])

    def work(self, a: Any, b: Any, tid: int, amount: int, src: int, dst: int) -> None:
        """The SQL of one transfer on two enlisted connections."""
        p = self.prefix
        a.execute(f"UPDATE {p}_accounts SET balance = balance - %s WHERE id = %s", (amount, src))
        a.execute(f"INSERT INTO {p}_transfers VALUES (%s, %s)", (tid, amount))
        if self.maria:
            with b.cursor() as cur:
                cur.execute(f"UPDATE {p}_accounts SET balance = balance + %s WHERE id = %s", (amount, dst))
                cur.execute(f"INSERT INTO {p}_transfers VALUES (%s, %s)", (tid, amount))
        else:
            b.execute(f"UPDATE {p}_accounts SET balance = balance + %s WHERE id = %s", (amount, dst))
            b.execute(f"INSERT INTO {p}_transfers VALUES (%s, %s)", (tid, amount))

    def transfer(self, tm: decree.TransactionManager, a: Any, b: Any, tid: int, amount: int = 7) -> decree.CommitReport:
        with tm.transaction() as tx:
            tx.enlist(a, "pg-a")
            tx.enlist(b, self.rm_b)
            self.work(a, b, tid, amount, tid % self.accounts, (tid * 7 + 3) % self.accounts)
        assert tx.report is not None
        return tx.report

    def snapshot(self, node: int) -> Snapshot:
        """The databases' state; the prepared branches are listed before the data is read,
        so that a branch committed in between cannot look like a transfer in one database."""
        p = self.prefix
        prepared = prepared_branches(self.dsns, node)
        with psycopg.connect(self.dsns["pg-a"], autocommit=True) as a:
            total = int(a.execute(f"SELECT sum(balance) FROM {p}_accounts").fetchone()[0])  # type: ignore[index]
            in_a = {int(r[0]) for r in a.execute(f"SELECT id FROM {p}_transfers")}
        b = self.connect_b()
        try:
            if self.maria:
                with b.cursor() as cur:
                    cur.execute(f"SELECT sum(balance) FROM {p}_accounts")
                    total += int(cur.fetchone()[0])
                    cur.execute(f"SELECT id FROM {p}_transfers")
                    in_b = {int(r[0]) for r in cur.fetchall()}
            else:
                b.autocommit = True
                total += int(b.execute(f"SELECT sum(balance) FROM {p}_accounts").fetchone()[0])
                in_b = {int(r[0]) for r in b.execute(f"SELECT id FROM {p}_transfers")}
        finally:
            b.close()
        return Snapshot(total, in_a, in_b, prepared)

    def settled(self, node: int, acknowledged: set[int], timeout: float = 60.0) -> Snapshot:
        """The snapshot once the server has finished every branch of ``node`` (or the last
        one at the timeout, whose violations then say what is left)."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot(node)
            if not snap.prepared or time.monotonic() > deadline:
                return snap
            time.sleep(0.2)


def prepared_branches(dsns: dict[str, str], node: int) -> list[str]:
    """The prepared branches of decree node ``node`` in the three test databases."""
    gid_start = f"decree:64637265:{node:08x}"
    found: list[str] = []
    for rm in ("pg-a", "pg-b"):
        with psycopg.connect(dsns[rm], autocommit=True) as c:
            rows = c.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE %s",
                (gid_start + "%",),
            ).fetchall()
            found += [f"{rm}: {r[0]}" for r in rows]
    m = pymysql.connect(**mysql_kwargs(dsns["maria"]), autocommit=True)
    try:
        with m.cursor() as cur:
            cur.execute("XA RECOVER")
            for row in cur.fetchall():
                x = decree.Xid.from_xa_recover(int(row[0]), int(row[1]), int(row[2]), bytes(row[3]))
                if x.origin is not None and x.origin.node == node:
                    found.append(f"maria: {x.mysql_xid()}")
    finally:
        m.close()
    return found
