"""Bearer tokens and TLS: a server with a tenant and a certificate from a
private CA (made here with the openssl command)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from archivist_client import AsyncClient, Client, Unauthenticated, Unavailable

TOKEN = "py-client-test-token-5f1c"


@pytest.fixture
def tls_server(start_server, tmp_path: Path):
    cert, key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    config = f"""
[[auth.tenants]]
name = "python-tests"
token_sha256 = "{digest}"

[tls]
cert = "{cert}"
key = "{key}"
"""
    return start_server(config), cert


def test_token_over_tls_round_trip(tls_server, session_id: str) -> None:
    server, cert = tls_server
    with Client(server.address, token=TOKEN, ca_cert=cert) as client:
        client.append(session_id, [("user", "over TLS")])
        assert [i.text for i in client.context(session_id).items] == ["over TLS"]
    # https:// with the CA as PEM bytes works the same.
    with Client(f"https://{server.address}", token=TOKEN, ca_cert=cert.read_bytes()) as client:
        assert client.context(session_id).items[0].text == "over TLS"


def test_missing_or_wrong_token_is_unauthenticated(tls_server, session_id: str) -> None:
    server, cert = tls_server
    with Client(server.address, ca_cert=cert) as client:
        with pytest.raises(Unauthenticated) as caught:
            client.append(session_id, [("user", "no token")])
        assert caught.value.reason == "MISSING_TOKEN"
    with Client(server.address, token="not-the-token", ca_cert=cert) as client:
        with pytest.raises(Unauthenticated) as caught:
            client.backlog()
        assert caught.value.reason == "INVALID_TOKEN"


async def test_async_token_over_tls(tls_server, session_id: str) -> None:
    server, cert = tls_server
    async with AsyncClient(server.address, token=TOKEN, ca_cert=str(cert)) as client:
        await client.append(session_id, [("user", "async over TLS")])
        assert (await client.context(session_id)).items[0].text == "async over TLS"
    async with AsyncClient(server.address, ca_cert=cert) as client:
        with pytest.raises(Unauthenticated):
            await client.backlog()


def test_plaintext_to_a_tls_server_fails_and_tls_options_need_tls(tls_server) -> None:
    server, cert = tls_server
    with Client(server.address, token=TOKEN, timeout=5) as client:
        with pytest.raises(Unavailable):
            client.backlog()
    with pytest.raises(ValueError, match="http://"):
        Client(f"http://{server.address}", ca_cert=cert)
