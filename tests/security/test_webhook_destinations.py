"""The SSRF guard at connect time, on real sockets: IPv4 addresses inside IPv6 forms are
judged as themselves (allowlist included), every resolved address is checked and they are tried
in order, and ``webhooks.allowed_ports``.

An injected resolver returns the address under test; the only listeners are on 127.0.0.1 and
::1, and the transport's socket factory below refuses (and records) any other address, so
nothing leaves this machine even when a guard would let it through."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from notifyq._errors import BlockedAddress
from notifyq._settings import WebhookSettings
from notifyq._webhooks.client import WebhookClient
from notifyq._webhooks.ssrf import Guard, Resolver
from notifyq._webhooks.transport import GuardedTransport
from tests.webhooks.test_error_kinds import _self_signed
from tests.webhooks.test_transport import OK, Server, answering, serving

pytestmark = pytest.mark.anyio
LOOPBACK = ["127.0.0.0/8", "::1/128"]


class Connects:
    """Every address the transport made a socket for, in order; only loopback ones get one."""

    def __init__(self) -> None:
        self.addresses: list[str] = []

    def socket(self, addr_info: Any) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        host = sockaddr[0]
        self.addresses.append(host)
        address = ipaddress.ip_address(host)
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        if not (mapped or address).is_loopback:
            raise ConnectionRefusedError(f"{host} is not loopback: not connected (test)")
        return socket.socket(family, kind, proto)


def transport(guard: Guard, resolver: Resolver, connects: Connects,
              **options: Any) -> GuardedTransport:
    return GuardedTransport(guard, resolver, socket_factory=connects.socket, **options)


def answers(*addresses: str) -> Resolver:
    async def resolver(host: str, port: int) -> list[str]:
        assert host == "hooks.example"
        return list(addresses)
    return resolver


async def post(http: httpx.AsyncBaseTransport, port: int,
               scheme: str = "http") -> httpx.Response:
    request = httpx.Request("POST", f"{scheme}://hooks.example:{port}/in", content=b"{}")
    response = await http.handle_async_request(request)
    await response.aread()
    return response


@pytest.mark.parametrize(("allowed", "address"), [
    (["64:ff9b::/96"], "64:ff9b::7f00:1"),          # NAT64 prefix allowed, loopback inside
    (["64:ff9b::/96"], "64:ff9b::a9fe:a9fe"),       # ... the metadata service inside
    (["::ffff:0:0:0/96"], "::ffff:0:7f00:1"),       # IPv4-translated (SIIT) form
    ([], "::ffff:0:a9fe:a9fe"),                     # translated form, nothing allowed
    (["2002::/16"], "2002:a9fe:a9fe::1"),           # 6to4 prefix allowed, metadata inside
])
async def test_an_ipv4_address_inside_an_ipv6_form_is_judged_as_itself_allowlist_included(
        allowed: list[str], address: str) -> None:
    connects = Connects()
    async with serving(answering(OK)) as server:
        http = transport(Guard(allowed), answers(address), connects)
        with pytest.raises(BlockedAddress, match=r"hooks\.example: .*\(IPv4 "):
            await post(http, server.port)
        await http.aclose()
    assert (connects.addresses, server.connections) == ([], 0)


async def test_an_allowed_embedded_address_is_reached_through_its_ipv4_range() -> None:
    connects = Connects()
    async with serving(answering(OK)) as server:
        http = transport(Guard(["127.0.0.0/8"]), answers("::ffff:127.0.0.1"), connects)
        assert (await post(http, server.port)).status_code == 200
        await http.aclose()
    assert server.connections == 1


@pytest.fixture
def dead_ipv6_port() -> Iterator[socket.socket]:
    """A port bound on ::1 without listening (connecting is refused at once), for a listener
    to take on 127.0.0.1."""
    placeholder = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    placeholder.bind(("::1", 0))
    try:
        yield placeholder
    finally:
        placeholder.close()


async def test_resolved_addresses_are_tried_in_order_until_one_connects(
        dead_ipv6_port: socket.socket) -> None:
    port = dead_ipv6_port.getsockname()[1]
    server = Server()
    server.port = port

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        await answering(OK, then_close=True)(reader, writer, server, server.connections)
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", port)
    connects = Connects()
    try:
        http = transport(Guard(LOOPBACK), answers("::1", "127.0.0.1"), connects)
        response = await post(http, port)
        await http.aclose()
    finally:
        listener.close()
    assert (response.status_code, response.content) == (200, b"ok")
    assert connects.addresses == ["::1", "127.0.0.1"]
    assert server.connections == 1


async def test_one_blocked_answer_refuses_the_name_before_any_address_is_tried(
        ) -> None:
    connects = Connects()
    async with serving(answering(OK)) as server:
        http = transport(Guard(["127.0.0.0/8"]), answers("127.0.0.1", "10.0.0.7"),
                         connects)
        with pytest.raises(BlockedAddress, match=r"10\.0\.0\.7 is private"):
            await post(http, server.port)
        await http.aclose()
    assert (connects.addresses, server.connections) == ([], 0)


async def test_a_port_outside_allowed_ports_is_refused_before_connecting() -> None:
    connects = Connects()
    async with serving(answering(OK)) as server:
        refused = transport(Guard(LOOPBACK, [443, 8443]), answers("127.0.0.1"), connects)
        with pytest.raises(BlockedAddress, match=rf"port {server.port} is not in "
                                                 r"webhooks.allowed_ports \(443, 8443\)"):
            await post(refused, server.port)
        await refused.aclose()
        assert (connects.addresses, server.connections) == ([], 0)
        allowed = transport(Guard(LOOPBACK, [server.port]), answers("127.0.0.1"),
                            connects)
        assert (await post(allowed, server.port)).status_code == 200
        await allowed.aclose()
    assert server.connections == 1


async def test_the_webhook_client_uses_the_ports_its_settings_name() -> None:
    async with serving(answering(OK)) as server:
        url = f"http://127.0.0.1:{server.port}/in"
        closed = WebhookClient(WebhookSettings(allowed_networks=LOOPBACK, allowed_ports=[443]))
        open_ = WebhookClient(WebhookSettings(allowed_networks=LOOPBACK,
                                              allowed_ports=[server.port]))
        try:
            blocked = await closed.post(url, {}, b"{}")
            sent = await open_.post(url, {}, b"{}")
        finally:
            await closed.aclose()
            await open_.aclose()
    assert (blocked.error_kind, sent.status_code) == ("blocked", 200)
    assert blocked.error is not None
    assert "allowed_ports" in blocked.error
    assert server.connections == 1


def test_allowed_ports_are_read_from_the_environment_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from notifyq._errors import ConfigError
    from notifyq._settings import load_settings

    monkeypatch.setenv("NOTIFYQ_WEBHOOKS__ALLOWED_PORTS", "443, 8443")
    assert load_settings().webhooks.allowed_ports == [443, 8443]
    monkeypatch.setenv("NOTIFYQ_WEBHOOKS__ALLOWED_PORTS", "443,70000")
    with pytest.raises(ConfigError, match="allowed_ports"):
        load_settings()


async def test_tls_verifies_the_urls_hostname_not_the_checked_address(
        tmp_path: Path) -> None:
    """The certificate names localhost and 127.0.0.1: reached as ``localhost`` it is accepted;
    reached as ``hooks.example`` resolving to 127.0.0.1 it is refused, so the name, not the
    address the stream went to, was verified (SNI included), and no other address was tried."""
    cert, key = _self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))
    server = Server()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        await answering(OK, then_close=True)(reader, writer, server, server.connections)
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=served)
    port = listener.sockets[0].getsockname()[1]
    connects = Connects()
    guard, resolver = Guard(LOOPBACK), answers("127.0.0.1", "::1")
    http = transport(guard, resolver, connects, ssl_context=trusted)
    try:
        request = httpx.Request("POST", f"https://localhost:{port}/in", content=b"{}")
        response = await http.handle_async_request(request)
        await response.aread()
        await response.aclose()
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await post(http, port, scheme="https")
    finally:
        await http.aclose()
        listener.close()
        await listener.wait_closed()
    assert response.status_code == 200
    assert connects.addresses == ["127.0.0.1", "127.0.0.1"]
    assert len(server.requests) == 1
