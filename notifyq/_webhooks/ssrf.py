"""The SSRF guard: webhook destinations must be public addresses.

``Guard.judge(address)`` says why an address is refused (None: it may be reached). IPv4 forms
embedded in IPv6 (mapped ``::ffff:a.b.c.d``, translated ``::ffff:0:a.b.c.d``, compatible
``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) are unwrapped and the IPv4 address
alone is judged, ``allowed_networks`` included: it is where the packets go, so allowing the
wrapper (``64:ff9b::/96``) does not let through the metadata address inside it. The tables below
are explicit (IANA special purpose registries) rather than ``ipaddress.is_global`` alone, which
has let through ranges such as CGNAT, NAT64 or the translated form in some Python versions;
``is_global`` is checked as well. ``allowed_ports`` (when set) limits the destination port.

At delivery the guard is the HTTP client's resolver (:mod:`notifyq._webhooks.transport`):
the hostname is resolved once, every resolved address must
pass (one bad answer refuses them all), and the connection goes to a checked address, tried in
the resolver's order until one connects; a DNS answer that changes between check and connect
(rebinding) is never used. TLS still verifies the URL's hostname (SNI and certificate), not the
address the TCP stream went to.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable

import anyio

from notifyq._errors import BlockedAddress, ResolutionFailed

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port) -> addresses``: the system resolver by default; tests inject their own."""

_V4 = [
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.31.196.0/24", "AS112"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("192.175.48.0/24", "AS112"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
]
_V6 = [
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/23", "IETF protocol assignments (incl. Teredo)"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing"),
    ("fc00::/7", "unique local (ULA)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
]
BLOCKED: list[tuple[IPNetwork, str]] = [
    (ipaddress.ip_network(cidr), why) for cidr, why in (*_V4, *_V6)]

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
"""SIIT's IPv4-translated form (RFC 2765), which ``ipv4_mapped`` does not read."""


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv6 form that carries one; else ``address``."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if (address in _NAT64 or address in _TRANSLATED
            or (address in _COMPATIBLE and int(address) > 1)):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return address


def literal_address(host: str) -> IPAddress | None:
    """The address a host names literally, in any form a resolver accepts without DNS:
    ``127.0.0.1``, ``::1`` / ``[::1]``, and the legacy IPv4 forms ``127.1``, ``2130706433``,
    ``0x7f000001``, ``0177.0.0.1``."""
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        pass
    if bare and all(c in "0123456789abcdefxABCDEFX." for c in bare):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(bare))
        except OSError:
            return None
    return None


def is_localhost_name(host: str) -> bool:
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


class Guard:
    """Judges addresses: refused unless public, or inside ``allowed`` networks; and ports:
    refused unless in ``ports`` (empty: any port)."""

    def __init__(self, allowed: Iterable[str] = (), ports: Iterable[int] = ()) -> None:
        self.allowed = [ipaddress.ip_network(c, strict=False) for c in allowed]
        self.ports = frozenset(ports)

    def judge(self, address: IPAddress) -> str | None:
        """Why ``address`` is refused, or None when it may be reached."""
        # An embedded IPv4 address is what the packets reach: it alone is judged, allowlist
        # included (allowing 64:ff9b::/96 must not allow 64:ff9b::a9fe:a9fe, the metadata
        # service). Allowing 127.0.0.0/8 does allow ::ffff:127.0.0.1: the same destination.
        target = unwrap(address)
        if self._allowed(target):
            return None
        label = str(address) if target == address else f"{address} (IPv4 {target})"
        for network, why in BLOCKED:
            if target.version == network.version and target in network:
                return f"{label} is {why}"
        if not target.is_global:
            return f"{label} is not a public address"
        return None

    def check_port(self, port: int) -> str | None:
        """Why ``port`` is refused (``webhooks.allowed_ports``), or None."""
        if not self.ports or port in self.ports:
            return None
        allowed = ", ".join(str(p) for p in sorted(self.ports))
        return f"port {port} is not in webhooks.allowed_ports ({allowed})"

    def _allowed(self, address: IPAddress) -> bool:
        return any(address.version == n.version and address in n for n in self.allowed)

    def check_host(self, host: str) -> str | None:
        """At write time: why a URL host is refused without resolving it (literal addresses
        and localhost names), or None."""
        if is_localhost_name(host):
            reasons = [self.judge(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
            return None if any(r is None for r in reasons) else f"{host} is loopback"
        literal = literal_address(host)
        return None if literal is None else self.judge(literal)

    async def addresses(self, host: str, port: int, resolver: Resolver) -> list[IPAddress]:
        """The addresses to try, in the resolver's order: every address ``host`` resolves to
        must pass (one bad answer refuses them all), and so must ``port``."""
        literal = self.literal(host, port)
        if literal is not None:
            return [literal]
        if is_localhost_name(host):
            names = ["127.0.0.1", "::1"]
        else:
            try:
                names = await resolver(host, port)
            except OSError as exc:  # an injected resolver's gaierror: still a DNS failure
                raise ResolutionFailed(f"{host} did not resolve: {exc}") from None
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in names]
        if not addresses:
            raise ResolutionFailed(f"{host} resolved to no address")
        for address in addresses:
            self._refuse(host, self.judge(address))
        return list(dict.fromkeys(addresses))

    def literal(self, host: str, port: int) -> IPAddress | None:
        """The address ``host`` names literally, checked with ``port`` (raises
        BlockedAddress); None for a name that needs resolving (its port is checked too)."""
        self._refuse(host, self.check_port(port))
        literal = literal_address(host)
        if literal is not None:
            self._refuse(host, self.judge(literal))
        return literal

    @staticmethod
    def _refuse(host: str, reason: str | None) -> None:
        if reason is not None:
            raise BlockedAddress(f"refusing to connect to {host}: {reason}")


async def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ResolutionFailed(f"cannot resolve {host}: {exc.strerror or exc}") from None
    seen: dict[str, None] = {}
    for info in infos:
        seen.setdefault(str(info[4][0]), None)
    return list(seen)
