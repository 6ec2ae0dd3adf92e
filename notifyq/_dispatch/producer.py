"""Claiming: one producer per pool.

A producer claims as many runs as there are free slots, at most half of all of them
(``FOR UPDATE SKIP LOCKED``, in the completer's next statement, together with the write-backs
queued by then) and keeps claiming while batches come back full: the completer queues the next
claim itself as a full batch comes back (:attr:`Claim.then`). Slots count claim-ahead too: a
worker holds up to ``concurrency + prefetch`` claimed runs (prefetch sized by
:mod:`~notifyq._dispatch.claim_ahead`), so a handler slot that frees up starts its next run
from the buffer without waiting for a round trip. When the pool is empty it sleeps until the
first of: a NOTIFY for its pool, the jittered poll interval, or the earliest scheduled
``run_at`` — so a scheduled run starts on time, not at the next poll.

A NOTIFY never waits for the producer's other statements (bench/wake_steps.py, a 2,000 runs/s
load of batches of 20 and a probe run every 20-50 ms; bench/RESULTS.md, 2026-12-06):

- the earliest ``run_at`` is asked for (``job_run_next_run_at``) beside the idle wait, by a
  task of the producer's own, not before it: a NOTIFY that came meanwhile waited for the
  answer, and under load a producer asks after nearly every claim (enqueue to claim request
  p99 3.5-4.0 -> 2.1-2.4 ms);
- a NOTIFY that comes while the producer's claim is on its way (sent before the new run
  committed, so blind to it) is claimed beside it, on another completer lane, instead of after
  its answer (:meth:`Producer.notified`; enqueue to claim request p90 1.7-2.0 -> 0.5-0.8
  ms).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn, StopGrace
from notifyq._db.queries import Queries
from notifyq._dispatch.completer import Claim, Completer
from notifyq._errors import CompleterClosedError

log = logging.getLogger("notifyq.producer")

CLAIM_MAX = 1000


class Slots:
    """The worker's claim slots (busy handlers plus claimed-ahead runs), shared by its
    producers. ``sizer`` (the worker's :class:`~notifyq._dispatch.claim_ahead.ClaimAhead`)
    says how many there are, asked at each :meth:`take`: a smaller number takes effect as held
    runs finish (``free`` may go below zero meanwhile), a larger one at once."""

    def __init__(self, size: int, sizer: Callable[[], int] | None = None) -> None:
        self.size = size
        self.free = size
        self._sizer = sizer
        self._freed = anyio.Event()

    def take(self, limit: int) -> int:
        """Take up to ``limit`` free slots for a claim, and at most half of them: the other
        half holds the batch the handlers run while this claim is in flight (a claim of every
        slot leaves none for the next one until the batch has run, and the worker falls back
        to handlers and server taking turns; see notifyq/_dispatch/completer.py)."""
        if self._sizer is not None:
            self.resize(self._sizer())
        n = max(0, min(self.free, limit, (self.size + 1) // 2))
        self.free -= n
        return n

    def give(self, n: int) -> None:
        if n:
            self.free += n
            self._freed.set()

    def resize(self, size: int) -> None:
        if size != self.size:
            self.free += size - self.size
            self.size = size
            if self.free > 0:
                self._freed.set()

    async def wait_free(self) -> None:
        while self.free <= 0:
            # A fresh event only when a producer has to wait, not one per give (one per run,
            # ~1.3 us each: anyio looks up the event loop's backend for every new Event).
            if self._freed.is_set():
                self._freed = anyio.Event()
            await self._freed.wait()

    @property
    def busy(self) -> int:
        return self.size - self.free


class Producer:
    def __init__(self, pool_name: str, *, db: AsyncConnectionPool[AsyncConn], queries: Queries,
                 clock: Clock, slots: Slots, completer: Completer,
                 poll_interval_s: float, start: Callable[[dict[str, Any]], None],
                 burst: bool = False, grace: StopGrace | None = None,
                 idle: Callable[[], bool] | None = None) -> None:
        self.pool_name = pool_name
        self._db = db
        self._q = queries
        self._clock = clock
        self._slots = slots
        self._completer = completer
        self._poll_interval_s = poll_interval_s
        self._start = start
        self._burst = burst
        self._grace = grace or StopGrace()
        self._idle_now = idle or (lambda: slots.busy == 0)
        """The worker holds no run (none buffered, running or being written back)."""
        self._wake = anyio.Event()
        self._ask = anyio.Event()
        """Set when the producer goes idle: :meth:`_watch_next_run` asks for the next run."""
        self._waiting: anyio.CancelScope | None = None
        """The idle wait, while the producer is in it: its deadline is the next run's."""
        self._current: Claim | None = None
        """The claim the producer awaits."""
        self._beside: Claim | None = None
        """A claim sent beside :attr:`_current` (:meth:`notified`), until it is settled."""
        self.keyed = False
        """Also claim runs with a concurrency key or a rate limit (set when a handler of this
        pool has a ConcurrencyPolicy or a RateLimit): they are left out of the plain claim."""
        self.fair = False
        """Claim round-robin across tenants (``worker.fair_pools``)."""
        self.claimed = 0
        self.claims = 0

    def wake(self) -> None:
        self._wake.set()

    def notified(self) -> None:
        """A NOTIFY for the pool: wake the producer, and when its claim is already on its way
        (sent before the new run committed, so blind to it) claim beside it at once, on
        another completer lane, instead of after its answer. At most one such claim at a
        time; its unused slots go back when it is answered, and a full one wakes the producer
        for more."""
        self.wake()
        current = self._current
        if (self._burst or self._beside is not None or current is None or not current.sent
                or current.done.is_set()):
            return
        beside = Claim(self.pool_name, self.keyed, self.fair, self._take, self._start,
                       settle=self._settle_beside)
        try:
            self._completer.add(beside)
        except CompleterClosedError:
            return
        self._beside = beside

    def _settle_beside(self, claim: Claim) -> None:
        self._beside = None
        self._slots.give(claim.want - claim.got)
        if claim.want and claim.got == claim.want:
            self.wake()  # a full batch: there may be more

    async def run(self) -> None:
        if self._burst:  # never idle: nothing to ask
            await self._claim()
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_next_run)
            await self._claim()

    async def _claim(self) -> None:
        backoff = 0.05
        request: Claim | None = None
        try:
            while True:
                if request is None:
                    await self._slots.wait_free()
                    request = Claim(self.pool_name, self.keyed, self.fair, self._take,
                                    self._start, idle=self._idle_now())
                self._wake = anyio.Event()  # before claiming: a NOTIFY from now on is not lost
                self._current = request
                try:
                    await self._completer.claim(request)
                except psycopg.OperationalError as exc:
                    self._slots.give(request.want)
                    request = None
                    log.warning("claim failed (%s); retrying in %.2f s", type(exc).__name__,
                                backoff)
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                backoff = 0.05
                # The next claim, when the completer queued one after a full batch.
                done, request = request, request.then
                if not done.want:
                    continue  # another pool's claim took the free slots first
                self._slots.give(done.want - done.got)
                self.claims += 1
                self.claimed += done.got
                if done.got == done.want:
                    continue  # the batch was full: there may be more
                if done.got:
                    # Let the handlers start before the next run is asked for (the statement
                    # _idle has sent): claim -> handler start at idle, p50 0.39 -> 0.23 ms.
                    await anyio.lowlevel.checkpoint()
                if self._burst:
                    if not done.got and self._slots.busy == 0:
                        return
                    with anyio.move_on_after(0.05):
                        await self._wake.wait()
                    continue
                await self._idle()
        finally:
            # Stopped with a claim the completer queued and nobody awaits: it must not be sent.
            for queued in (request, self._beside):
                if queued is not None and not queued.done.is_set():
                    queued.abandoned = True

    def _take(self) -> int:
        return self._slots.take(CLAIM_MAX)

    async def _idle(self) -> None:
        """Wait for a wake-up, the jittered poll interval or the next scheduled run, whichever
        comes first; the next run is asked for meanwhile (:meth:`_watch_next_run`)."""
        if self._wake.is_set():  # a NOTIFY came while the claim was in flight
            return
        timeout = self._poll_interval_s * random.uniform(0.9, 1.1)  # noqa: S311
        with anyio.move_on_after(timeout) as waiting:
            self._waiting = waiting
            self._ask.set()
            try:
                await self._wake.wait()
            finally:
                self._waiting = None

    async def _watch_next_run(self) -> None:
        """Each time the producer goes idle, ask when the pool's next scheduled run is due and
        end the idle wait then. An answer that comes after the producer woke and went idle
        again still holds for the new wait (it can only end it early, which costs one claim
        that finds nothing), and the new wait's own question follows."""
        while True:
            await self._ask.wait()
            self._ask = anyio.Event()
            delay = await self._next_run_delay_s()
            waiting = self._waiting
            if delay is not None and waiting is not None:
                waiting.deadline = min(waiting.deadline, anyio.current_time() + max(0.0, delay))

    async def _next_run_delay_s(self) -> float | None:
        with self._grace.finishing():  # a stop often finds this query in flight
            try:
                async with self._db.connection() as conn:
                    cur = await conn.execute(self._q.job_run_next_run_at, {
                        "pool": self.pool_name, "now": self._clock.db_now()})
                    row = await cur.fetchone()
            except psycopg.OperationalError:
                return None
            return row["delay_s"] if row else None
        return None  # stopping, and the query outlived the grace
