"""Dashboard sessions: a signed reference to an API token, never the token itself.

Signing in with a token sets one cookie (HttpOnly, SameSite=Strict, Secure over https) holding
``v1.<token name>.<issued>.<nonce>.<mac>``: the MAC is an HMAC-SHA256 under a key derived from
that token's secret, so

* nothing in the cookie (or any page) reveals a token, and a stolen cookie expires after
  ``SESSION_S``;
* no server-side store is needed: every ``notifyq serve`` replica with the same tokens accepts
  the session, and changing (or removing) a token ends every session made with it;
* each session has its own CSRF token (an HMAC of its nonce), sent with every state-changing
  form or request and compared in constant time.

Example::

    cookie = Sessions(auth).issue(token, now)
    viewer = Sessions(auth).open(cookie, now)   # None: absent, forged, expired or token gone
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from notifyq._http.auth import Authenticator

COOKIE = "nq_session"
SESSION_S = 12 * 3600
"""A session lasts a working day; signing in again costs one paste of the token."""
_VERSION = "v1"
_KEY_LABEL = b"notifyq.ui.session.v1"


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: the token's name and scopes, and this session's CSRF token."""

    name: str
    scopes: frozenset[str]
    csrf: str
    expires_at: int

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth

    def _key(self, name: str) -> bytes | None:
        token = self._auth.named(name)
        if token is None:
            return None
        return hmac.new(token.secret, _KEY_LABEL, hashlib.sha256).digest()

    def issue(self, name: str, now: float) -> str:
        """A cookie value for the token called ``name`` (the caller identified it)."""
        key = self._key(name)
        if key is None:
            raise LookupError(f"no token named {name!r}")
        payload = ".".join((_VERSION, _b64(name.encode()), str(int(now)),
                            secrets.token_urlsafe(18)))
        return f"{payload}.{_mac(key, payload)}"

    def open(self, cookie: str | None, now: float) -> Viewer | None:
        """The session's viewer, or None when the cookie is absent, forged, expired, or its
        token no longer configured."""
        parts = (cookie or "").split(".")
        if len(parts) != 5 or parts[0] != _VERSION:
            return None
        try:
            name = _unb64(parts[1]).decode()
            issued = int(parts[2])
        except ValueError:
            return None
        key = self._key(name)
        payload = ".".join(parts[:4])
        if key is None or not hmac.compare_digest(_mac(key, payload), parts[4]):
            return None
        if not issued <= now < issued + SESSION_S:
            return None
        token = self._auth.named(name)
        assert token is not None  # noqa: S101 - _key found it
        if token.tenants is not None:  # limited to tenants since it signed in: not here
            return None
        return Viewer(name, token.scopes, _mac(key, "csrf:" + parts[3]), issued + SESSION_S)


def _mac(key: bytes, text: str) -> str:
    return _b64(hmac.new(key, text.encode(), hashlib.sha256).digest())


def same_csrf(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
