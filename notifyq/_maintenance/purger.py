"""The purger (leader-only): deletes finished runs past their retention, and queued signals
nobody waited for past theirs, in bounded batches, each its own short transaction, so the claim
table stays small. It also gives runs enqueued while their type had no definition that
definition's defaults, for the enqueues that committed just after a worker upserted it (the
worker applies them at its start). A pass that deleted anything is recorded as a
``retention.purged`` operator event (see :mod:`notifyq._maintenance.announcer`)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._settings import PurgerSettings

MAX_BATCHES_PER_TICK = 50


class Purger:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 config: PurgerSettings) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.config = config

    async def run_once(self) -> dict[str, Any]:
        deleted = 0
        for _ in range(MAX_BATCHES_PER_TICK):
            async with self._db.connection() as conn:
                cur = await conn.execute(self._q.job_run_purge_finished, {
                    "now": self._clock.db_now(), "limit": self.config.batch_size,
                    "completed_retention_s": self.config.completed_retention_s,
                    "failed_retention_s": self.config.failed_retention_s,
                    "canceled_retention_s": self.config.canceled_retention_s})
                batch = cur.rowcount
                if batch < self.config.batch_size:
                    await conn.execute(self._q.periodic_tick_prune, {"now": self._clock.db_now()})
                    await conn.execute(self._q.rate_window_prune, {"now": self._clock.db_now()})
                    # The customer portal's links and sessions expired a day ago (minting a
                    # link prunes them too; a portal nobody mints for any more still empties).
                    await conn.execute(self._q.portal_link_purge, {"now": self._clock.db_now()})
            deleted += batch
            if batch < self.config.batch_size:
                break
        counts = {"deleted": deleted, "signals_expired": await self._expire_signals(),
                  "defaults_applied": await self._apply_definitions()}
        if counts["deleted"] or counts["signals_expired"]:
            await self._record(counts)
        return counts

    async def _record(self, counts: dict[str, int]) -> None:
        detail = {"runs_deleted": counts["deleted"], "signals_expired": counts["signals_expired"],
                  "completed_retention_s": self.config.completed_retention_s,
                  "failed_retention_s": self.config.failed_retention_s,
                  "canceled_retention_s": self.config.canceled_retention_s}
        async with self._db.connection() as conn:
            await conn.execute(self._q.operator_event_record, {
                "kind": "retention.purged", "endpoint_id": None, "detail": Jsonb(detail),
                "dedupe_key": None, "now": self._clock.db_now()})

    async def _expire_signals(self) -> int:
        expired = 0
        for _ in range(MAX_BATCHES_PER_TICK):
            async with self._db.connection() as conn:
                cur = await conn.execute(self._q.job_signal_purge_expired, {
                    "now": self._clock.db_now(), "limit": self.config.batch_size,
                    "retention_s": self.config.signal_retention_s})
            expired += cur.rowcount
            if cur.rowcount < self.config.batch_size:
                break
        return expired

    async def _apply_definitions(self) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.job_run_apply_definitions, {
                "now": self._clock.db_now(), "channel": self._q.schema})
            return sum(int(row["runs"]) for row in await cur.fetchall())
