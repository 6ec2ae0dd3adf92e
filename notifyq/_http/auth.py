"""Bearer tokens with scopes (``read``, ``admin``; admin includes read), compared in constant
time. The token itself is never logged nor echoed; a request is known by the token's name."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from fastapi import HTTPException, Request

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
            tokens.append(_Token(extra.name, extra.token.get_secret_value().encode(),
                                 frozenset(scopes)))
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

    def require(self, scope: Scope) -> Callable[[Request], Awaitable[str]]:
        """A FastAPI dependency: 401 without a valid token, 403 when it lacks ``scope``."""
        async def check(request: Request) -> str:
            header = request.headers.get("authorization", "")
            kind, _, value = header.partition(" ")
            challenge = {"WWW-Authenticate": 'Bearer realm="notifyq"'}
            if kind.lower() != "bearer" or not value.strip():
                raise HTTPException(401, f"missing bearer token: {HOW_TO_AUTHENTICATE}",
                                    headers=challenge)
            token = self.identify(value.strip())
            if token is None:
                raise HTTPException(401, f"invalid bearer token: {HOW_TO_AUTHENTICATE}",
                                    headers=challenge)
            if scope not in token.scopes:
                raise HTTPException(403, f"token {token.name!r} lacks the {scope!r} scope")
            return token.name
        return check
