"""Leader election (every node runs it; one wins): a row in ``leader`` held while unexpired.

The leader renews every ``ttl_s / 3``. The others try as often, and once the leader's row has
less than that left they try again the moment it runs out (``leader_attempt_elect`` tells them
when): a leader that dies is replaced within ``ttl_s`` of its last renewal, so within ``ttl_s``
of its death, and the new leader's singleton runners (reaper, resumer, purger: they act only
while ``is_leader``) run at once (:meth:`Elector.elected`). Before, a follower tried only every
``ttl_s / 3`` and the runners waited for their next tick: a SIGKILLed leader's runs came back
up to ``ttl_s * 4 / 3`` plus a reaper interval after it died (~15 s with the defaults, issue
31; tests/chaos/test_leader_failover.py).
"""

from __future__ import annotations

import random
from typing import Any

import anyio
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn, StopGrace
from notifyq._db.queries import Queries
from notifyq._maintenance.runner import every

EXPIRY_MARGIN_S = 0.01
"""A follower aimed at the leader's expiry tries this much after it: a try that comes first
loses and is made again at once, a round trip later."""


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
        self._next_try_s = ttl_s / 3
        self._became = anyio.Event()

    async def run_once(self) -> dict[str, Any]:
        # Renew (or try) every ttl_s / 3, jittered, and after an error; a follower sooner when
        # the leader's row runs out sooner: the moment it does.
        self._next_try_s = self.ttl_s / 3 * random.uniform(0.9, 1.1)  # noqa: S311
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.leader_attempt_elect, {
                "now": self._clock.db_now(), "name": self.name, "leader_id": self.leader_id,
                "ttl_s": self.ttl_s})
            row = await cur.fetchone()
        won = row is not None and row["won"]
        left = row["expires_in_s"] if row is not None and not won else None
        if left is not None and left + EXPIRY_MARGIN_S < self._next_try_s:
            self._next_try_s = max(0.0, left) + EXPIRY_MARGIN_S
        became = won and not self.is_leader
        self.is_leader = won
        if became:
            self._became.set()
            self._became = anyio.Event()
        return {"elected": int(became)}

    async def elected(self) -> None:
        """Return the next time this node becomes the leader."""
        await self._became.wait()

    async def run(self, grace: StopGrace | None = None) -> None:
        await every(lambda: self._next_try_s, self.run_once, name="elector", grace=grace)

    async def resign(self) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        async with self._db.connection() as conn:
            await conn.execute(self._q.leader_resign, {"name": self.name,
                                                        "leader_id": self.leader_id})
