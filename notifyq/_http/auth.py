"""Bearer tokens with scopes (``read``, ``admin``; admin includes read), compared in constant
time. The token itself is never logged nor echoed; a request is known by the token's name.

A token may be limited to tenants (``api.tokens[].tenants``): the routes then pass
:func:`token_tenants` to every query as ``tenant_ids``, so its runs, signals, webhook endpoints
and messages are filtered in SQL (another tenant's object is a 404, as if it did not exist).
Operations about the whole cluster (stats, pools, workers, pauses, schedules, keys) are refused
to such a token with 403 (:meth:`Authenticator.require` with ``every_tenant=True``)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Literal

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as ASGIScope

from notifyq._http.problems import problem
from notifyq._settings import ApiSettings

Scope = Literal["read", "admin"]

# The same words whoever asks: they say how, never which tokens exist or where they are kept.
HOW_TO_AUTHENTICATE = ("send the header `Authorization: Bearer <token>` with a token this "
                       "server is configured with (NOTIFYQ_ADMIN_TOKEN or NOTIFYQ_READ_TOKEN; "
                       "`notifyq serve` prints where it keeps the one it generated)")


@dataclass(frozen=True)
class _Token:
    name: str
    secret: bytes
    scopes: frozenset[str]
    tenants: frozenset[str] | None = None
    """The tenants it is limited to; None: every tenant (and objects of none)."""


class Authenticator:
    def __init__(self, settings: ApiSettings) -> None:
        tokens = []
        if settings.admin_token is not None:
            tokens.append(_Token("admin", settings.admin_token.get_secret_value().encode(),
                                 frozenset({"read", "admin"})))
        if settings.read_token is not None:
            tokens.append(_Token("read", settings.read_token.get_secret_value().encode(),
                                 frozenset({"read"})))
        for extra in settings.tokens:
            scopes = set(extra.scopes) | ({"read"} if "admin" in extra.scopes else set())
            tenants = frozenset(extra.tenants) if extra.tenants is not None else None
            tokens.append(_Token(extra.name, extra.token.get_secret_value().encode(),
                                 frozenset(scopes), tenants))
        self._tokens = tokens

    @property
    def configured(self) -> bool:
        return bool(self._tokens)

    def named(self, name: str) -> _Token | None:
        """The token called ``name`` (a dashboard session names its token, never holds it)."""
        return next((t for t in self._tokens if t.name == name), None)

    def identify(self, presented: str) -> _Token | None:
        """The token matching ``presented``; every token is compared, so the time taken does
        not tell which (or whether any) matched."""
        given = presented.encode()
        found = None
        for token in self._tokens:
            if hmac.compare_digest(token.secret, given):
                found = token
        return found

    def authenticate(self, authorization: str) -> _Token | str:
        """The token an ``Authorization`` header value presents, or why there is none."""
        kind, _, value = authorization.partition(" ")
        if kind.lower() != "bearer" or not value.strip():
            return f"missing bearer token: {HOW_TO_AUTHENTICATE}"
        token = self.identify(value.strip())
        if token is None:
            return f"invalid bearer token: {HOW_TO_AUTHENTICATE}"
        return token

    def require(self, scope: Scope, *, every_tenant: bool = False) -> TokenCheck:
        """A FastAPI dependency: 401 without a valid token, 403 when it lacks ``scope`` (or,
        with ``every_tenant``, when it is limited to tenants)."""
        return TokenCheck(self, scope, every_tenant)


@dataclass(frozen=True)
class TokenCheck:
    """The dependency :meth:`Authenticator.require` makes. The token is left in
    ``request.state.token`` for :func:`token_tenants`. Every ``/v1`` route either takes
    :func:`token_tenants` (and filters by it) or has ``every_tenant`` (a test holds it)."""

    auth: Authenticator
    scope: Scope
    every_tenant: bool

    async def __call__(self, request: Request) -> str:
        token = self.auth.authenticate(request.headers.get("authorization", ""))
        if isinstance(token, str):
            raise HTTPException(401, token, headers=CHALLENGE)
        if self.scope not in token.scopes:
            raise HTTPException(403, f"token {token.name!r} lacks the {self.scope!r} scope")
        if self.every_tenant and token.tenants is not None:
            raise HTTPException(403, f"token {token.name!r} is limited to tenants; this "
                                "operation is about every tenant: use a token configured "
                                "without `tenants`")
        request.state.token = token
        return token.name


def token_tenants(request: Request) -> list[str] | None:
    """A FastAPI dependency (after :meth:`Authenticator.require`): the tenants the request's
    token is limited to, sorted, for the queries' ``tenant_ids``; None for every tenant."""
    token: _Token = request.state.token
    return sorted(token.tenants) if token.tenants is not None else None


def tenant_for(given: str | None, tenants: list[str] | None) -> str | None:
    """The tenant of a run (or endpoint) a token creates: as given by a token of every tenant;
    for a tenant-scoped token, one of its tenants (its only one when none is given; 403 for
    another, 422 when it has several and none is given)."""
    if tenants is None or given in tenants:
        return given
    if given is not None:
        raise HTTPException(403, f"this token may not act for tenant_id {given!r}: it is "
                            "limited to other tenants")
    if len(tenants) == 1:
        return tenants[0]
    raise HTTPException(422, "tenant_id: required with a token limited to several tenants "
                        f"(one of {', '.join(map(repr, tenants))})")


class RequireToken:
    """Refuse ``/v1`` requests without a valid token (401) before anything reads their body:
    a stranger's malformed JSON is a 401, not a 400 that tells it the route exists and parses.
    The OpenAPI document and the Swagger UI need no token (they hold no data); the routes
    still check scopes (and tenants) with :meth:`Authenticator.require`."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith("/v1/") and not path.startswith(PUBLIC_PATHS):
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            token = self.auth.authenticate(header.decode("latin-1"))
            if isinstance(token, str):
                # Refused unread, as BodyLimit refuses: the server does not drain a body left
                # unread, so say the connection ends, or a keep-alive client sends its next
                # request into a closing socket.
                await problem(401, token, headers={**CHALLENGE, "Connection": "close"})(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="notifyq"'}
PUBLIC_PATHS = ("/v1/openapi.json", "/v1/docs")
"""The ``/v1`` paths that need no token (and take no body)."""
