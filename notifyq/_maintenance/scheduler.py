"""Periodic runs (every node): each schedule enqueues exactly one run per tick cluster-wide.

Ticks are UTC instants every node computes alike (:mod:`notifyq._cadence`: multiples of
``every`` since the epoch, or a cron expression's wall times in a time zone). Each schedule is a
``periodic_schedule`` row, upserted when the scheduler starts; enqueuing a tick moves the row's
``last_tick_at`` forward under its lock, so the first node's enqueue goes through and every
other node's matches nothing, and a paused row matches nothing at all. Every node tries, so a
tick is not missed while leadership changes hands.

Which ticks a pass enqueues, per schedule not paused:

- the latest due tick, if it is at most the cadence's grace old (``every=``: its interval, so a
  starting worker runs the current interval's tick; cron: one minute). An older one was missed.
- with ``catch_up``, also every tick missed since ``last_tick_at`` (never before the last
  resume), oldest first, at most ``CATCH_UP_MAX`` per pass. A schedule that never ticked has
  nothing to catch up.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq._cadence import Cadence, Cron, Every
from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn, StopGrace
from notifyq._db.queries import Queries
from notifyq._enqueue.ids import new_run_id
from notifyq._enqueue.validate import encode_input
from notifyq._errors import ConfigError, ScheduleNotFound
from notifyq._registry import PeriodicSpec

log = logging.getLogger("notifyq.scheduler")

CATCH_UP_MAX = 1000
"""Most missed ticks one pass enqueues for one schedule; the next pass goes on from there."""


def due_ticks(cadence: Cadence, now: datetime, *, last: datetime | None,
              resumed: datetime | None, catch_up: bool) -> list[datetime]:
    """The ticks a pass at ``now`` enqueues, oldest first (a pure function: the DST and
    catch-up tests call it, and so does :meth:`Scheduler.run_once`)."""
    latest = cadence.latest(now)
    if (last is not None and latest <= last) or (resumed is not None and latest < resumed):
        return []  # done already, or fell due while paused
    if not catch_up or last is None:
        return [latest] if now - latest <= cadence.grace else []
    ticks = [latest]
    while len(ticks) < CATCH_UP_MAX:
        earlier = cadence.before(ticks[-1])
        if earlier <= last or (resumed is not None and earlier < resumed):
            break
        ticks.append(earlier)
    return ticks[::-1]


class Scheduler:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 schedules: list[PeriodicSpec]) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.schedules = schedules
        self._registered = False

    async def run_once(self) -> dict[str, Any]:
        """One pass: register the schedules (first pass only), then enqueue each one's due
        ticks. Returns ``{"enqueued": n}``."""
        now = self._clock.now()
        enqueued = 0
        async with self._db.connection() as conn:
            if not self._registered:
                await self._register(conn)
            state = await self._state(conn)
            for spec in self.schedules:
                row = state.get(spec.name)
                if row is None or row["paused_at"] is not None:
                    continue
                for tick in due_ticks(spec.cadence, now, last=row["last_tick_at"],
                                      resumed=row["resumed_at"], catch_up=spec.catch_up):
                    enqueued += await self._enqueue(conn, spec, tick)
        return {"enqueued": enqueued}

    async def _register(self, conn: AsyncConn) -> None:
        async with conn.transaction():
            for spec in self.schedules:
                await conn.execute(self._q.periodic_schedule_register, spec.definition())
        self._registered = True

    async def _state(self, conn: AsyncConn) -> dict[str, dict[str, Any]]:
        cur = await conn.execute(self._q.periodic_schedule_state,
                                 {"names": [s.name for s in self.schedules]})
        return {row["name"]: row for row in await cur.fetchall()}

    async def _enqueue(self, conn: AsyncConn, spec: PeriodicSpec, tick: datetime) -> int:
        cur = await conn.execute(self._q.periodic_tick_enqueue, {
            "name": spec.name, "tick_at": tick, "run_id": new_run_id(),
            "job_type": spec.job_type, "input": encode_input(spec.input)})
        return len(await cur.fetchall())

    async def run(self, grace: StopGrace | None = None) -> None:
        if not self.schedules:
            return
        grace = grace or StopGrace()
        while True:
            try:
                with grace.finishing():
                    await self.run_once()
            except psycopg.Error as exc:
                log.warning("periodic enqueue failed (%s); retrying", type(exc).__name__)
                await anyio.sleep(1.0)
                continue
            await anyio.sleep(self._until_next_tick())

    def _until_next_tick(self) -> float:
        now = self._clock.now()
        waits = [(s.cadence.after(now) - now).total_seconds() for s in self.schedules]
        return max(0.001, min(waits) + 0.001)


async def schedule_list(conn: AsyncConn, queries: Queries, specs: list[PeriodicSpec],
                        now: datetime) -> list[dict[str, Any]]:
    """Every schedule in the database and those of ``specs`` not registered yet (their worker
    has not started), with the last tick (its run and that run's status) and the next tick
    (None while paused). ``registered_here`` says whether ``specs`` declares it."""
    cur = await conn.execute(queries.periodic_schedule_list)
    stored = {row["name"]: row for row in await cur.fetchall()}
    mine = {spec.name: spec for spec in specs}
    out = []
    for name in sorted(stored.keys() | mine.keys()):
        row = stored.get(name) or {**mine[name].definition(), "paused_at": None,
                                   "last_tick_at": None, "last_run_id": None,
                                   "last_status": None}
        cadence = mine[name].cadence if name in mine else _readable(row)
        out.append({
            "name": name, "job_type": row["job_type"],
            "every_s": row["every_ms"] / 1000 if row["every_ms"] is not None else None,
            "cron": row["cron"], "tz": row["tz"], "catch_up": row["catch_up"],
            "paused": row["paused_at"] is not None, "paused_at": row["paused_at"],
            "last_tick_at": row["last_tick_at"], "last_run_id": row["last_run_id"],
            "last_status": row["last_status"],
            "next_tick_at": cadence.after(now) if cadence and not row["paused_at"] else None,
            "registered_here": name in mine})
    return out


def _readable(row: dict[str, Any]) -> Cadence | None:
    """A stored schedule's cadence; None when this host cannot read it (a time zone missing
    from its tz database)."""
    try:
        if row["cron"] is not None:
            return Cron(row["cron"], row["tz"])
        return Every(timedelta(milliseconds=row["every_ms"]))
    except ConfigError:
        return None


async def schedule_pause(conn: AsyncConn, queries: Queries, name: str,
                         now: datetime | None) -> dict[str, Any]:
    cur = await conn.execute(queries.periodic_schedule_pause, {"name": name, "now": now})
    return _found(await cur.fetchone(), name)


async def schedule_resume(conn: AsyncConn, queries: Queries, name: str,
                          now: datetime | None) -> dict[str, Any]:
    cur = await conn.execute(queries.periodic_schedule_resume, {"name": name, "now": now})
    return _found(await cur.fetchone(), name)


async def schedule_trigger(conn: AsyncConn, queries: Queries, name: str) -> dict[str, Any]:
    """One run of the schedule now, with its stored input, outside its cadence (its next tick
    still comes when due): ``{"name", "run_id"}``."""
    cur = await conn.execute(queries.periodic_schedule_trigger,
                             {"name": name, "run_id": new_run_id()})
    row = _found(await cur.fetchone(), name)
    if not row["known"]:
        raise ConfigError(f"schedule {name!r} was registered by an older notifyq that did not "
                          "store its input: start a worker that declares it, then trigger it")
    return {"name": row["name"], "run_id": row["run_id"]}


def _found(row: dict[str, Any] | None, name: str) -> dict[str, Any]:
    if row is None:
        raise ScheduleNotFound(f"no periodic schedule named {name!r}: `notifyq schedules list` "
                               "shows them")
    return row
