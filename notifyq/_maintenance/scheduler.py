"""Periodic runs (every node): each schedule enqueues exactly one run per tick cluster-wide.

Ticks are aligned to multiples of ``every`` since the Unix epoch, so all nodes agree on them;
the ``periodic_tick`` primary key lets only the first node's insert (and its enqueue) through.
Every node tries, so a tick is not missed while leadership changes hands.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._enqueue.ids import new_run_id
from notifyq._enqueue.validate import encode_input
from notifyq._registry import PeriodicSpec

log = logging.getLogger("notifyq.scheduler")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAME = re.compile(r"^(?P<job_type>.+)@(?P<ms>[0-9]+)ms$")


def tick_at(now: datetime, every: timedelta) -> datetime:
    """The start of the tick ``now`` falls in."""
    # Integer division is exact; float seconds * 1e6 gives 1000999 µs for 1001 ms.
    step = every // timedelta(microseconds=1)
    micros = (now - EPOCH) // timedelta(microseconds=1)
    return EPOCH + timedelta(microseconds=micros - micros % step)


class Scheduler:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 schedules: list[PeriodicSpec]) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.schedules = schedules

    async def run_once(self) -> dict[str, Any]:
        now = self._clock.now()
        enqueued = 0
        async with self._db.connection() as conn:
            for spec in self.schedules:
                cur = await conn.execute(self._q.periodic_tick_enqueue, {
                    "name": spec.name, "tick_at": tick_at(now, spec.every), "run_id": new_run_id(),
                    "job_type": spec.job_type, "input": encode_input(spec.input)})
                enqueued += len(await cur.fetchall())
        return {"enqueued": enqueued}

    async def run(self) -> None:
        if not self.schedules:
            return
        while True:
            try:
                await self.run_once()
            except psycopg.Error as exc:
                log.warning("periodic enqueue failed (%s); retrying", type(exc).__name__)
                await anyio.sleep(1.0)
                continue
            await anyio.sleep(self._until_next_tick())

    def _until_next_tick(self) -> float:
        now = self._clock.now()
        waits = [(tick_at(now, s.every) + s.every - now).total_seconds() for s in self.schedules]
        return max(0.001, min(waits) + 0.001)


async def schedule_list(conn: AsyncConn, queries: Queries, specs: list[PeriodicSpec],
                        now: datetime) -> list[dict[str, Any]]:
    """Every schedule this process registers or the database has ticks of (a day's worth),
    with its last tick (and that run's status) and its next one. A schedule's name is
    ``job_type@<every>ms``, so its interval is known even when another process registered
    it; ``registered_here`` says whether this one did."""
    cur = await conn.execute(queries.periodic_tick_latest)
    last = {row["name"]: row for row in await cur.fetchall()}
    mine = {spec.name: spec for spec in specs}
    out = []
    for name in sorted(mine.keys() | last.keys()):
        match = _NAME.fullmatch(name)
        every = mine[name].every if name in mine else (
            timedelta(milliseconds=int(match["ms"])) if match else None)
        tick = last.get(name, {})
        out.append({
            "name": name, "job_type": mine[name].job_type if name in mine else (
                match["job_type"] if match else name),
            "every_s": every.total_seconds() if every else None,
            "last_tick_at": tick.get("tick_at"), "last_run_id": tick.get("run_id"),
            "last_status": tick.get("status"),
            "next_tick_at": tick_at(now, every) + every if every else None,
            "registered_here": name in mine})
    return out
