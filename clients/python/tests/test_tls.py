"""``tls:`` endpoints through the standard ``ssl`` module against a real ``decree serve``
with mutual TLS: a throwaway CA made with the ``openssl`` command, a server certificate for
127.0.0.1 and client certificates; a transfer over TLS, and the refusals protocol.md
lists (no client certificate, a name the server does not allow)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import decree
from bank import Bank
from conftest import Server, need, rm_entries


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """ca.pem/key, server.pem/key (SAN IP 127.0.0.1), app-1 and app-2 client certificates."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=decree-test-ca", cwd=d)
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("app-1", "subjectAltName=DNS:app-1"),
        ("app-2", "subjectAltName=DNS:app-2"),
    ):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def tls_server(dsns: dict[str, str]) -> Iterator[Server]:
    if shutil.which("openssl") is None:
        need("the openssl command", "install openssl to make the test certificates")
    s = Server(rm_entries(dsns), tcp=True)
    pki = s.dir / "pki"
    pki.mkdir()
    make_pki(pki)
    s.config.write_text(
        s.config.read_text().replace(
            "[recovery]",
            f'[tls]\ncert = "{pki / "server.pem"}"\nkey = "{pki / "server.key"}"\n'
            f'client_ca = "{pki / "ca.pem"}"\nclients_allowed = ["app-1"]\n\n[recovery]',
            1,
        )
    )
    s.start()
    yield s
    s.cleanup()


def tls_config(s: Server, client: str) -> decree.TlsConfig:
    pki = s.dir / "pki"
    return decree.TlsConfig(cafile=str(pki / "ca.pem"), certfile=str(pki / f"{client}.pem"), keyfile=str(pki / f"{client}.key"))


def test_a_transfer_over_mutual_tls(tls_server: Server, dsns: dict[str, str]) -> None:
    bank = Bank(dsns, "maria").create()
    try:
        with decree.connect(f"tls:127.0.0.1:{tls_server.tcp_port}", tls=tls_config(tls_server, "app-1")) as tm:
            tm.ping()
            a, b = bank.connect_a(), bank.connect_b()
            report = bank.transfer(tm, a, b, tid=1)
            assert report.kind == "two_phase"
            assert tm.outcome(report.xid) == decree.Outcome.COMMITTED
            a.close(), b.close()
        assert bank.snapshot(tls_server.node).violations(bank.total, {1}) == []
    finally:
        bank.drop()


def test_a_certificate_whose_name_is_not_allowed_gets_error_17(tls_server: Server) -> None:
    with pytest.raises(decree.ServerError) as refused:
        decree.connect(f"tls:127.0.0.1:{tls_server.tcp_port}", tls=tls_config(tls_server, "app-2"))
    assert refused.value.code == decree.ErrorCode.NOT_ALLOWED
    assert "app-2" in refused.value.server_message


def test_no_client_certificate_is_refused_by_the_handshake(tls_server: Server) -> None:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(tls_server.dir / "pki" / "ca.pem"))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # TLS 1.3 sends the alert after the handshake: the client reads it with HelloOk.
    with pytest.raises(decree.Unavailable, match="CERTIFICATE_REQUIRED"):
        decree.connect(f"tls:127.0.0.1:{tls_server.tcp_port}", tls=decree.TlsConfig(context=context))


def test_a_plaintext_client_on_the_tls_listener_is_told_tls_is_required(tls_server: Server) -> None:
    with pytest.raises(decree.ServerError) as refused:
        decree.connect(f"tcp:127.0.0.1:{tls_server.tcp_port}")
    assert refused.value.code == decree.ErrorCode.TLS_REQUIRED


def test_a_server_certificate_of_another_ca_is_refused_by_the_client(tls_server: Server, tmp_path: Path) -> None:
    make_pki(tmp_path)
    other = decree.TlsConfig(
        cafile=str(tmp_path / "ca.pem"),
        certfile=str(tls_server.dir / "pki" / "app-1.pem"),
        keyfile=str(tls_server.dir / "pki" / "app-1.key"),
    )
    with pytest.raises(decree.Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
        decree.connect(f"tls:127.0.0.1:{tls_server.tcp_port}", tls=other)
