"""A worker process's runtime: producers, handler slots, heartbeat, completer, listener and
maintenance in one structured task tree.

Handlers run in ``concurrency`` long-lived slot tasks that take claimed runs from a ready
buffer, instead of one task per run: anyio's ``start_soon`` and the task's scope cost 16-55 us
of the ~160-200 us of Python per no-op run at concurrency 10 then (2 cores; ~55-90 us since,
CHANGELOG.md "Worker CPU per run"). Each run still has its own cancel scope (cancel requests,
lost leases, shutdown) and its timeout.

The worker claims ahead: up to ``prefetch`` runs beyond the busy slots wait in the buffer,
leased and heartbeated like running ones, so a slot that frees up starts its next run at once
while the completer's next statement writes the finished ones back and claims more. How many is
:class:`~notifyq._dispatch.claim_ahead.ClaimAhead`'s: ``worker.prefetch``, or by default as
many as the handlers could finish in three claim round trips. The runs of a full batch start
when the completer has sent its next statement (:meth:`Worker._wake_slots`, its
``on_release``), so the handlers run while that statement is in flight
(notifyq/_dispatch/completer.py).

Shutdown (the caller's scope is cancelled, e.g. on SIGTERM): producers and maintenance stop at
once; claimed-ahead runs that never started are released at once; running handlers get
``shutdown_grace_s`` to finish; the rest are cancelled and their runs released (back to
``pending``, the attempt not counted); the completer drains; then everything closes. The
shutdown work runs shielded, bounded by the grace period plus a write deadline.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import socket
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import anyio
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn, StopGrace
from notifyq._db.queries import Queries
from notifyq._dispatch.claim_ahead import ClaimAhead
from notifyq._dispatch.completer import Completer
from notifyq._dispatch.executor import Execution, Executor
from notifyq._dispatch.lock_waiter import LockWaiter
from notifyq._dispatch.producer import Producer, Slots
from notifyq._maintenance.announcer import Announcer
from notifyq._maintenance.elector import Elector
from notifyq._maintenance.purger import Purger
from notifyq._maintenance.reaper import Reaper
from notifyq._maintenance.resumer import Resumer
from notifyq._maintenance.retainer import Retainer
from notifyq._maintenance.runner import every
from notifyq._maintenance.scheduler import Scheduler
from notifyq._notifier import Notifier
from notifyq._registry import Registry
from notifyq._settings import Settings
from notifyq._version import VERSION

log = logging.getLogger("notifyq.worker")

FINAL_WRITE_DEADLINE_S = 15.0


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _FrozenHeap:
    """The process's heap kept out of the collector's full collections while a worker runs
    (``worker.freeze_heap``; the garbage collector is the process's, so the count is too).

    A run held by the worker (its row, execution, outcome and callbacks) lives for three
    statement round trips: it outlives the young generations, and its objects, promoted to
    the old one, trigger a full collection about every 16k of them, each walking every object
    of the process (~64k after ``import notifyq``, 42 ms on the 2-core VM). A larger
    claim-ahead window (a higher concurrency) holds more runs, so more of them are promoted:
    drain of 20,000 no-op runs, 3 full collections at concurrency 10 and 4 at 100, 122-193 ms
    of CPU, against 1-5 ms with the heap frozen (bench/RESULTS.md, 2026-12-07). ``freeze``
    and ``unfreeze`` splice the collector's lists, whatever their length."""

    holders = 0

    @classmethod
    @contextmanager
    def held(cls) -> Iterator[None]:
        if cls.holders == 0:
            gc.freeze()
        cls.holders += 1
        try:
            yield
        finally:
            cls.holders -= 1
            if cls.holders == 0:
                gc.unfreeze()


class Worker:
    def __init__(self, *, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 settings: Settings, registry: Registry, listen_dsn: str | None,
                 concurrency: int, pools: list[str], burst: bool = False,
                 maintenance: bool = True, retry_shares: dict[str, float] | None = None) -> None:
        self.id = new_worker_id()
        self.retry_slots = {pool: max(1, int(concurrency * share))
                            for pool, share in (retry_shares or {}).items() if pool in pools}
        """Per pool: how many of its runs this worker lets be retries at once (registered; the
        keyed claim keeps to it, migration 0027). A pool not here has no such cap."""
        self._db = db
        self._q = queries
        self._clock = clock
        self._settings = settings
        self._registry = registry
        self._burst = burst
        self._pools = pools
        self._concurrency = concurrency
        cfg = settings.worker
        self.concurrency = concurrency
        self.grace = StopGrace()
        """What a stop lets finish: the producers' and the periodic tasks' statements."""
        self.claim_ahead = ClaimAhead(concurrency, cfg.prefetch)
        self.lock_waiter = LockWaiter(db, queries)
        self.slots = Slots(self.claim_ahead.slots(), self.claim_ahead.slots)
        self.completer = Completer(db, queries, clock, batch_max=cfg.completer_batch_max,
                                   on_written=self._on_written, worker_id=self.id,
                                   lease_s=cfg.lease_s, dsn=settings.database_url,
                                   on_statement=self.claim_ahead.statement,
                                   on_release=self._wake_slots,
                                   lanes=cfg.completer_connections,
                                   prepare=not settings.database_transaction_pooling,
                                   lock_waiter=self.lock_waiter)
        self.executor = Executor(registry, self.completer, clock,
                                 thread_limiter=anyio.CapacityLimiter(concurrency), db=db,
                                 queries=queries)
        self.producers = {
            pool: Producer(pool, db=db, queries=queries, clock=clock, slots=self.slots,
                           completer=self.completer, poll_interval_s=cfg.poll_interval_s,
                           start=self._start, burst=burst, grace=self.grace,
                           idle=lambda: not self.active)
            for pool in pools
        }
        for pool in registry.keyed_pools() & set(self.producers):
            self.producers[pool].keyed = True
        for pool in set(cfg.fair_pools) & set(self.producers):
            self.producers[pool].fair = True
        self.notifier = Notifier(listen_dsn, queries) if (listen_dsn and cfg.listen) else None
        if self.notifier is not None:
            self.notifier.subscribe(self._on_notification)
            self.notifier.on_connect(self._wake_all)
        self.elector = Elector(db, queries, clock, leader_id=self.id,
                               ttl_s=settings.leader.ttl_s)
        self.reaper = Reaper(db, queries, clock, settings.reaper)
        self.purger = Purger(db, queries, clock, settings.purger)
        self.retainer = Retainer(db, queries, clock, settings.webhooks, settings.purger)
        self.resumer = Resumer(db, queries, clock, settings.resumer)
        self.announcer = Announcer(db, queries, clock, settings.webhooks)
        self.scheduler = Scheduler(db, queries, clock, registry.periodic)
        self._maintenance = maintenance and not burst
        self.active: dict[UUID, Execution] = {}
        """Every claimed run this worker holds: buffered, running or being written back."""
        self._ready: deque[Execution] = deque()
        self._prefetch = {spec.job_type: spec.prefetch for spec in registry.specs()
                          if spec.prefetch is not None}
        self._idle_slots: deque[anyio.Event] = deque()
        self._waking = 0
        """Slots woken that have not taken a run yet (at most one: see :meth:`_wake_slots`)."""
        self._writing = 0
        self._extending: set[UUID] = set()
        """Runs whose lease is being extended alone, waiting for their row's lock."""
        self._handlers: anyio.abc.TaskGroup | None = None
        self._stopping = anyio.Event()
        self._idle = anyio.Event()
        self.started = anyio.Event()

    async def run(self) -> None:
        """Run until cancelled (or, in burst mode, until nothing is runnable)."""
        if not self._settings.worker.freeze_heap:
            await self._run()
            return
        with _FrozenHeap.held():
            await self._run()

    async def _run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve)
            try:
                await self._stopping.wait()
            finally:
                self._stopping.set()

    def stop(self) -> None:
        self._stopping.set()

    async def _serve(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._register()
                async with anyio.create_task_group() as core:
                    core.start_soon(self.completer.run)
                    core.start_soon(self._heartbeat)
                    if self.notifier is not None:
                        await core.start(self.notifier.run)
                    async with anyio.create_task_group() as handlers:
                        self._handlers = handlers
                        for slot in range(self.concurrency):
                            handlers.start_soon(self._slot, name=f"slot {slot}")
                        await self._fetch_until_stopped()
                        await self._drain()
                        handlers.cancel_scope.cancel()  # the slots, idle by now
                    self.completer.close()
                    core.cancel_scope.cancel()  # completer.run has returned; stop the rest
            finally:
                self._stopping.set()
                with anyio.move_on_after(2):
                    await self._resign()

    async def _fetch_until_stopped(self) -> None:
        async with anyio.create_task_group() as fetchers:
            fetchers.start_soon(self._cancel_on_stop, fetchers.cancel_scope)
            if self._maintenance:
                fetchers.start_soon(self.elector.run, self.grace)
                fetchers.start_soon(self._run_if_leader, self.reaper.run_once,
                                    self._settings.reaper.interval_s, "reaper",
                                    self._settings.reaper.enabled)
                fetchers.start_soon(self._run_if_leader, self.resumer.run_once,
                                    self._settings.resumer.interval_s, "resumer",
                                    self._settings.resumer.enabled)
                fetchers.start_soon(self._run_if_leader, self.purger.run_once,
                                    self._settings.purger.interval_s, "purger",
                                    self._settings.purger.enabled, False)
                fetchers.start_soon(self._run_if_leader, self.announcer.run_once,
                                    self._settings.webhooks.operator_events_interval_s,
                                    "announcer", True, False)
                fetchers.start_soon(self._run_if_leader, self.retainer.run_once,
                                    self._settings.purger.interval_s, "retainer",
                                    self._settings.purger.enabled)
                fetchers.start_soon(self.scheduler.run, self.grace)
            self.started.set()
            async with anyio.create_task_group() as producers:
                for producer in self.producers.values():
                    producers.start_soon(producer.run)
            fetchers.cancel_scope.cancel()  # burst mode: producers ran dry

    async def _cancel_on_stop(self, scope: anyio.CancelScope) -> None:
        await self._stopping.wait()
        self.grace.stop()
        scope.cancel()

    async def _run_if_leader(self, once: Any, interval_s: float, name: str, enabled: bool,
                             at_election: bool = True) -> None:
        """Run ``once`` every ``interval_s`` while this node leads; ``at_election``, also as
        it becomes the leader: the reaper and the resumer put runs back in line, which a new
        leader does at once instead of at its next tick (the purger keeps its own time)."""
        if enabled:
            await every(interval_s, once, name=name, active=lambda: self.elector.is_leader,
                        grace=self.grace,
                        woken=self.elector.elected if at_election else None)

    async def _drain(self) -> None:
        while self._ready:  # claimed ahead, never started: back to pending at once
            self.executor.release(self._ready.popleft(), self._finished)
        running = len(self.active) - self._writing
        if running:
            log.info("stopping: waiting up to %.1f s for %d running handlers",
                     self._settings.worker.shutdown_grace_s, running)
            with anyio.move_on_after(self._settings.worker.shutdown_grace_s):
                await self._idle.wait()
        for execution in list(self.active.values()):
            execution.stop("shutdown")
        with anyio.move_on_after(FINAL_WRITE_DEADLINE_S):
            while self.active:
                await self._idle.wait()
        for execution in list(self.active.values()):
            log.warning("run %s still running after shutdown; its lease will expire",
                        execution.id)
        if self.active and self._handlers is not None:
            # Handlers that ignore cancellation, or write-backs the completer keeps retrying
            # (the database is gone), must not hold the process past the deadline.
            self._handlers.cancel_scope.cancel()

    def _start(self, row: dict[str, Any]) -> None:
        execution = Execution.from_claim(row, host_now=self._clock.now())
        self.active[execution.id] = execution
        if self._idle.is_set():  # a fresh Event only when leaving idle: was one per run (~1 us)
            self._idle = anyio.Event()
        if self._stopping.is_set():  # claimed while shutting down: never started
            self.executor.release(execution, self._finished)
            return
        self._ready.append(execution)  # started by _wake_slots, when the completer says
        prefetch = self._prefetch.get(execution.run.job_type)
        if prefetch is not None:
            try:
                prefetch(execution.input)
            except Exception:  # the handler's own lookup will then do, or say what is wrong
                log.exception("prefetch of run %s failed", execution.id, extra=execution.log_extra)

    def _wake_slots(self) -> None:
        """Wake an idle slot while runs are buffered and no woken slot is yet to take one (the
        completer's ``on_release``, and each slot as it takes a run).

        One at a time, the next as the last takes its run: a slot whose handler waits lets the
        next one start the next run, and a handler that never waits (a no-op, a quick
        computation) runs the batch on in its slot without waking the others for nothing.
        Woken all at once, one slot per run, the first slot still ran the whole batch and the
        others woke to an empty buffer. Drain of 20,000 no-op runs on the 2-core VM (medians of
        12, alternated with the code before): slot wake-ups 2,046 -> 418 at concurrency 10 and
        20,039 -> 217 at 200; Python CPU per run 61.1 -> 53.3 and 62.9 -> 55.8 us; 13.8k ->
        15.4k and 14.0k -> 15.4k runs/s."""
        if self._ready and self._idle_slots and not self._waking:
            self._waking += 1
            self._idle_slots.popleft().set()

    async def _slot(self) -> None:
        """One handler slot: runs buffered runs one after the other until cancelled."""
        while True:
            while not self._ready:
                readied = anyio.Event()
                self._idle_slots.append(readied)
                try:
                    await readied.wait()
                finally:
                    if readied.is_set():
                        self._waking -= 1
                    else:
                        self._idle_slots.remove(readied)
            if self._stopping.is_set():
                await anyio.sleep_forever()  # _drain releases what is buffered
            execution = self._ready.popleft()
            self._wake_slots()  # for the next run, should this one's handler wait
            try:
                await self.executor.execute(execution, self._finished)
            except Exception:
                log.exception("run %s: unexpected error; the lease will expire and the run be "
                              "retried", execution.id)
                self._finished(execution)
            if not execution.settled and self._writing < self.slots.size:
                # Free the claim slot while the write-back is in flight, so the next claim
                # overlaps it (at most `concurrency + prefetch` writes in flight; past that
                # the slot is freed by the write).
                execution.freed = True
                self._writing += 1
                self.slots.give(1)

    def _finished(self, execution: Execution) -> None:
        if execution.settled:
            return
        execution.settled = True
        self.claim_ahead.finished(execution.handler_s)
        self.active.pop(execution.id, None)
        if execution.freed:
            self._writing -= 1
        else:
            self.slots.give(1)
        if not self.active:
            self._idle.set()
        if self._burst:
            self._wake_all()

    async def _heartbeat(self) -> None:
        interval = self._settings.worker.heartbeat_every_s
        async with anyio.create_task_group() as alone:  # leases extended one by one
            while True:
                await anyio.sleep(interval)
                # In id order, like the completer's write-backs (see Completer._params).
                running = sorted(self.active.values(), key=lambda e: e.id)
                try:
                    async with self._db.connection() as conn:
                        cur = await conn.execute(self._q.worker_heartbeat, self._registration())
                        if await cur.fetchone() is None:  # the reaper took us for dead: back in
                            await conn.execute(self._q.worker_register, self._registration())
                        if not running:
                            continue
                        rows, held = await self._extend_leases(conn, running)
                except psycopg.OperationalError as exc:
                    log.warning("heartbeat failed (%s); retrying", type(exc).__name__)
                    continue
                for execution in running:
                    if execution.id in rows:
                        self._heard(execution, rows[execution.id])
                    elif execution.id in held:
                        if execution.id not in self._extending:
                            self._extending.add(execution.id)
                            alone.start_soon(self._extend_alone, execution)
                    else:
                        self._heard(execution, None)

    async def _extend_leases(self, conn: AsyncConn, running: list[Execution],
                             ) -> tuple[dict[UUID, bool], set[UUID]]:
        """Extend the leases of ``running`` in one statement, which skips the rows another
        transaction holds locked (job_run_heartbeat_many). Returns each extended run's cancel
        request, and the runs not extended but still held (their rows were locked)."""
        cur = await conn.execute(self._q.job_run_heartbeat_many, {
            "now": self._clock.db_now(), "lease_s": self._settings.worker.lease_s,
            "ids": [e.id for e in running], "fences": [e.fence for e in running]})
        rows = {r["id"]: r["cancel_requested"] for r in await cur.fetchall()}
        missed = [(e.id, e.fence) for e in running if e.id not in rows]
        return rows, (await self.lock_waiter.held(conn, missed) if missed else set())

    async def _extend_alone(self, execution: Execution) -> None:
        """Extend one run's lease waiting for the lock another transaction holds on its row
        (job_run_heartbeat_one): extended the moment the lock goes, before the reaper can take
        a lease that ran out behind it. A connection error leaves it to the next heartbeat."""
        try:
            if execution.id not in self.active:
                return
            row = await self.lock_waiter.alone(self._q.job_run_heartbeat_one, {
                "now": self._clock.db_now(), "lease_s": self._settings.worker.lease_s,
                "id": execution.id, "fence": execution.fence})
        except psycopg.OperationalError as exc:
            log.warning("heartbeat of run %s failed (%s); retrying with the next one",
                        execution.id, type(exc).__name__)
            return
        finally:
            self._extending.discard(execution.id)
        self._heard(execution, None if row is None else row["cancel_requested"])

    def _heard(self, execution: Execution, cancel_requested: bool | None) -> None:
        """A heartbeat's answer about a run: None, taken over; True, its cancel requested."""
        if execution.id not in self.active:
            return
        if cancel_requested is None:
            execution.stop("lost")
        elif cancel_requested:
            execution.stop("canceled")

    def _registration(self) -> dict[str, Any]:
        """This worker's row in the registry (``worker``): alive for one lease past each
        heartbeat."""
        host, pid, _ = self.id.split(":", 2)
        return {"id": self.id, "host": host, "pid": int(pid), "version": VERSION,
                "pools": self._pools, "concurrency": self._concurrency,
                "running": len(self.active), "now": self._clock.db_now(),
                "ttl_s": self._settings.worker.lease_s,
                "retry_slots": Jsonb(self.retry_slots) if self.retry_slots else None}

    async def _register(self) -> None:
        try:
            async with self._db.connection() as conn:
                await conn.execute(self._q.worker_register, self._registration())
        except psycopg.OperationalError as exc:  # the heartbeat registers once it can
            log.warning("could not register the worker (%s); retrying with the heartbeat",
                        type(exc).__name__)

    def _on_notification(self, payload: str) -> None:
        kind, _, value = payload.partition(":")
        if kind == "j":
            producer = self.producers.get(value)
            if producer is not None:
                producer.notified()
        elif kind == "c":
            try:
                execution = self.active.get(UUID(value))
            except ValueError:
                return
            if execution is not None:
                execution.stop("canceled")

    def _on_written(self, pool: str, status: str) -> None:
        producer = self.producers.get(pool)
        # In a keyed pool any finished run may free its key: the runs queued behind a full key
        # are runnable but were left by the last claim, and nothing else wakes the producer
        # before its next poll (webhooks to one endpoint, limit 5, 50 slots: < 8/s, one
        # key's worth per poll interval).
        if producer is not None and (status == "pending" or producer.keyed):
            producer.wake()

    def _wake_all(self) -> None:
        for producer in self.producers.values():
            producer.wake()

    async def _resign(self) -> None:
        try:
            await self.elector.resign()
            async with self._db.connection() as conn:
                await conn.execute(self._q.worker_leave, {"id": self.id})
        except psycopg.Error:
            log.debug("could not resign leadership or leave the registry; both expire")
