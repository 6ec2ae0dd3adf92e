"""The customer portal's sign-in: one-time links and sessions (``app.webhooks.portal``).

An application mints a link for one of its tenants (``POST /v1/portal/links``); its customer
opens it, and the portal exchanges it once for a session cookie. Both the link's code and the
session's cookie are 32 random bytes (``secrets.token_urlsafe``) of which the database keeps
only the SHA-256: a copy of the tables signs nobody in, and a tampered code matches no row.
The link is tied to one tenant, expires (``webhooks.portal_link_ttl_s``, at most a day) and is
spent by the one UPDATE that redeems it. The code travels in the URL's fragment
(``/portal/link#<code>``), which browsers never send to a server: it is in no access log, no
proxy log and no ``Referer``; the portal's page posts it.

Example::

    link = await app.webhooks.portal.mint("acme", ttl_s=600, base_url="https://hooks.example.com")
    send_to_customer(link.url)   # https://hooks.example.com/portal/link#...
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from notifyq._errors import InvalidEndpoint
from notifyq._runtime import Runtime

MIN_LINK_TTL_S = 10.0
MAX_LINK_TTL_S = 86_400.0
"""A link is short-lived: at most a day (mint another one rather than a long-lived link)."""
MAX_TENANT_LEN = 512
LINK_PATH = "/portal/link"


@dataclass(frozen=True, slots=True)
class PortalLink:
    """A minted sign-in link: ``url`` (its code in the fragment) opens the portal once, for
    ``tenant_id``, until ``expires_at``."""

    url: str
    tenant_id: str
    read_only: bool
    expires_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "tenant_id": self.tenant_id, "read_only": self.read_only,
                "expires_at": self.expires_at.isoformat()}

    def __repr__(self) -> str:  # the url is a credential: keep it out of reprs and logs
        return (f"PortalLink(tenant_id={self.tenant_id!r}, read_only={self.read_only}, "
                f"expires_at={self.expires_at.isoformat()!r})")


@dataclass(frozen=True, slots=True)
class PortalSession:
    """A signed-in customer: one tenant; ``token_name`` when signed in with an API token."""

    tenant_id: str
    read_only: bool
    token_name: str | None
    expires_at: datetime
    csrf: str


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _csrf(cookie: str) -> str:
    return hmac.new(cookie.encode(), b"notifyq.portal.csrf", hashlib.sha256).hexdigest()


def check_tenant(tenant_id: str) -> str:
    if not 1 <= len(tenant_id) <= MAX_TENANT_LEN:
        raise InvalidEndpoint(f"tenant_id: 1 to {MAX_TENANT_LEN} characters")
    return tenant_id


class Portal:
    """Links and sessions of the customer portal, in the database (every replica of
    ``notifyq serve`` accepts them)."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @property
    def session_s(self) -> float:
        return self._rt.settings.webhooks.portal_session_s

    async def _one(self, query: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        async with self._rt.connection(None) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, {"now": self._rt.clock.db_now(), **params})
            return await cur.fetchone()

    async def mint(self, tenant_id: str, *, ttl_s: float | None = None, read_only: bool = False,
                   base_url: str | None = None) -> PortalLink:
        """A one-time sign-in link for ``tenant_id``, valid ``ttl_s`` (default
        ``webhooks.portal_link_ttl_s``). Its address starts with ``base_url``, else
        ``webhooks.portal_url``, else it is a path (``/portal/link#...``)."""
        settings = self._rt.settings.webhooks
        ttl = settings.portal_link_ttl_s if ttl_s is None else float(ttl_s)
        if not MIN_LINK_TTL_S <= ttl <= MAX_LINK_TTL_S:
            raise InvalidEndpoint(f"ttl_s: between {MIN_LINK_TTL_S:g} and {MAX_LINK_TTL_S:g} "
                                  f"seconds, got {ttl:g}")
        code = secrets.token_urlsafe(32)
        await self._one(self._rt.queries.portal_link_purge, {})
        row = await self._one(self._rt.queries.portal_link_insert, {
            "code_hash": _digest(code), "tenant_id": check_tenant(tenant_id),
            "read_only": read_only, "ttl_s": ttl})
        assert row is not None  # noqa: S101 - INSERT ... RETURNING
        base = (base_url or settings.portal_url or "").rstrip("/")
        return PortalLink(f"{base}{LINK_PATH}#{code}", row["tenant_id"], row["read_only"],
                          row["expires_at"])

    async def redeem(self, code: str) -> tuple[str, PortalSession] | None:
        """Spend the link whose code is ``code`` and start its session: (cookie, session), or
        None when the code is unknown, tampered with, expired or already used."""
        if not code or len(code) > 256:
            return None
        async with self._rt.connection(None) as conn, conn.transaction(), \
                conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._rt.queries.portal_link_redeem, {
                "code_hash": _digest(code), "now": self._rt.clock.db_now()})
            link = await cur.fetchone()
            if link is None:
                return None
            return await self._start(cur, link["tenant_id"], link["read_only"], None)

    async def start(self, tenant_id: str, *, read_only: bool,
                    token_name: str) -> tuple[str, PortalSession]:
        """A session for a customer who signed in with the API token ``token_name``."""
        async with self._rt.connection(None) as conn, conn.cursor(row_factory=dict_row) as cur:
            return await self._start(cur, check_tenant(tenant_id), read_only, token_name)

    async def _start(self, cur: Any, tenant_id: str, read_only: bool,
                     token_name: str | None) -> tuple[str, PortalSession]:
        cookie = secrets.token_urlsafe(32)
        await cur.execute(self._rt.queries.portal_session_insert, {
            "cookie_hash": _digest(cookie), "tenant_id": tenant_id, "read_only": read_only,
            "token_name": token_name, "session_s": self.session_s,
            "now": self._rt.clock.db_now()})
        row = await cur.fetchone()
        assert row is not None  # noqa: S101 - INSERT ... RETURNING
        return cookie, PortalSession(**row, csrf=_csrf(cookie))

    async def open(self, cookie: str | None) -> PortalSession | None:
        """The session of ``cookie``, or None when absent, unknown or expired."""
        if not cookie or len(cookie) > 256:
            return None
        row = await self._one(self._rt.queries.portal_session_get,
                              {"cookie_hash": _digest(cookie)})
        return None if row is None else PortalSession(**row, csrf=_csrf(cookie))

    async def end(self, cookie: str) -> None:
        """Sign out: the session's row is deleted (the cookie opens nothing any more)."""
        await self._one(self._rt.queries.portal_session_delete,
                        {"cookie_hash": _digest(cookie)})

    # -- what a tenant sees -----------------------------------------------------------------

    async def messages(self, tenant_id: str, *, before: str | None = None,
                       limit: int = 50) -> list[dict[str, Any]]:
        """The messages with a delivery to an endpoint of ``tenant_id`` (sent to it or by
        event type), newest first, with that tenant's deliveries counted."""
        async with self._rt.connection(None) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._rt.queries.webhook_message_list_for_tenant, {
                "tenant_id": tenant_id, "before": before, "limit": limit})
            return await cur.fetchall()

    async def reached(self, message_id: str, tenant_id: str) -> set[Any]:
        """The endpoints of ``tenant_id`` the message has a delivery to (empty: not theirs)."""
        async with self._rt.connection(None) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._rt.queries.webhook_message_delivered_to_tenant, {
                "id": message_id, "tenant_id": tenant_id})
            return {r["endpoint_id"] for r in await cur.fetchall()}

    async def owns(self, endpoint_id: UUID, tenant_id: str) -> bool:
        """Whether the endpoint belongs to ``tenant_id`` (asked in SQL; its tenant never
        changes, so the answer holds for the request)."""
        async with self._rt.connection(None) as conn:
            cur = await conn.execute(self._rt.queries.webhook_endpoint_in_tenants, {
                "id": endpoint_id, "tenant_ids": [tenant_id]})
            return await cur.fetchone() is not None
