"""What a user meets when something is used wrongly or read back: a closed connection is
called closed, an endpoint that is not a decree server is called so (not "a frame of
1213486164 bytes"), outcomes print as words, the decorator keeps its parameter types, an
Xid kept as text reads back, and the README names the install extras that exist."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import typing
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pymysql
import pytest

import decree
from conftest import REPO, mysql_kwargs, pg_kwargs


# --- closed connections -----------------------------------------------------------------


def test_enlisting_a_closed_psycopg_connection_says_it_is_closed(
    tm: decree.TransactionManager, dsns: dict[str, str]
) -> None:
    conn = psycopg.connect(dsns["pg-a"])
    conn.close()
    with tm.transaction() as tx:
        with pytest.raises(decree.UsageError, match="closed") as refused:
            tx.enlist(conn, "pg-a")
    assert "transaction open" not in str(refused.value)


def test_enlisting_a_closed_pymysql_connection_says_it_is_closed(
    tm: decree.TransactionManager, dsns: dict[str, str]
) -> None:
    conn = pymysql.connect(**mysql_kwargs(dsns["maria"]), autocommit=True)
    conn.close()
    with tm.transaction() as tx:
        with pytest.raises(decree.UsageError, match="closed"):
            tx.enlist(conn, "maria")


# --- an endpoint that is not a decree server --------------------------------------------


class FakeHttpServer:
    """Answers whatever arrives with an HTTP 400, as a web server on the wrong port would."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.listener.close()


def test_an_http_server_is_reported_as_not_a_decree_server() -> None:
    http = FakeHttpServer()
    try:
        with pytest.raises(decree.ProtocolError) as refused:
            decree.connect(f"tcp:127.0.0.1:{http.port}", connect_timeout=5, reply_timeout=5)
    finally:
        http.close()
    message = str(refused.value)
    assert f"tcp:127.0.0.1:{http.port} did not answer as a decree server" in message, message
    assert "HTTP/1.1 400" in message and "HTTP server" in message, message
    assert "1213486164" not in message, message


@pytest.mark.parametrize("which", ["postgres", "mariadb"])
def test_a_database_port_is_reported_as_not_a_decree_server(which: str, dsns: dict[str, str]) -> None:
    if which == "postgres":
        kw = pg_kwargs(dsns["pg-a"])
        host, port, hint = kw.get("host", "127.0.0.1"), int(kw.get("port", 5432)), "PostgreSQL"
    else:
        u = urlparse(dsns["maria"])
        host, port, hint = u.hostname or "127.0.0.1", u.port or 3306, "MySQL or MariaDB"
    with pytest.raises(decree.ProtocolError, match="did not answer as a decree server") as refused:
        decree.connect(f"tcp:{host}:{port}", connect_timeout=5, reply_timeout=5)
    assert hint in str(refused.value) and "bytes exceeds" not in str(refused.value), str(refused.value)


# --- outcomes as words ------------------------------------------------------------------


def test_outcomes_and_heuristics_print_as_words_and_keep_their_values() -> None:
    assert str(decree.Outcome.UNKNOWN) == "unknown"
    assert f"{decree.Outcome.ROLLED_BACK}" == "rolled back"
    assert "%s" % decree.Outcome.IN_PROGRESS == "in progress"
    assert f"{decree.Outcome.COMMITTED:>10}" == " committed"
    assert str(decree.Heuristic.MIXED) == "mixed"
    assert decree.Outcome.UNKNOWN == 4 and int(decree.Outcome.HEURISTIC) == 5
    assert decree.Outcome(3) is decree.Outcome.ROLLED_BACK


# --- the decorator's types --------------------------------------------------------------


def test_the_decorator_is_typed_with_a_param_spec() -> None:
    hints = typing.get_type_hints(decree.TransactionManager.transactional)
    params, result = typing.get_args(hints["return"])
    assert isinstance(params, typing.ParamSpec), hints["return"]
    first = typing.get_args(hints["fn"])[0]
    assert typing.get_origin(first) is typing.Concatenate, hints["fn"]
    assert typing.get_args(first)[0] is decree.Transaction


def test_a_type_checker_sees_the_decorated_parameters(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    program = tmp_path / "app.py"
    program.write_text(
        "import decree\n"
        "tm = decree.connect('unix:/x')\n"
        "@tm.transactional\n"
        "def move(tx: decree.Transaction, tid: int, note: str) -> int:\n"
        "    return tid\n"
        "ok: int = move(1, 'a')\n"
        "bad = move('1', 'a')\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(program)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "app.py:7:" in errors[0] and '"move"' in errors[0], run.stdout


# --- an Xid kept as text ----------------------------------------------------------------


@pytest.mark.parametrize(
    "xid",
    [
        decree.Xid.decree(7, 1, 2, 3),
        decree.Xid.decree(2**32 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1).branch(65535),
        decree.Xid(-5, b"\x00" * 64, b"\xff" * 64),
        decree.Xid(0, b"g", b""),
    ],
)
def test_an_xid_reads_back_from_its_text(xid: decree.Xid) -> None:
    text = str(xid)
    assert decree.Xid.parse(text) == xid
    assert str(decree.Xid.parse(text)) == text


@pytest.mark.parametrize(
    "text, what",
    [
        ("", "decree:"),
        ("64637265:00:", "decree:"),
        ("decree:64637265:00", "three parts"),
        ("decree:64637265:00:01:02", "three parts"),
        ("decree:6463726:00:", "format id"),
        ("decree:6463726g:00:", "format id"),
        ("decree:64637265:0:", "gtrid"),
        ("decree:64637265:zz:", "gtrid"),
        ("decree:64637265:00:0", "bqual"),
        ("decree:64637265:" + "00" * 65 + ":", "gtrid"),
        ("decree:64637265:00:" + "00" * 65, "bqual"),
        (" decree:64637265:00:", "decree:"),
    ],
)
def test_a_malformed_xid_text_is_refused_naming_what_is_wrong(text: str, what: str) -> None:
    with pytest.raises(ValueError, match=re.escape(what)):
        decree.Xid.parse(text)


def test_an_xid_kept_as_text_can_be_asked_about(tm: decree.TransactionManager) -> None:
    tx = tm.transaction()
    saved = str(tx.xid)
    tx.rollback()
    assert tm.outcome(decree.Xid.parse(saved)) == decree.Outcome.IN_PROGRESS  # its session is still open.


# --- the README's install line ----------------------------------------------------------


def declared_extras() -> set[str]:
    """The keys of pyproject.toml's [project.optional-dependencies] (no tomllib on 3.10)."""
    text = (REPO / "clients" / "python" / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.M))


def test_the_readme_installs_with_extras_that_exist() -> None:
    readme = (REPO / "clients" / "python" / "README.md").read_text()
    named = set()
    for group in re.findall(r"pip install [^\n]*?clients/python\[([A-Za-z0-9_,-]+)\]", readme):
        named |= set(group.split(","))
    assert {"postgres", "mysql"} <= named, f"the README's pip install line names extras {named or 'none'}"
    assert named <= declared_extras(), f"{named - declared_extras()} are not in pyproject.toml"
