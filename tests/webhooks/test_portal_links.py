"""``app.webhooks.portal`` from Python: minting a link (its address, its lifetime, its tenant),
redeeming it once into a session, opening and ending that session (the pages over HTTP:
tests/ui/test_portal.py)."""

from __future__ import annotations

from datetime import datetime

import pytest

from notifyq import App
from notifyq._errors import InvalidEndpoint
from tests.webhooks.conftest import webhook_settings

pytestmark = pytest.mark.anyio


async def test_a_link_is_a_path_unless_a_base_or_the_portal_url_is_given(wapp: App,
                                                                         dsn: str) -> None:
    link = await wapp.webhooks.portal.mint("acme")
    assert link.url.startswith("/portal/link#")
    assert link.url.split("#")[1] not in repr(link)  # the code stays out of reprs and logs
    based = await wapp.webhooks.portal.mint("acme", base_url="https://hooks.example.com/")
    assert based.url.startswith("https://hooks.example.com/portal/link#")
    settings = webhook_settings(dsn, portal_url="https://portal.example.com/notifyq",
                                portal_link_ttl_s=60)
    async with App(settings=settings) as configured:
        link = await configured.webhooks.portal.mint("acme", read_only=True)
        assert link.url.startswith("https://portal.example.com/notifyq/portal/link#")
        assert link.read_only is True
        assert 59 <= (link.expires_at - (await _now(configured))).total_seconds() <= 60


async def _now(app: App) -> datetime:
    async with (await app.pool()).connection() as conn:
        row = await (await conn.execute("SELECT now() AS now")).fetchone()
        assert row is not None
        moment: datetime = row["now"]
        return moment


async def test_a_link_needs_a_tenant_and_a_short_life(wapp: App) -> None:
    for tenant, ttl in (("", 60.0), ("t" * 513, 60.0), ("acme", 5.0), ("acme", 86_401.0)):
        with pytest.raises(InvalidEndpoint):
            await wapp.webhooks.portal.mint(tenant, ttl_s=ttl)


async def test_a_link_is_redeemed_once_into_a_session_that_ends_on_sign_out(wapp: App) -> None:
    portal = wapp.webhooks.portal
    link = await portal.mint("acme")
    code = link.url.split("#")[1]
    started = await portal.redeem(code)
    assert started is not None
    cookie, session = started
    assert (session.tenant_id, session.read_only, session.token_name) == ("acme", False, None)
    assert await portal.redeem(code) is None
    opened = await portal.open(cookie)
    assert opened is not None
    assert opened.csrf == session.csrf
    assert opened.csrf not in (cookie, code)
    await portal.end(cookie)
    assert await portal.open(cookie) is None
    assert await portal.open(None) is None
    token_cookie, by_token = await portal.start("acme", read_only=True, token_name="acme-read")
    assert (by_token.read_only, by_token.token_name) == (True, "acme-read")
    assert await portal.open(token_cookie) is not None
