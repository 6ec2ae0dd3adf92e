"""Writing outcomes back and claiming the next runs: one statement per cycle.

Executors hand their outcome to :meth:`Completer.submit` and go on with their next run; the
callback they pass is called once the write committed (or was fenced out). Producers ask for
runs with :meth:`Completer.claim`. The completer's loop takes whatever has queued up (at most
``batch_max`` write-backs, and the claims asked for) and sends it as one statement,
``job_run_finish_and_claim`` (``job_run_claim`` when nothing is to be written back): under load
the batch fills while the previous statement is in flight, at idle a write or a claim goes out
alone at once. A busy worker thus pays one round
trip per batch instead of a claim and a write-back (drain at concurrency 10, 2 cores: see
bench/RESULTS.md, 2026-12-01). For that the loop lets the event loop turn once before it
gathers: the producer whose slots the finished handlers just freed queues its claim in that
turn. Without it the claim came one turn late and went alone, every cycle (a drain of no-op
runs at concurrency 10 sent 20 write-backs, then a claim of 20: two statements per batch).
A keyed pool's claim (``_claim_keyed``, a function) cannot ride in that statement; it follows
the write-back in the same pipeline, as a transaction of its own
(:meth:`Completer._written_then_keyed`), so a keyed pool pays one round trip per batch too.

A busy worker's handlers run while the statement is in flight, not between statements: the runs
a full claim returns wait in the worker's buffer until the completer has sent its next
statement (``on_release``; at once when it has nothing to send, or for an idle worker's claim),
and that statement already carries the producer's next claim (:attr:`Claim.then`, queued by the
completer as the full batch comes back). So statement *k* writes back batch *k-1* and claims
batch *k+1* while the handlers run batch *k*; claim-ahead holds enough runs for two batches
(:mod:`~notifyq._dispatch.claim_ahead`). Before, a slot ran its whole batch (a no-op handler
never yields) before the completer could gather its write-backs, and the server and the
handlers took turns: drain at concurrency 10, 2 cores, statements in flight 64-69 % of the
time and 1.2-2.1 ms of Python between two of them; since, 74-84 % and 0.2-0.8 ms (bench/RESULTS.md,
2026-12-03).

The statements go on connections of the completer's own (each a
:class:`~notifyq._db.pool.WarmConnection`, the pool's while it cannot be opened) whose sessions
plan them once (``worker_session_generic_plans``): backends kept busy, and no statement
planned anew after the queue table changed size.

Up to ``lanes`` statements are in flight at once, one per connection: each lane is the loop
above, and while one lane's statement waits for the server (its write-backs' commit, the
WAL flush), the next lane gathers what has queued since and sends it. One lane is bounded by
one backend doing one statement at a time: ``notifyq bench --only sql``, this statement in a
bare loop of 100-row batches with no Python at all, did 25.4k runs/s on one connection and
33.9k on four (2-core VM, 2026-12-04). Drain of 20,000 no-op runs, one lane against two,
alternated twice (runs/s): concurrency 200 23,155 / 24,672 -> 28,802 / 27,361, concurrency
100 19,824 / 21,949 -> 25,330 / 24,819, concurrency 50 20,672 / 23,216 -> 22,654 / 22,793,
concurrency 10 16,859 / 17,340 -> 17,871 / 17,379 (statements of 15 runs instead of 26 there:
the runs split between the lanes). Lanes never wait on each other's rows: their write-backs
are of different runs (a run is written back once per claim), and their claims skip locked
rows.

Rows the statement did not return were taken over by another worker, and their callbacks get
``written=False`` (:meth:`write` raises :class:`~notifyq._errors.LeaseLost`), or another
transaction held their row locked: the statement skips such rows (SKIP LOCKED) instead of
holding its whole batch, and the claim riding with it, behind one application's lock (the
worker completed 0 runs/s while one running row was locked, issue 31). A write-back missed once
goes in a statement again :data:`MISSED_AGAIN_S` later: the lock is most often another worker's
claim that passed over the row, gone by then. Missed twice, ``job_run_leased_many`` tells the
two apart, and a run still held is written alone, waiting for its lock (``job_run_finish_one``;
see :mod:`~notifyq._dispatch.lock_waiter`), never reported lost for a lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import anyio
import anyio.lowlevel
import psycopg
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn, WarmConnection
from notifyq._db.queries import Queries
from notifyq._dispatch.lock_waiter import LockWaiter
from notifyq._dispatch.outcome import Outcome
from notifyq._errors import CompleterClosedError, LeaseLost

log = logging.getLogger("notifyq.completer")

Written = Callable[[bool, BaseException | None], None]
"""A write-back's callback: (committed, the error when it could not be written)."""

MISSED_AGAIN_S = 0.01
"""How long a write-back missed once waits before it goes in a statement again. The lock that
made a statement skip a row is most often another worker's claim: one whose snapshot still saw
the run pending locks the row it now finds claimed (READ COMMITTED re-checks the newest
version) and holds it until its statement ends. Two workers draining 20,000 no-op runs at
concurrency 50: sent again at once, 936 write-backs missed and 371 were written alone, each a
statement of its own, in one drain; 10 ms later, 701 missed over five drains and none was
written alone."""


@dataclass(eq=False, slots=True)
class _Pending:
    run_id: UUID
    fence: int
    outcome: Outcome
    done: Written
    missed: int = 0
    """Statements that came back without it (its row was locked, or it was fenced out)."""


@dataclass(eq=False)
class Claim:
    """A producer's request for runs, answered in the completer's next statement.

    ``take`` is called just before the statement is sent and says how many runs to claim (the
    free capacity then, not when the request was made); each claimed row goes to ``start``
    from the completer's task, so no claimed run is dropped when the producer that asked has
    been cancelled meanwhile."""

    pool: str
    keyed: bool
    fair: bool
    take: Callable[[], int]
    start: Callable[[dict[str, Any]], None]
    want: int = 0
    got: int = 0
    failure: BaseException | None = None
    abandoned: bool = False
    idle: bool = False
    """Asked with no run of the worker's held (buffered, running or being written back): no
    write-back is about to join it, so the completer sends it without first letting the event
    loop turn, and starts its runs at once."""
    then: Claim | None = None
    """After a full batch: the producer's next claim, already queued by the completer."""
    queued: bool = False
    """Queued by the completer itself (a :attr:`then`): :meth:`Completer.claim` only waits."""
    sent: bool = False
    """Its statement has gone out: runs committed since are not in its snapshot."""
    settle: Callable[[Claim], None] | None = None
    """For a claim nobody awaits (sent with :meth:`Completer.add`): called once it is answered,
    has failed or was dropped, to give back what it did not use. Never chained (:attr:`then`)."""
    done: anyio.Event = field(default_factory=anyio.Event)

    def finish(self) -> None:
        """Answered, failed or dropped: wake whoever awaits it, or settle it."""
        self.done.set()
        if self.settle is not None:
            self.settle(self)


class Completer:
    """Batches fenced write-backs, with the next claim; one per worker process."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock, *,
                 batch_max: int = 500, on_written: Callable[[str, str], None] | None = None,
                 retry_for_s: float = 30.0, worker_id: str = "", lease_s: float = 30.0,
                 dsn: str | None = None,
                 on_statement: Callable[[float], None] | None = None,
                 on_release: Callable[[], None] | None = None, lanes: int = 1,
                 prepare: bool = True, lock_waiter: LockWaiter | None = None) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self._pool = pool
        self._lanes = lanes
        # Its own connections, one per lane (the pool's when no DSN is given, or while one
        # cannot be opened): one statement in flight on each, on backends kept busy, planned
        # once. Each is opened on first use, so a lane that never sends opens none. Through a
        # transaction pool (``prepare`` False) nothing is prepared and the session is left as
        # it is: its settings would stay on whichever server session ran them, for other
        # clients, and a statement planned at each run needs no generic plan.
        self._conns = [] if dsn is None else [
            WarmConnection(dsn, application_name="notifyq-completer",
                           configure=self._configure if prepare else None, prepare=prepare)
            for _ in range(lanes)]
        self._pipelines = prepare
        """Whether a keyed pool's write-back and claim may share a pipeline (not through a
        transaction pooler, which is left the plain protocol it is tested with)."""
        self._q = queries
        self._clock = clock
        self._batch_max = batch_max
        self._on_written = on_written
        self._retry_for_s = retry_for_s
        self._worker_id = worker_id
        self._lease_s = lease_s
        self._on_statement = on_statement
        """Told each statement's round trip (send to answer), in seconds."""
        self._on_release = on_release
        """Called when the runs claimed so far may start: see :meth:`_cycle`."""
        self._send: MemoryObjectSendStream[_Pending | Claim]
        self._receive: MemoryObjectReceiveStream[_Pending | Claim]
        self._send, self._receive = anyio.create_memory_object_stream[_Pending | Claim](
            float("inf"))
        self._claims: list[Claim] = []
        self._chained: list[Claim] = []
        self._lock_waiter = lock_waiter or LockWaiter(pool, queries)
        self._tasks: anyio.abc.TaskGroup | None = None
        self._closed = False
        self.batches = 0
        self.lease_lost = 0
        self.missed = 0
        """Write-backs a statement came back without: fenced out, or their row locked."""
        self.written_alone = 0
        """Write-backs written alone after waiting for their row's lock (tests read it)."""
        self.in_flight = 0
        """Statements on their way or being answered (at most ``lanes``)."""
        self._holding = 0
        self.most_held = 0
        """The most lanes that ever held a connection at once, from taking it (opening it the
        first time) to giving it back: the completer connections opened (a lane opens one only
        when another lane holds the first)."""

    def submit(self, run_id: UUID, fence: int, outcome: Outcome, done: Written) -> None:
        """Queue ``outcome`` for writing; ``done`` is called after the statement."""
        try:
            self._send.send_nowait(_Pending(run_id, fence, outcome, done))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise CompleterClosedError("completer is closed") from None

    async def write(self, run_id: UUID, fence: int, outcome: Outcome) -> None:
        """Persist ``outcome``; return once committed. Raises LeaseLost when fenced out."""
        finished = anyio.Event()
        result: list[Any] = []

        def done(written: bool, failure: BaseException | None) -> None:
            result.extend((written, failure))
            finished.set()

        self.submit(run_id, fence, outcome, done)
        await finished.wait()
        written, failure = result
        if failure is not None:
            raise failure
        if not written:
            raise LeaseLost(f"run {run_id} is no longer leased with fence {fence}")

    async def claim(self, request: Claim) -> Claim:
        """Claim runs in the next statement; returns ``request`` with ``want`` and ``got`` set
        (raises its ``failure``). Cancelled before the statement, nothing is claimed."""
        if not request.queued:
            self.add(request)
        try:
            await request.done.wait()
        except BaseException:
            request.abandoned = True
            raise
        if request.failure is not None:
            raise request.failure
        return request

    def add(self, request: Claim) -> None:
        """Queue ``request`` for the next statement without waiting for it (its ``settle``
        then does what an awaiting producer would)."""
        try:
            self._send.send_nowait(request)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise CompleterClosedError("completer is closed") from None

    def close(self) -> None:
        """Stop accepting writes; :meth:`run` returns once the queued ones are written."""
        self._closed = True
        self._send.close()

    async def _configure(self, conn: AsyncConn) -> None:
        await conn.execute(self._q.worker_session_generic_plans)

    async def run(self) -> None:
        try:
            async with self._receive, anyio.create_task_group() as tasks:
                self._tasks = tasks  # the lanes, and the write-backs waiting for a row lock
                for lane in range(self._lanes):
                    tasks.start_soon(self._run, name=f"completer lane {lane}")
        finally:
            with anyio.CancelScope(shield=True):
                for conn in self._conns:
                    await conn.close()

    async def _run(self) -> None:
        """One lane: gather what has queued, send it, wait for the answer; until closed."""
        while True:
            # One turn of the event loop before gathering: the producers the last statement
            # answered (and those whose slots the finished handlers freed) queue their next
            # claims meanwhile, so claims and write-backs go in one statement. Without it
            # the completer won the race every time and a busy worker alternated
            # writes-only and claims-only statements (drain, concurrency 10: two round
            # trips per batch).
            await anyio.lowlevel.checkpoint()
            self._claims += self._chained
            self._chained.clear()
            writes: list[_Pending] = []
            self._gather(writes)
            if not writes and not self._claims:
                self._release()  # nothing to send: the runs claimed last may start now
                try:
                    first = await self._receive.receive()
                except anyio.EndOfStream:
                    return
                # An idle worker's claim has nothing to wait for.
                if not (isinstance(first, Claim) and first.idle):
                    await anyio.lowlevel.checkpoint()
                self._add(first, writes)
                self._gather(writes)
            await self._cycle(writes)
            while self._claims:  # a claim for another pool: alone, right after
                await self._cycle([])

    def _gather(self, writes: list[_Pending]) -> None:
        while len(writes) < self._batch_max:
            try:
                self._add(self._receive.receive_nowait(), writes)
            except (anyio.WouldBlock, anyio.EndOfStream):
                break

    def _release(self) -> None:
        if self._on_release is not None:
            self._on_release()

    def _add(self, item: _Pending | Claim, writes: list[_Pending]) -> None:
        if isinstance(item, Claim):
            self._claims.append(item)
        else:
            writes.append(item)

    async def _cycle(self, writes: list[_Pending]) -> None:
        claim = self._claims.pop(0) if self._claims else None
        if claim is not None and not claim.abandoned:
            claim.want = claim.take()
        if claim is not None and not claim.want:
            claim.finish()
            claim = None
        if not writes and claim is None:
            return
        if claim is not None:
            claim.sent = True
        rows: list[dict[str, Any]] | None = None
        try:
            rows = await self._execute(writes, claim)
        except Exception as exc:
            if claim is not None and claim.failure is None:
                claim.failure = exc
            for item in writes:
                item.done(False, exc)
            return
        finally:
            if rows is None and claim is not None:
                claim.finish()  # failed or cancelled: nothing to start
        written = _start_claimed(rows, claim)
        if claim is not None:
            if claim.got == claim.want and not claim.abandoned and claim.settle is None:
                # A full batch: there may be more. The producer's next claim is queued now, so
                # that it goes out in the next statement, with the write-backs queued by then,
                # not one event-loop turn late in a statement of its own.
                claim.then = Claim(claim.pool, claim.keyed, claim.fair, claim.take,
                                   claim.start, queued=True)
                self._chained.append(claim.then)
            if claim.idle and not writes:
                # An idle worker woken: its runs start now, ahead of the producer's turn (the
                # event loop resumes woken tasks in the order they were woken).
                self._release()
            claim.finish()
        await self._report(writes, written)

    async def _report(self, writes: list[_Pending], written: dict[UUID, dict[str, Any]]) -> None:
        missed = [item for item in writes if item.run_id not in written]
        for item in writes:
            if item.run_id in written:
                self._settle(item, written[item.run_id])
        if missed:
            await self._missed(missed)

    def _settle(self, item: _Pending, row: dict[str, Any] | None) -> None:
        """Written (``row``), or fenced out: call back."""
        if row is None:
            self.lease_lost += 1
        elif self._on_written is not None:
            self._on_written(row["pool"], row["status"])
        item.done(row is not None, None)

    async def _missed(self, missed: list[_Pending]) -> None:
        """Write-backs a statement came back without: fenced out, or skipped because another
        transaction held their row locked. Missed once, they go in a statement again
        :data:`MISSED_AGAIN_S` later; twice (or once while closing), they are told apart."""
        self.missed += len(missed)
        for item in missed:
            item.missed += 1
        if self._closed or self._tasks is None:
            await self._classify(missed)
            return
        first = [item for item in missed if item.missed == 1]
        if first:
            self._tasks.start_soon(self._send_again, first)
        if again := [item for item in missed if item.missed > 1]:
            await self._classify(again)

    async def _send_again(self, items: list[_Pending]) -> None:
        await anyio.sleep(MISSED_AGAIN_S)
        try:
            for item in items:
                self._send.send_nowait(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self._classify(items)  # closed meanwhile: no later statement

    async def _classify(self, items: list[_Pending]) -> None:
        """Runs no longer held under their fence are lost; the others' rows were locked by
        another transaction, and each is written alone once its lock goes."""
        try:
            held = await self._held(items)
        except psycopg.OperationalError:
            held = {item.run_id for item in items}  # cannot tell: the waits will
        for item in items:
            if item.run_id in held and self._tasks is not None:
                self._tasks.start_soon(self._write_alone, item)
            else:
                self._settle(item, None)

    async def _held(self, items: list[_Pending]) -> set[UUID]:
        async with self._connection() as conn:
            return await self._lock_waiter.held(conn, ((i.run_id, i.fence) for i in items))

    async def _write_alone(self, item: _Pending) -> None:
        """Write ``item`` back alone, waiting for the lock another transaction holds on its row
        (``job_run_finish_one``), retrying connection errors for ``retry_for_s``."""
        try:
            row = await self._lock_waiter.alone(self._q.job_run_finish_one,
                                                self._params([item]),
                                                retry_for_s=self._retry_for_s)
        except psycopg.OperationalError as exc:
            item.done(False, exc)
            return
        except anyio.get_cancelled_exc_class():
            item.done(False, CompleterClosedError(
                f"stopped while run {item.run_id}'s row was locked by another transaction"))
            raise
        self.written_alone += row is not None
        self._settle(item, row)

    async def _execute(self, writes: list[_Pending], claim: Claim | None) -> list[dict[str, Any]]:
        params = self._params(writes)
        delay = 0.05
        deadline = anyio.current_time() + self._retry_for_s
        # The slots woken now run once this task yields: with the statement on the wire (or,
        # while a connection is opened or the statement retried, meanwhile).
        self._release()
        while True:
            try:
                async with self._held_connection() as conn:
                    sent = time.perf_counter()
                    self.in_flight += 1
                    try:
                        rows = await self._statement(conn, params, claim)
                    finally:
                        self.in_flight -= 1
                    if self._on_statement is not None:
                        self._on_statement(time.perf_counter() - sent)
            except psycopg.OperationalError as exc:
                # The database is restarting or the connection was killed. A retried batch that
                # had in fact committed matches nothing the second time (reported as lease
                # lost, harmlessly): the fence makes the write idempotent. A lost claim is not
                # retried: its runs, if it committed, come back when their lease expires.
                if claim is not None:
                    claim.failure, claim = exc, None
                if not writes or anyio.current_time() + delay > deadline:
                    raise
                log.warning("write-back failed (%s); retrying in %.2f s", type(exc).__name__, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                self.batches += 1
                return rows

    @asynccontextmanager
    async def _held_connection(self) -> AsyncIterator[AsyncConn]:
        """:meth:`_connection`, counted in :attr:`most_held`."""
        self._holding += 1
        self.most_held = max(self.most_held, self._holding)
        try:
            async with self._connection() as conn:
                yield conn
        finally:
            self._holding -= 1

    def _connection(self) -> AbstractAsyncContextManager[AsyncConn]:
        """A free connection of the completer's (each lane holds at most one at a time, so
        one is free), or the pool's."""
        for conn in self._conns:
            if not conn.busy:
                return conn.connection(self._pool)
        return self._pool.connection()

    async def _statement(self, conn: AsyncConn, params: dict[str, Any],
                         claim: Claim | None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        params["limit"] = 0
        if claim is not None:
            asked = {"now": params["now"], "pool": claim.pool, "limit": claim.want,
                     "worker_id": self._worker_id, "lease_s": self._lease_s}
            if not params["ids"] and not claim.fair:
                # A claim alone (an idle worker woken), keyed pools' included: one statement
                # without the empty write-back half, committed asynchronously; see
                # job_run_claim.
                alone = (self._q.job_run_claim_keyed_then_plain if claim.keyed
                         else self._q.job_run_claim)
                cur = await conn.execute(alone, asked, binary=True)
                return await cur.fetchall()
            if claim.keyed and not claim.fair and params["ids"] and self._pipelines:
                return await self._written_then_keyed(conn, params, asked)
            if claim.keyed:
                keyed = await (await conn.execute(self._q.job_run_claim_keyed, asked)).fetchall()
                rows = [{**row, "claimed": True} for row in keyed]
            if claim.fair and claim.want > len(rows):
                fair = await (await conn.execute(self._q.job_run_claim_fair, {
                    **asked, "limit": claim.want - len(rows)})).fetchall()
                rows += [{**row, "claimed": True} for row in fair]
            params.update(pool=claim.pool, limit=claim.want - len(rows))
        # Binary results: half the bytes to receive and parse (uuids, timestamps and numbers by
        # psycopg's C loaders, no text round trip), the same Python values.
        if params["ids"]:
            cur = await conn.execute(self._q.job_run_finish_and_claim, params, binary=True)
            rows += await cur.fetchall()
        elif params["limit"]:  # a fair pool's claim alone: the plain rest, after _claim_fair
            cur = await conn.execute(self._q.job_run_claim, {
                "now": params["now"], "pool": params["pool"], "limit": params["limit"],
                "worker_id": self._worker_id, "lease_s": self._lease_s}, binary=True)
            rows += await cur.fetchall()
        return rows

    async def _written_then_keyed(self, conn: AsyncConn, params: dict[str, Any],
                                  asked: dict[str, Any]) -> list[dict[str, Any]]:
        """A keyed pool's write-backs, then its claim (keyed runs, then plain ones for the
        rest), in one round trip: two statements in a pipeline with a sync point between them,
        so each is its own transaction (the write-back committed synchronously, the claim not,
        as when each goes alone), and the claim counts the slots the write-back just freed.
        Sent one after the other, as before, the claim went first and a key's runs finishing
        in the same cycle still held its room."""
        async with conn.pipeline() as pipeline:
            written = await conn.execute(self._q.job_run_finish_and_claim, params, binary=True)
            await pipeline.sync()
            claimed = await conn.execute(self._q.job_run_claim_keyed_then_plain, asked,
                                         binary=True)
        return [*await written.fetchall(), *await claimed.fetchall()]

    def _params(self, writes: list[_Pending]) -> dict[str, Any]:
        # In id order, like the heartbeat's: both statements lock the worker's running rows one
        # by one in array order, and two orders could deadlock each other.
        writes = sorted(writes, key=lambda i: i.run_id)
        outcomes = [i.outcome for i in writes]
        return {
            "now": self._clock.db_now(),
            # NULL when there is nothing to write back: what _statement tests.
            "ids": _array_literal(i.run_id for i in writes) if writes else None,
            "fences": _array_literal(i.fence for i in writes),
            "statuses": _array_literal(o.status.value for o in outcomes),
            "outputs": _column([o.output for o in outcomes]),
            "errors": _column([o.error for o in outcomes]),
            "run_ats": _column([o.run_at for o in outcomes]),
            "refunds": _array_literal(o.refund for o in outcomes),
            "wait_kinds": _column([o.wait_kind for o in outcomes]),
            "wait_tokens": _column([o.wait_token for o in outcomes]),
            "waiting_ons": _column([o.waiting_on for o in outcomes]),
            "pool": "", "limit": 0, "worker_id": self._worker_id,
            "lease_s": self._lease_s,
        }


def _start_claimed(rows: list[dict[str, Any]], claim: Claim | None) -> dict[UUID, dict[str, Any]]:
    """Start the statement's claimed runs; return its write-back rows by run id.

    A run that cannot be started (a bug: ``start`` only reads the row) is logged, left to its
    lease like a run of a crashed worker, and not counted in ``got`` (its slot goes back to the
    producer); the other runs start, and every write-back of the statement is still reported,
    so no executor waits for a callback that never comes."""
    written: dict[UUID, dict[str, Any]] = {}
    for row in rows:
        if row["claimed"]:
            try:
                claim.start(row)  # type: ignore[union-attr]  # only a claim returns these
            except Exception:
                log.exception("run %s was claimed but could not be started; it runs again "
                              "when its lease expires", row.get("id"))
            else:
                claim.got += 1  # type: ignore[union-attr]
        else:
            written[row["id"]] = row
    return written


def _array_literal(values: Iterable[UUID | int | str]) -> str:
    """A PostgreSQL array literal of values that never need quoting or escaping (uuids,
    integers, status words), made with one join: psycopg dumps a list one element at a time in
    Python, with a regex check for quoting each (60-65 us less per statement of 20 write-backs,
    ~3 us a run)."""
    return "{" + ",".join(map(str, values)) + "}"


def _column(values: list[Any]) -> list[Any] | None:
    """A nullable column of the write-backs; NULL when every value is (the usual case for all
    but the output): ``unnest`` pads a NULL array with NULLs, and psycopg need not dump it."""
    for value in values:
        if value is not None:
            return values
    return None
