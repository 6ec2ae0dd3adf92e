"""The ``/v1`` routes refuse to run against a schema this notifyq does not match.

Against an unmigrated database every query would fail on a missing table (a 500 with a
traceback); a schema migrated by a newer notifyq may have moved on. Both are a 503
problem+json instead, saying what to run, until the schema is current.
"""

from __future__ import annotations

from notifyq._app import App
from notifyq._db import migrate as migrations


class SchemaGate:
    """A FastAPI dependency (after authentication): raises :class:`SchemaError` (503) while the
    schema is behind or ahead. Once it has seen the schema current it stops asking, since
    migrations only move forward: two queries per request until then, none after."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._current = False

    async def __call__(self) -> None:
        if self._current:
            return
        async with (await self._app.pool()).connection() as conn:
            await migrations.require_current(conn, self._app.settings.schema_name)
        self._current = True
