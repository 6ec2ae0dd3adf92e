"""Dashboard sessions: a signed reference to a token, never the token; forged, expired and
orphaned cookies open nothing; each session has its own CSRF token."""

from __future__ import annotations

from pydantic import SecretStr

from notifyq._http.auth import Authenticator
from notifyq._settings import ApiSettings
from notifyq._ui.session import SESSION_S, Sessions, same_csrf

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
NOW = 1_800_000_000.0


def _sessions(admin: str = ADMIN) -> Sessions:
    return Sessions(Authenticator(ApiSettings(admin_token=SecretStr(admin),
                                              read_token=SecretStr(READ))))


def test_a_session_names_its_token_and_holds_neither_token() -> None:
    cookie = _sessions().issue("read", NOW)
    assert ADMIN not in cookie
    assert READ not in cookie
    viewer = _sessions().open(cookie, NOW + 60)
    assert viewer is not None
    assert (viewer.name, viewer.admin) == ("read", False)


def test_a_session_ends_after_its_lifetime_and_never_starts_in_the_future() -> None:
    cookie = _sessions().issue("admin", NOW)
    assert _sessions().open(cookie, NOW + SESSION_S - 1) is not None
    assert _sessions().open(cookie, NOW + SESSION_S) is None
    assert _sessions().open(cookie, NOW - 1) is None


def test_changing_the_token_ends_its_sessions() -> None:
    cookie = _sessions().issue("admin", NOW)
    assert _sessions(admin="another-admin-token-0123456789").open(cookie, NOW) is None


def test_a_cookie_changed_in_any_part_opens_nothing() -> None:
    cookie = _sessions().issue("read", NOW)
    parts = cookie.split(".")
    for i in range(1, 5):
        forged = parts.copy()
        forged[i] = forged[i][:-1] + ("A" if forged[i][-1] != "A" else "B")
        assert _sessions().open(".".join(forged), NOW) is None, i
    for junk in (None, "", "v1", "v2." + ".".join(parts[1:]), "v1.%%%.1.2.3"):
        assert _sessions().open(junk, NOW) is None


def test_each_session_has_its_own_csrf_token() -> None:
    sessions = _sessions()
    first = sessions.open(sessions.issue("admin", NOW), NOW)
    second = sessions.open(sessions.issue("admin", NOW), NOW)
    assert first is not None
    assert second is not None
    assert first.csrf != second.csrf
    assert same_csrf(first.csrf, first.csrf)
    assert not same_csrf(first.csrf, second.csrf)
    assert not same_csrf(first.csrf, None)
