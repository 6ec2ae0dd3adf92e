"""The SSRF guard's address table, the URL checks at write time, and the pinned connection: a
refused destination raises before any socket is opened (an injected resolver stands in for
DNS; nothing leaves this machine)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import anyio
import httpx
import pytest

from notifyq._errors import BlockedAddress, InvalidEndpoint
from notifyq._settings import WebhookSettings
from notifyq._webhooks.endpoints import check_headers, check_url
from notifyq._webhooks.ssrf import Guard, Resolver, literal_address
from notifyq._webhooks.transport import GuardedTransport

BLOCKED = [
    "0.0.0.0",  # noqa: S104 - a table of refused addresses
    "10.1.2.3", "100.64.0.1", "127.0.0.1", "127.255.255.254", "169.254.169.254",
    "172.16.0.1", "172.31.255.255", "192.0.0.8", "192.0.2.1", "192.168.1.1", "198.18.0.1",
    "198.51.100.7", "203.0.113.9", "224.0.0.1", "239.255.255.250", "240.0.0.1",
    "255.255.255.255",
    "::", "::1", "fc00::1", "fd12:3456::1", "fe80::1", "fec0::1", "ff02::1", "2001:db8::1",
    "100::1", "2001::1", "64:ff9b:1::1",
    # IPv4 inside IPv6: mapped, translated (SIIT), compatible, NAT64, 6to4
    "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe", "::ffff:0:a00:1",
    "::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:169.254.169.254", "::ffff:10.0.0.1",
    "::127.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1",
    "2002:c0a8:101::1",
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111",
          "::ffff:8.8.8.8", "2002:808:808::1", "::ffff:0:808:808", "64:ff9b::808:808"]


@pytest.mark.parametrize("address", BLOCKED)
def test_non_public_addresses_are_refused_by_default(address: str) -> None:
    assert Guard().judge(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert Guard().judge(ipaddress.ip_address(address)) is None


def test_the_allowlist_opens_exactly_the_ranges_it_names_mapped_forms_included() -> None:
    guard = Guard(["127.0.0.0/8", "::1/128"])
    for allowed in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"):
        assert guard.judge(ipaddress.ip_address(allowed)) is None
    for still_blocked in ("10.0.0.1", "169.254.169.254", "fe80::1"):
        assert guard.judge(ipaddress.ip_address(still_blocked)) is not None


@pytest.mark.parametrize("wrapper", ["64:ff9b::/96", "::ffff:0:0:0/96", "::ffff:0:0/96",
                                     "2002::/16", "::/0"])
def test_allowing_a_wrapper_network_does_not_allow_the_ipv4_address_inside(wrapper: str) -> None:
    guard = Guard([wrapper])
    for inside in ("64:ff9b::a9fe:a9fe", "::ffff:0:a9fe:a9fe", "::ffff:169.254.169.254",
                   "2002:a9fe:a9fe::1"):
        address = ipaddress.ip_address(inside)
        assert guard.judge(address) == (
            f"{address} (IPv4 169.254.169.254) is link-local (cloud metadata)")


@pytest.mark.parametrize(("host", "expected"), [
    ("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"), ("[::ffff:7f00:1]", "::ffff:7f00:1"), ("::1", "::1"),
    ("example.com", None), ("deadbeef.example", None),
])
def test_literal_addresses_are_read_in_every_form_a_resolver_accepts(
        host: str, expected: str | None) -> None:
    found = literal_address(host)
    assert (str(found) if found else None) == expected


LOOPBACK_URLS = ["http://127.0.0.1/", "http://127.1/", "http://2130706433/",
                 "http://0x7f000001/", "http://[::ffff:7f00:1]/", "http://[::1]:8080/",
                 "http://localhost./", "http://LOCALHOST/", "http://api.localhost/",
                 "http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/"]


@pytest.mark.parametrize("url", LOOPBACK_URLS)
def test_urls_that_reach_loopback_or_private_addresses_are_refused_at_write_time(
        url: str) -> None:
    with pytest.raises(InvalidEndpoint, match=r"url: .*public addresses"):
        check_url(url, WebhookSettings())


def test_the_allowlist_lets_loopback_urls_be_written() -> None:
    settings = WebhookSettings(allowed_networks=["127.0.0.0/8", "::1/128"])
    for url in ("http://127.0.0.1:9/", "http://localhost./x", "http://[::1]/"):
        assert check_url(url, settings) == url


@pytest.mark.parametrize(("url", "problem"), [
    ("ftp://example.com/", "scheme must be http or https"),
    ("file:///etc/passwd", "scheme"),
    ("https://user:pw@example.com/", "userinfo"),
    ("https://user@example.com/", "userinfo"),
    ("https://example.com/" + "a" * 2030, "the limit is 2048"),
    ("https://exa mple.com/", "whitespace"),
    ("https:///nohost", "has no host"),
    ("https://example.com:99999/", "not a valid URL"),
])
def test_malformed_urls_are_refused_with_the_reason(url: str, problem: str) -> None:
    with pytest.raises(InvalidEndpoint, match=problem):
        check_url(url, WebhookSettings())


def test_https_only_mode_refuses_plain_http() -> None:
    with pytest.raises(InvalidEndpoint, match="must be https"):
        check_url("http://example.com/", WebhookSettings(https_only=True))
    assert check_url("https://example.com/", WebhookSettings(https_only=True))


def test_a_url_of_exactly_2048_characters_is_accepted() -> None:
    url = "https://example.com/" + "a" * (2048 - 20)
    assert len(url) == 2048
    assert check_url(url, WebhookSettings()) == url


@pytest.mark.parametrize("name", ["webhook-signature", "Webhook-Id", "webhook-timestamp",
                                  "Content-Type", "host", "Content-Length", "webhook-extra"])
def test_custom_headers_cannot_override_the_signature_framing_or_host(name: str) -> None:
    with pytest.raises(InvalidEndpoint, match="cannot be overridden"):
        check_headers({name: "x"})


def test_custom_header_values_cannot_inject_lines() -> None:
    with pytest.raises(InvalidEndpoint, match="single-line"):
        check_headers({"X-Team": "a\r\nX-Evil: 1"})
    with pytest.raises(InvalidEndpoint, match="not a valid header name"):
        check_headers({"X-Team\n": "a"})
    assert check_headers({"X-Team": "billing"}) == {"X-Team": "billing"}


class _Recording:
    """Stands in for the transport's socket factory: records every connect it is asked for
    and refuses it (no socket is ever made)."""

    def __init__(self) -> None:
        self.connects: list[tuple[str, int]] = []

    def __call__(self, addr_info: Any) -> socket.socket:
        host, port = addr_info[4][:2]
        self.connects.append((host, port))
        raise ConnectionRefusedError("recorded, not connected")


def _transport(resolver: Resolver, allowed: list[str] | None = None) -> tuple[
        GuardedTransport, _Recording]:
    recording = _Recording()
    return GuardedTransport(Guard(allowed or []), resolver, socket_factory=recording), recording


async def _post(transport: GuardedTransport, url: str) -> None:
    await transport.handle_async_request(httpx.Request("POST", url, content=b"{}"))


@pytest.mark.parametrize("answers", [["127.0.0.1"], ["10.0.0.5"], ["169.254.169.254"],
                                     ["::1"], ["::ffff:127.0.0.1"], ["fd00::1"],
                                     ["93.184.216.34", "10.0.0.5"]])
def test_a_hostname_resolving_to_any_blocked_address_is_refused_before_connecting(
        answers: list[str]) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return answers

    transport, recording = _transport(resolver)

    async def go() -> None:
        with pytest.raises(BlockedAddress, match=r"refusing to connect to hooks\.example"):
            await _post(transport, "https://hooks.example/in")
        await transport.aclose()
    anyio.run(go)
    assert recording.connects == []


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "[::ffff:7f00:1]",
                                  "localhost.", "localhost"])
def test_loopback_url_forms_are_refused_at_connect_time_without_asking_dns(host: str) -> None:
    async def no_dns(host: str, port: int) -> list[str]:
        raise AssertionError("the resolver must not be asked")

    transport, recording = _transport(no_dns)

    async def go() -> None:
        with pytest.raises(BlockedAddress):
            await _post(transport, f"http://{host}/in")
        await transport.aclose()
    anyio.run(go)
    assert recording.connects == []


def test_the_connection_goes_to_the_checked_address_not_a_second_resolution() -> None:
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])  # a rebinding DNS server

    async def rebinding(host: str, port: int) -> list[str]:
        return next(answers)

    transport, recording = _transport(rebinding)

    async def go() -> None:
        with pytest.raises(httpx.ConnectError, match=r"Cannot connect to host rebind\.example"):
            await _post(transport, "https://rebind.example/in")
        with pytest.raises(BlockedAddress):
            await _post(transport, "https://rebind.example/in")
        await transport.aclose()
    anyio.run(go)
    assert recording.connects == [("93.184.216.34", 443)]


def test_allowed_networks_are_read_from_the_environment_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from notifyq._settings import load_settings

    monkeypatch.setenv("NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")
    assert load_settings().webhooks.allowed_networks == ["127.0.0.0/8", "::1/128"]
    monkeypatch.setenv("NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS", "127.0.0.0/8,nope")
    from notifyq._errors import ConfigError
    with pytest.raises(ConfigError, match="not a CIDR"):
        load_settings()
