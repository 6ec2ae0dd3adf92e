"""The retainer (leader-only): webhook history kept without bloat. Each pass makes
``webhook_attempt``'s daily partitions ahead (``webhooks.partitions_ahead_days``), drops the
partitions older than ``webhooks.attempt_retention_s`` (a dropped file, no DELETE, no vacuum
debt), deletes what the default partition holds past that, and drops the payloads of messages
past their retention (``webhooks.payload_retention_s``) in batches, each its own short
transaction. It runs on every leader, webhooks enabled or not: another process may deliver
them, and its attempts need their partitions. Figures: bench/retention.py, bench/RESULTS.md."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._settings import PurgerSettings, WebhookSettings

MAX_BATCHES_PER_TICK = 50
PARTITIONS_DROPPED_PER_TICK = 31


class Retainer:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 config: WebhookSettings, purger: PurgerSettings) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.config = config
        self.batch_size = purger.batch_size

    async def run_once(self) -> dict[str, Any]:
        made, dropped = await self._partitions()
        return {"partitions_made": made, "partitions_dropped": dropped,
                "default_deleted": await self._batches(self._q.webhook_attempt_purge_default,
                                                       self.config.attempt_retention_s),
                "payloads_dropped": await self._batches(self._q.webhook_message_drop_payloads,
                                                        self.config.payload_retention_s)}

    async def _partitions(self) -> tuple[int, int]:
        now = self._clock.db_now()
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.webhook_attempt_partitions_make, {
                "now": now, "days": self.config.partitions_ahead_days})
            row = await cur.fetchone()
            made = int(row["made"]) if row else 0
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.webhook_attempt_partitions_drop, {
                "now": now, "retention_s": self.config.attempt_retention_s,
                "limit": PARTITIONS_DROPPED_PER_TICK})
            dropped = len(await cur.fetchall())
        return made, dropped

    async def _batches(self, query: Any, retention_s: float) -> int:
        done = 0
        for _ in range(MAX_BATCHES_PER_TICK):
            async with self._db.connection() as conn:
                cur = await conn.execute(query, {
                    "now": self._clock.db_now(), "retention_s": retention_s,
                    "limit": self.batch_size})
            done += cur.rowcount
            if cur.rowcount < self.batch_size:
                break
        return done
