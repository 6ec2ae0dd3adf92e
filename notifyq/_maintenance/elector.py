"""Leader election (every node runs it; one wins): a row in ``leader`` held while unexpired.

The leader renews every ``ttl_s / 3``; if it dies, another node takes over within ``ttl_s``.
Singleton runners (reaper, purger) act only while ``is_leader``.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn, StopGrace
from notifyq._db.queries import Queries
from notifyq._maintenance.runner import every


class Elector:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock, *,
                 leader_id: str, ttl_s: float = 15.0, name: str = "maintenance") -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._db = db
        self._q = queries
        self._clock = clock
        self.leader_id = leader_id
        self.ttl_s = ttl_s
        self.name = name
        self.is_leader = False

    async def run_once(self) -> dict[str, Any]:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.leader_attempt_elect, {
                "now": self._clock.db_now(), "name": self.name, "leader_id": self.leader_id,
                "ttl_s": self.ttl_s})
            won = await cur.fetchone() is not None
        became = won and not self.is_leader
        self.is_leader = won
        return {"elected": int(became)}

    async def run(self, grace: StopGrace | None = None) -> None:
        await every(self.ttl_s / 3, self.run_once, name="elector", grace=grace)

    async def resign(self) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        async with self._db.connection() as conn:
            await conn.execute(self._q.leader_resign, {"name": self.name,
                                                        "leader_id": self.leader_id})
