"""The error kinds no other test reaches: ``tls`` (a real HTTPS receiver on 127.0.0.1 whose
self-signed certificate is not trusted) and ``dns`` (an injected resolver that fails). Only
loopback traffic; no DNS query is ever sent."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from notifyq import App
from notifyq._errors import Permanent, ResolutionFailed, Snooze
from tests import vault
from tests.conftest import fast_settings
from tests.receiver import Receiver
from tests.webhooks.conftest import deliverer, webhook_settings

pytestmark = pytest.mark.anyio


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate (it is its own CA) for ``localhost`` and 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "notifyq test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[tuple[Receiver, Path]]:
    """A real HTTPS receiver on 127.0.0.1 with a freshly generated self-signed certificate,
    and that certificate's path (the CA a client would have to trust)."""
    cert_path, key_path = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    server = Receiver(tls=context).start()
    try:
        yield server, cert_path
    finally:
        server.stop()


def _post_trusting(cafile: Path, port: int) -> bytes:
    """A plain POST to 127.0.0.1 as ``localhost`` by a client that trusts ``cafile``."""
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(b"POST /control HTTP/1.1\r\nhost: localhost\r\ncontent-length: 2\r\n"
                    b"\r\n{}")
        answer = b""
        while not answer.endswith(b"\r\n\r\nok"):  # the receiver keeps the connection open
            chunk = tls.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


async def _no_dns(name: str, port: int) -> list[str]:
    raise AssertionError(f"no DNS lookup is needed for {name}")


async def test_an_untrusted_certificate_is_a_tls_error_and_no_request_reaches_the_server(
        dsn: str, tls_receiver: tuple[Receiver, Path]) -> None:
    receiver, cafile = tls_receiver
    app = App(settings=webhook_settings(dsn))
    deliverer(app).resolver = _no_dns  # localhost is never resolved through DNS
    async with app:
        ep = await app.webhooks.create_endpoint(f"https://localhost:{receiver.port}/hook")
        msg = (await app.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
        with pytest.raises(Snooze):
            await deliverer(app).deliver(msg, ep.id)
        [attempt] = await app.webhooks.attempts(msg)
        assert attempt["error_kind"] == "tls"
        assert attempt["status_code"] is None
        assert "CERTIFICATE_VERIFY_FAILED" in (attempt["error"] or "")
        assert receiver.connections == 0  # the handshake never completed
        assert receiver.requests == []

    # The same server, the same name: a client that trusts the generated CA is answered, so
    # the failure above is the untrusted certificate and nothing else.
    answer = await anyio.to_thread.run_sync(_post_trusting, cafile, receiver.port)
    assert answer.startswith(b"HTTP/1.1 200")
    assert [r.path for r in receiver.requests] == ["/control"]


@pytest.mark.parametrize("failure", ["raises", "empty"])
async def test_a_name_that_does_not_resolve_is_a_dns_error_and_nothing_is_contacted(
        dsn: str, receiver: Receiver, failure: str) -> None:
    app = App(settings=webhook_settings(dsn))
    asked: list[tuple[str, int]] = []

    async def resolver(name: str, port: int) -> list[str]:
        asked.append((name, port))
        if failure == "raises":
            raise ResolutionFailed(f"cannot resolve {name}: Name or service not known")
        return []

    deliverer(app).resolver = resolver
    async with app:
        ep = await app.webhooks.create_endpoint(
            f"http://nowhere.invalid:{receiver.port}/hook")
        msg = (await app.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
        with pytest.raises(Snooze):
            await deliverer(app).deliver(msg, ep.id)
        [attempt] = await app.webhooks.attempts(msg)
        assert attempt["error_kind"] == "dns"
        assert attempt["status_code"] is None
        assert "nowhere.invalid" in (attempt["error"] or "")
        assert asked == [("nowhere.invalid", receiver.port)]
        assert attempt["next_attempt_at"] is not None  # retried on the schedule
        assert receiver.connections == 0


async def test_a_secret_this_process_cannot_decrypt_is_an_invalid_attempt_that_ends_it(
        dsn: str, receiver: Receiver) -> None:
    """Written under key version 2 by a process that holds it; delivered by one that holds only
    version 1: an attempt says why, the delivery fails at once, nothing is sent."""
    newer = App(settings=fast_settings(
        dsn, keys=vault.keys_env(1, 2, active=2)["NOTIFYQ_KEYS"], active_key_version=2,
        webhooks={"allowed_networks": ["127.0.0.0/8"]}))
    async with newer:
        ep = await newer.webhooks.create_endpoint(receiver.url("/hook"))
        msg = (await newer.webhooks.send("order.paid", {}, endpoint_id=ep.id)).id
    older = App(settings=webhook_settings(dsn))  # KEY1 only
    async with older:
        with pytest.raises(Permanent, match="cannot decrypt the endpoint's secrets here"):
            await deliverer(older).deliver(msg, ep.id)
        [attempt] = await older.webhooks.attempts(msg)
        message = await older.webhooks.message(msg)
    assert (attempt["error_kind"], attempt["status_code"]) == ("invalid", None)
    assert "key version 2" in (attempt["error"] or "")
    assert vault.b64(vault.KEY2) not in (attempt["error"] or "")
    assert [d["status"] for d in message["deliveries"]] == ["failed"]
    assert receiver.requests == []
