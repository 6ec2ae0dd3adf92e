"""Webhook endpoints: what is checked when one is written, and how one is shown.

A URL is refused when it is not http(s) (or not https with ``webhooks.https_only``), has
userinfo, is longer than 2,048 characters, or names a blocked address literally (including the
legacy IPv4 forms ``127.1``, ``2130706433``, ``0x7f000001`` and ``localhost`` names). Hostnames
are judged again, resolved, at every connection.

URLs and header values are also checked exactly as an attempt will send them
(:func:`~notifyq._webhooks.client.request_for`): what the transport could not send is refused
here, with the setting named, instead of failing every delivery.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from notifyq._errors import InvalidEndpoint
from notifyq._settings import WebhookSettings
from notifyq._webhooks.client import Unsendable, header_check, url_for
from notifyq._webhooks.ssrf import Guard

CircuitState = Literal["closed", "open", "half_open"]

# The limits of webhook endpoints and messages: the one source for these checks and the admin
# API's schemas. The database states the URL's and (in _send_webhook) the event type's, the
# idempotency key's and the payload's too; tests/db/test_limits.py holds the two sides equal.
MAX_URL_LENGTH = 2048
MAX_HEADERS = 50
MAX_HEADER_NAME_LEN = 256
MAX_HEADER_VALUE_LEN = 4096
MAX_EVENT_TYPES = 1000
MAX_EVENT_TYPE_LEN = 128
MAX_DESCRIPTION_LEN = 1000
MAX_SECRET_LEN = 200
"""A generous bound on ``whsec_`` + base64 of at most 64 bytes (94 characters)."""
MAX_RATE_LIMIT = 1_000_000
"""Deliveries per second an endpoint's ``rate_limit`` may say (the database checks it too)."""
MAX_IDEMPOTENCY_KEY_LEN = 256
MAX_PAYLOAD_BYTES = 262_144
"""A message's body as jsonb prints it; checked by the database (_send_webhook)."""
EVENT_TYPE = re.compile(rf"^[A-Za-z0-9_][A-Za-z0-9_.:-]{{0,{MAX_EVENT_TYPE_LEN - 1}}}$")
_HEADER_NAME = re.compile(rf"^[!#$%&'*+.^_`|~0-9A-Za-z-]{{1,{MAX_HEADER_NAME_LEN}}}$")
# Custom headers can never replace what signs and frames the request.
RESERVED_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature",
                              "content-type", "content-length", "host", "transfer-encoding",
                              "connection", "accept-encoding", "te", "upgrade", "trailer",
                              "keep-alive", "proxy-authorization", "proxy-connection"})


def check_url(url: str, settings: WebhookSettings) -> str:
    if not isinstance(url, str) or not url:
        raise InvalidEndpoint("url: required")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidEndpoint(f"url: {len(url)} characters; the limit is {MAX_URL_LENGTH}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InvalidEndpoint("url: must not contain whitespace or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise InvalidEndpoint(f"url: not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidEndpoint(f"url: scheme must be http or https, got {scheme or 'none'!r}")
    if settings.https_only and scheme != "https":
        raise InvalidEndpoint("url: must be https (webhooks.https_only is set)")
    if "@" in parts.netloc:
        raise InvalidEndpoint("url: must not contain userinfo (user:password@)")
    if not host:
        raise InvalidEndpoint("url: has no host")
    try:
        sent_host = url_for(url).host
    except Unsendable as exc:
        raise InvalidEndpoint(str(exc)) from None
    for name in {host, sent_host}:  # each parser's reading of the host must pass the guard
        _guard(name, settings)
    return url


def _guard(host: str, settings: WebhookSettings) -> None:
    reason = Guard(settings.allowed_networks).check_host(host)
    if reason is not None:
        raise InvalidEndpoint(f"url: {reason}; webhooks only go to public addresses (allow a "
                              "range with webhooks.allowed_networks)")


def check_headers(headers: dict[str, str] | None) -> dict[str, str]:
    if not headers:
        return {}
    if len(headers) > MAX_HEADERS:
        raise InvalidEndpoint(f"headers: at most {MAX_HEADERS}")
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise InvalidEndpoint(f"headers: {name!r} is not a valid header name")
        lowered = name.lower()
        if lowered in RESERVED_HEADERS or lowered.startswith("webhook-"):
            raise InvalidEndpoint(f"headers: {name} is set by notifyq and cannot be overridden")
        if (not isinstance(value, str) or any(c in value for c in "\r\n\x00")
                or len(value) > MAX_HEADER_VALUE_LEN):
            raise InvalidEndpoint(f"headers: the value of {name} must be a single-line string "
                                  f"of at most {MAX_HEADER_VALUE_LEN} characters")
        try:
            header_check(name, value)
        except Unsendable as exc:
            raise InvalidEndpoint(str(exc)) from None
        out[name] = value
    return out


def check_rate_limit(rate_limit: int | None) -> int | None:
    """Deliveries per second (a whole number from 1), or None: unlimited."""
    if rate_limit is None:
        return None
    if isinstance(rate_limit, bool) or not isinstance(rate_limit, int) or not (
            1 <= rate_limit <= MAX_RATE_LIMIT):
        raise InvalidEndpoint(f"rate_limit: deliveries per second, a whole number from 1 to "
                              f"{MAX_RATE_LIMIT} (or null: unlimited), got {rate_limit!r}")
    return rate_limit


def check_event_types(event_types: list[str] | None) -> list[str] | None:
    if event_types is None:
        return None
    if len(event_types) > MAX_EVENT_TYPES:
        raise InvalidEndpoint(f"event_types: at most {MAX_EVENT_TYPES}")
    for event_type in event_types:
        if not isinstance(event_type, str) or not EVENT_TYPE.fullmatch(event_type):
            raise InvalidEndpoint(f"event_types: {event_type!r} must match {EVENT_TYPE.pattern}")
    return sorted(set(event_types))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An endpoint as stored. ``secret`` is set only by create and rotate-secret: the one time
    the secret is shown."""

    id: UUID
    url: str
    description: str
    event_types: list[str] | None
    headers: dict[str, str]
    disabled_at: datetime | None
    disabled_reason: str | None
    failing_since: datetime | None
    created_at: datetime
    updated_at: datetime
    valid_secrets: int = 0
    secret: str | None = None
    tenant_id: str | None = None
    """The tenant it belongs to (None: none), set at creation: see ``api.tokens[].tenants``."""
    consecutive_failures: int = 0
    """Failed attempts since the last success (the circuit breaker's count)."""
    circuit_open_until: datetime | None = None
    """Until when the circuit breaker parks the endpoint's deliveries (None: closed)."""
    rate_limit: int | None = None
    """Deliveries per second at most, across all workers (None: unlimited)."""
    ordered: bool = False
    """One delivery at a time, in send order, each after the one before succeeded or was
    given up (see docs/webhooks.md, "Ordered endpoints")."""

    @property
    def enabled(self) -> bool:
        return self.disabled_at is None

    def circuit_state(self, now: datetime | None = None) -> CircuitState:
        """``closed``; ``open`` until ``circuit_open_until``; then ``half_open``: the next
        delivery is a probe whose outcome closes or opens it again."""
        if self.circuit_open_until is None:
            return "closed"
        return "open" if self.circuit_open_until > (now or datetime.now(UTC)) else "half_open"

    @classmethod
    def from_row(cls, row: dict[str, Any], secret: str | None = None) -> Endpoint:
        return cls(row["id"], row["url"], row["description"], row["event_types"],
                   dict(row["headers"] or {}), row["disabled_at"], row["disabled_reason"],
                   row["failing_since"], row["created_at"], row["updated_at"],
                   int(row.get("valid_secrets") or 0), secret, row.get("tenant_id"),
                   int(row.get("consecutive_failures") or 0), row.get("circuit_open_until"),
                   row.get("rate_limit"), bool(row.get("ordered")))

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": str(self.id), "url": self.url, "description": self.description,
            "event_types": self.event_types, "headers": self.headers, "enabled": self.enabled,
            "disabled_at": _iso(self.disabled_at), "disabled_reason": self.disabled_reason,
            "failing_since": _iso(self.failing_since), "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at), "valid_secrets": self.valid_secrets,
            "tenant_id": self.tenant_id, "rate_limit": self.rate_limit,
            "ordered": self.ordered,
            "circuit": {"state": self.circuit_state(now),
                        "consecutive_failures": self.consecutive_failures,
                        "open_until": _iso(self.circuit_open_until)}}
        if self.secret is not None:
            out["secret"] = self.secret
        return out

    def __repr__(self) -> str:  # never the secret
        return f"Endpoint(id={self.id}, url={self.url!r}, enabled={self.enabled})"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
