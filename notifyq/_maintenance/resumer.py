"""The resumer (leader-only): waiting runs whose wait is over go back in line — a durable sleep
that has elapsed, a wait deadline that has passed (the replay then ends the run ``timed_out``),
or a signal that arrived while its run was still deciding to wait. Children wake their parent
themselves (see the ``job_run_finished`` trigger); this runner is not on that path.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._notifier import wake_payload
from notifyq._settings import ResumerSettings


class Resumer:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 config: ResumerSettings) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.config = config

    async def run_once(self) -> dict[str, Any]:
        resumed = 0
        while True:
            async with self._db.connection() as conn, conn.transaction():
                cur = await conn.execute(self._q.job_run_resume_due, {
                    "now": self._clock.db_now(), "limit": self.config.batch_size})
                rows = await cur.fetchall()
                if rows:
                    await conn.execute(self._q.job_run_notify, {
                        "channel": self._q.schema,
                        "payloads": sorted({wake_payload(r["pool"]) for r in rows})})
            resumed += len(rows)
            if len(rows) < self.config.batch_size:
                return {"resumed": resumed}
