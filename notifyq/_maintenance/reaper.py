"""The reaper (leader-only): runs whose lease expired — their worker died or hung without
heartbeating — go back to ``pending`` (or to ``failed`` when out of attempts).

Expiry is re-checked inside the UPDATE, so a heartbeat that commits first keeps the run.
Reaped runs' pools get a NOTIFY so an idle worker picks them up at once. The registry rows of
workers that stopped heartbeating go too, and the key holders' rows of processes that stopped
checking their keys.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._notifier import wake_payload
from notifyq._settings import ReaperSettings


class Reaper:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 config: ReaperSettings) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.config = config

    async def run_once(self) -> dict[str, Any]:
        counts = {"pending": 0, "failed": 0, "canceled": 0}
        while True:
            async with self._db.connection() as conn:
                cur = await conn.execute(self._q.job_run_reap_expired, {
                    "now": self._clock.db_now(), "limit": self.config.batch_size})
                rows = await cur.fetchall()
                pools = {r["pool"] for r in rows if r["status"] == "pending"}
                if pools:
                    await conn.execute(self._q.job_run_notify, {
                        "channel": self._q.schema, "payloads": [wake_payload(p) for p in pools]})
            for row in rows:
                counts[row["status"]] += 1
            if len(rows) < self.config.batch_size:
                break
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.worker_reap_expired, {"now": self._clock.db_now()})
            counts["workers"] = len(await cur.fetchall())
            cur = await conn.execute(self._q.key_holder_reap_expired,
                                     {"now": self._clock.db_now()})
            counts["key_holders"] = len(await cur.fetchall())
        return counts
