"""The purger (leader-only): deletes finished runs past their retention, in bounded batches,
each its own short transaction, so the claim table stays small."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from notifyq.clock import Clock
from notifyq.db.pool import AsyncConn
from notifyq.db.queries import Queries
from notifyq.settings import PurgerSettings

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
            deleted += batch
            if batch < self.config.batch_size:
                break
        return {"deleted": deleted}
