"""The purger's tick (leader-only maintenance), run once against a real database with a moved
clock: finished runs past retention, queued signals past theirs, and late definitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from notifyq import App, ManualClock
from notifyq._maintenance.purger import Purger
from tests.integration.inproc import fetch, scalar

pytestmark = pytest.mark.anyio


async def test_a_purger_tick_expires_unreceived_signals_and_applies_late_definitions(
        app: App) -> None:
    run = await app.enqueue("late.type", {})  # no definition yet: the table defaults
    assert await app.signal("nobody.waits", {"n": 1}) == 0
    await fetch(app, "INSERT INTO notifyq.job (type, max_attempts, timeout_s) "
                     "VALUES ('late.type', 3, 7.5) RETURNING type")
    clock = ManualClock(datetime.now(UTC))
    purger = Purger(await app.pool(), app._runtime.queries, clock, app.settings.purger)
    assert await purger.run_once() == {"deleted": 0, "signals_expired": 0,
                                       "defaults_applied": 1}
    stored = await app.get_run(run.id)
    assert (stored.max_attempts, stored.timeout_s) == (3, 7.5)
    clock.advance(timedelta(days=7, minutes=1))  # purger.signal_retention_s: 7 days
    assert await purger.run_once() == {"deleted": 0, "signals_expired": 1,
                                       "defaults_applied": 0}
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_signal") == 0


async def test_a_purger_tick_deletes_portal_links_and_sessions_expired_a_day_ago(app: App) -> None:
    await fetch(app, "INSERT INTO notifyq.portal_link (code_hash, tenant_id, expires_at) "
                     "VALUES (sha256('old'), 'acme', now() - interval '25 hours'), "
                     "(sha256('new'), 'acme', now() + interval '10 minutes') RETURNING 1")
    await fetch(app, "INSERT INTO notifyq.portal_session (cookie_hash, tenant_id, expires_at) "
                     "VALUES (sha256('old'), 'acme', now() - interval '25 hours'), "
                     "(sha256('new'), 'acme', now() + interval '1 hour') RETURNING 1")
    purger = Purger(await app.pool(), app._runtime.queries, ManualClock(datetime.now(UTC)),
                    app.settings.purger)
    await purger.run_once()
    for table in ("portal_link", "portal_session"):
        assert await scalar(app, f"SELECT count(*) FROM notifyq.{table}") == 1, table
        assert await scalar(app, f"SELECT count(*) FROM notifyq.{table} "
                                 "WHERE expires_at > now()") == 1, table
