"""What the tests share: a real ``decree serve`` started from the repository's build, and
the throwaway databases of scripts/test-dbs.sh.

Without the databases (``DECREE_TEST_PG_A``, ``DECREE_TEST_PG_B``, ``DECREE_TEST_MARIADB``)
or the binary (``target/release/decree``, or ``DECREE_BIN``) a test that needs them is
skipped with the reason; with ``CI=true`` it fails instead, so that CI cannot pass by
skipping. Every server gets a random node id: other test runs share the databases, and a
server's recovery only touches branches of its own node.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import decree

if TYPE_CHECKING:
    from bank import Bank

REPO = Path(__file__).resolve().parents[3]
CI = os.environ.get("CI", "") in ("true", "1")


def need(what: str, hint: str) -> None:
    """Skips the test (fails it under CI=true) because ``what`` is missing."""
    message = f"{what} is missing: {hint}"
    if CI:
        pytest.fail(f"CI=true but {message}")
    pytest.skip(message)


def env_dsn(var: str) -> str:
    value = os.environ.get(var, "")
    if not value:
        need(var, 'run scripts/test-dbs.sh start && eval "$(scripts/test-dbs.sh env)"')
    return value


def decree_bin() -> Path:
    path = Path(os.environ.get("DECREE_BIN", REPO / "target" / "release" / "decree"))
    if not path.is_file():
        need(str(path), "build it with cargo build --release -p decree-cli (or set DECREE_BIN)")
    return path


def pg_kwargs(dsn: str) -> dict[str, str]:
    """``host=... port=...`` as keyword arguments (psycopg takes the DSN itself too)."""
    return dict(part.split("=", 1) for part in dsn.split())


def mysql_kwargs(url: str) -> dict[str, Any]:
    """PyMySQL keyword arguments of a ``mysql://user[:password]@host:port/db`` URL."""
    from urllib.parse import urlparse

    u = urlparse(url)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": u.username or "root",
        "password": u.password or "",
        "database": u.path.lstrip("/"),
    }


_PORTS_LOW = 24000
_ports_next = [os.getpid() * 7919]
_ports_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free a moment ago, never handed out before in this process, below
    the kernel's ephemeral range when it leaves room (as decree_server::testing::ports does):
    a server restarted on its port must not find it taken by one end of an open connection."""
    high = _ephemeral_low()
    if high <= _PORTS_LOW + 1000:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    span = high - _PORTS_LOW
    for _ in range(2000):
        port = _PORTS_LOW + _ports_next[0] % span
        _ports_next[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {_PORTS_LOW}..{high}")


class Server:
    """One ``decree serve`` process on a Unix socket in a temporary directory; restartable
    on the same log, killable with SIGKILL."""

    def __init__(self, rms: list[tuple[str, str, str]], *, extra: str = "", tcp: bool = False) -> None:
        # Under the build directory rather than /tmp, where other processes tidy up.
        base = REPO / "target" if (REPO / "target").is_dir() else None
        self.dir = Path(tempfile.mkdtemp(prefix="decree-py-", dir=base))
        self.socket = self.dir / "decree.sock"
        self.node = random.randint(1_000_000, 2**31 - 1)
        self.metrics_port = free_port()
        self.tcp_port = free_port() if tcp else None
        lines = [
            f"node = {self.node}",
            f'log_dir = "{self.dir / "log"}"',
            f'unix = "{self.socket}"',
            f'metrics = "127.0.0.1:{self.metrics_port}"',
        ]
        if self.tcp_port:
            lines.append(f'tcp = "127.0.0.1:{self.tcp_port}"')
        lines.append(extra)
        if "[recovery]" not in extra:
            lines += ["[recovery]", "periodic_pass_ms = 2000", "recheck_after_close_ms = 200", "rechecks_after_close = 4"]
        for name, kind, dsn in rms:
            lines += ["[[rm]]", f'name = "{name}"', f'kind = "{kind}"', f'dsn = "{dsn}"']
        self.config = self.dir / "decree.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"unix:{self.socket}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        log = open(self.dir / f"serve-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            [str(decree_bin()), "serve", "--config", str(self.config), "-v"], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"decree serve exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                if self.tcp_port:
                    socket.create_connection(("127.0.0.1", self.tcp_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"decree serve did not listen within 20 s: {self.log_tail()}")

    def log_tail(self) -> str:
        text = b"".join(f.read_bytes() for f in sorted(self.dir.glob("serve-*.log")))
        return text.decode(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: the server dies at once, whatever it was doing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def cleanup(self) -> None:
        """Stops the server and deletes its directory (kept with DECREE_PY_KEEP=1)."""
        self.stop()
        if os.environ.get("DECREE_PY_KEEP") == "1":
            print(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def dsns() -> dict[str, str]:
    return {
        "pg-a": env_dsn("DECREE_TEST_PG_A"),
        "pg-b": env_dsn("DECREE_TEST_PG_B"),
        "maria": env_dsn("DECREE_TEST_MARIADB"),
    }


def rm_entries(dsns: dict[str, str]) -> list[tuple[str, str, str]]:
    return [("pg-a", "postgres", dsns["pg-a"]), ("pg-b", "postgres", dsns["pg-b"]), ("maria", "mariadb", dsns["maria"])]


def started(server: Server) -> Iterator[Server]:
    """Starts ``server`` for a fixture, and cleans it up after (``yield from started(...)``)."""
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def server(dsns: dict[str, str]) -> Iterator[Server]:
    yield from started(Server(rm_entries(dsns)))


@pytest.fixture(scope="module")
def tcp_server(dsns: dict[str, str]) -> Iterator[Server]:
    """A server that listens on TCP as well as on its Unix socket."""
    yield from started(Server(rm_entries(dsns), tcp=True))


IDLE_MS = 300
"""The idle bound of :func:`idle_server`'s sessions (``[limits] idle_timeout_ms``)."""


@pytest.fixture(scope="module")
def idle_server(dsns: dict[str, str]) -> Iterator[Server]:
    """A server that closes a session idle for :data:`IDLE_MS`."""
    yield from started(Server(rm_entries(dsns), extra=f"[limits]\nidle_timeout_ms = {IDLE_MS}\n"))


@pytest.fixture
def tm(server: Server, request: pytest.FixtureRequest) -> Iterator[decree.TransactionManager]:
    """A transaction manager on the module's server, named after the test module
    (``pytest-one-phase``), closed after the test."""
    name = request.module.__name__.removeprefix("test_").replace("_", "-")
    manager = decree.connect(server.endpoint, client_name=f"pytest-{name}")
    yield manager
    manager.close()


BANK_IDS = {"pg-b": "pg-pg", "maria": "pg-mariadb"}
"""The test id of a bank by its database B."""


def made_bank(dsns: dict[str, str], rm_b: str) -> Iterator[Bank]:
    """tests/bank.py's bank on pg-a and ``rm_b``, its tables dropped after the test."""
    from bank import Bank  # bank.py takes helpers from this module.

    made = Bank(dsns, rm_b).create()
    yield made
    made.drop()


def bank_fixture(*rms_b: str) -> Any:
    """A ``bank`` fixture for a module whose bank is not :func:`bank`'s: on one database B,
    or on each of several (one test each, with the ids of :data:`BANK_IDS`)."""
    if len(rms_b) == 1:

        @pytest.fixture(name="bank")
        def one(dsns: dict[str, str]) -> Iterator[Bank]:
            yield from made_bank(dsns, rms_b[0])

        return one

    @pytest.fixture(name="bank", params=list(rms_b), ids=[BANK_IDS[rm] for rm in rms_b])
    def each(request: pytest.FixtureRequest, dsns: dict[str, str]) -> Iterator[Bank]:
        yield from made_bank(dsns, request.param)

    return each


@pytest.fixture
def bank(request: pytest.FixtureRequest, dsns: dict[str, str]) -> Iterator[Bank]:
    """The bank between the two PostgreSQL databases; a test marked :data:`both_banks`
    runs once on it and once on the bank between PostgreSQL and MariaDB."""
    yield from made_bank(dsns, getattr(request, "param", "pg-b"))


both_banks = pytest.mark.parametrize("bank", list(BANK_IDS), indirect=True, ids=list(BANK_IDS.values()))
"""Runs a test that takes :func:`bank` on each database B (pg-b, then maria)."""
