"""Writing runs: the one place every Python enqueue path goes through.

A request is first given its handler's defaults and policy keys (when this process registered
the handler), then validated, then written by one statement:

- a run without dedupe or concurrency keys is a plain INSERT (``job_run_insert_one``): ~230 us
  of server CPU on the 2-core VM, against ~300 us for the jsonb-array INSERT it replaced and
  more for the plpgsql ``_enqueue``;
- a run with keys goes through ``_enqueue``, whose advisory locks decide the keys race-free
  (the same function ``SELECT notifyq.enqueue(...)`` calls from any language);
- a batch is one ``job_run_insert_bulk`` for its plain rows (see :mod:`.bulk`), all or nothing
  (so a batch of plain rows needs no BEGIN/COMMIT round trips of its own), with its keyed rows
  through ``_enqueue`` in their places, all in one transaction; a batch of ``COPY_MIN_RUNS``
  plain runs or more is streamed by COPY instead (see :mod:`.copy`), in a transaction with its
  read of the definitions and its wake-up.

Outside a caller's transaction every write goes on the process's warm connection when it is
free (``Runtime.warm_connection``: a backend that stays busy writes and commits faster than the
pool's idle ones taken in turn), else on a pooled one.

Concurrent ``App.enqueue`` calls outside a caller's transaction, without keys, are written
together (group commit, :class:`~notifyq._db.batcher.Batcher`): the first goes at once and
alone by ``job_run_insert_one``, with its NOTIFY in the statement (one round trip, one
commit); those that arrive meanwhile go next, together, by ``job_run_insert_bulk`` with one
NOTIFY per pool. One batch is in flight per process, so its notifying commits never queue for
PostgreSQL's notify lock behind each other. If the group's statement refuses (an unknown type,
an input too large as jsonb prints it), nothing went in and each is written alone, so only the
bad one fails. ``notifyq bench --only enqueue``, 8 concurrent callers, before and after,
alternated 3 times on the 2-core VM (load 2.5-3.6, others' benchmarks running): 975-2,010/s ->
5,344-6,380/s; CPU per enqueue, Python + PostgreSQL, 294-391 + 320-443 us -> 72-95 + 53-73 us.
Without the batcher's ``gather`` the batches alternated 1 and 7 runs (median 3.0k/s).

Outside a caller's transaction the wake-up NOTIFY of an ``enqueue_many`` or of a keyed enqueue
rides in the write's own statement when it is the only one of this process in flight: one
round trip, one commit, the NOTIFY delivered with it. Concurrent ones send theirs after their
commit, folded into one per round trip by :class:`.WakeSender`: each commit that notifies holds
PostgreSQL's database-wide notify lock through its WAL flush, so notifying commits cannot share
flushes, and on a busy machine the lock's holders queue behind one another. 8 concurrent
``App.enqueue`` callers, each written alone (before grouping), the three ways interleaved in
one process (rounds of 800, CPU of this process and of the database's backends per enqueue):

    load 2.5:  folded 1,411/s (540 + 494 us)   NOTIFY in every insert 1,680/s (487 + 481 us)
    load 7:    folded   480/s (674 + 613 us)   NOTIFY in every insert   248/s (842 + 750 us)
               folded, the NOTIFY committed with synchronous_commit off: 449/s (no better)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import dict_row, tuple_row

from notifyq._db.batcher import Batcher
from notifyq._enqueue.bulk import Batch
from notifyq._enqueue.copy import COPY_MIN_RUNS, copy_runs
from notifyq._enqueue.refusals import translated_errors
from notifyq._enqueue.request import (
    EnqueueRequest,
    Prepared,
    coerce_requests,
    prepare,
    with_values,
)
from notifyq._enqueue.validate import refuse_builtin
from notifyq._enqueue.wake import WakeSender
from notifyq._errors import NotifyqError, PayloadTooLarge
from notifyq._limits import JOB_TYPE, MAX_INPUT_BYTES
from notifyq._notifier import wake_payload
from notifyq._policies import key_for
from notifyq._registry import HandlerSpec, Registry
from notifyq._run import Run, RunStatus, run_of
from notifyq._runtime import Runtime
from notifyq._tracing import Sending, sending

AnyConn = psycopg.AsyncConnection[Any]

GROUP_MAX = 100
"""The most concurrent single enqueues written by one statement."""


class _LeftOut(Exception):
    """A group's insert left its rows out (an input too large as jsonb prints it)."""


class Enqueuer:
    """Enqueues runs for one App: its handlers' defaults apply before any worker has stored
    them, and its handlers' types count as known (their worker will register them)."""

    def __init__(self, runtime: Runtime, registry: Registry) -> None:
        self._rt = runtime
        self._q = runtime.queries
        self._registry = registry
        self._waker: WakeSender | None = None
        # As before grouping, a lone enqueue is not shielded from its caller's cancellation,
        # and no deadline but the pool's (checkout) and the server's (statement_timeout).
        self._group: Batcher[tuple[Prepared, bool], Run] = Batcher(
            self._write_group, batch_max=GROUP_MAX, shield_alone=False, timeout_s=None,
            gather=True,
            split_on=(_LeftOut, NotifyqError, psycopg.DatabaseError))

    async def enqueue(self, request: EnqueueRequest, *, conn: AnyConn | None = None,
                      allow_unknown_type: bool | None = None,
                      builtin: bool = False) -> tuple[Run, bool]:
        """One run, and whether it was created (False: a dedupe key matched an existing run,
        which is returned). With ``conn``, in that connection's transaction; workers are woken
        when it commits. Without, one statement on the warm connection (its own commit; see
        ``Runtime.warm_connection``), and
        its wake-up in it unless other enqueues are in flight (see the module docstring).
        ``builtin``: the caller is the feature that owns a built-in job type (key rotation);
        otherwise those types are refused (``BUILTIN_JOB_TYPES``)."""
        if not builtin:
            refuse_builtin((request.job_type,))
        prepared = self.prepare(request)
        accept = self.accepts(request.job_type, allow_unknown_type)
        with sending(request.job_type) as send:
            if conn is not None:
                run = await self._write_one(conn, prepared, notify=True, accept=accept,
                                            send=send)
                return run, run.id == prepared.id
            if not prepared.request.needs_locks and _trace_context_of(send) is None:
                run = await self._group.submit((prepared, accept))
                if send is not None:
                    send.sent([(run.id, run.job_type, run.pool)])
                return run, True
            waker = self._waker_of(await self._rt.pool())
            with waker.enqueueing() as inline:
                async with self._rt.warm_connection() as own:
                    run = await self._write_one(own, prepared, notify=inline, accept=accept,
                                                send=send)
            if not inline:
                await waker.wake({run.pool})
        return run, run.id == prepared.id

    def enqueue_sync(self, request: EnqueueRequest, *, conn: psycopg.Connection[Any] | None = None,
                     allow_unknown_type: bool | None = None) -> Run:
        """:meth:`enqueue` for synchronous callers (always through ``_enqueue``, which notifies
        at commit); built-in job types are refused."""
        refuse_builtin((request.job_type,))
        prepared = self.prepare(request)
        params = prepared.params(
            notify=True, allow_unknown_type=self.accepts(request.job_type, allow_unknown_type))
        with sending(request.job_type) as send:
            if conn is not None:
                return self._enqueue_sync_on(conn, params, send)
            with self._rt.sync_pool().connection() as own:
                return self._enqueue_sync_on(own, params, send)

    def _enqueue_sync_on(self, conn: psycopg.Connection[Any], params: dict[str, Any],
                         send: Sending | None) -> Run:
        if send is None or send.trace_context is None:
            run = _enqueue_sync_on(conn, self._q.job_run_enqueue, params)
        else:
            with conn.transaction():
                run = _enqueue_sync_on(conn, self._q.job_run_enqueue, params)
                if run.id == params["id"]:
                    conn.execute(self._q.job_run_trace_context_set, {
                        "id": run.id, "trace_context": send.trace_context})
        if send is not None:
            send.sent([(run.id, run.job_type, run.pool)])
        return run

    async def enqueue_many(self, items: Iterable[EnqueueRequest | Mapping[str, Any]], *,
                           conn: AnyConn | None = None,
                           allow_unknown_type: bool | None = None) -> list[Run]:
        """Many runs in one transaction, in the order given (also their run order at equal
        priority and run_at), with one NOTIFY per pool. Built-in job types are refused."""
        requests = coerce_requests(items)
        refuse_builtin(r.job_type for r in requests)  # ~50 ns a run (of ~12 us)
        copy_types = self._copy_types(requests)
        batch = Batch(self._rt.settings.max_input_bytes)
        if copy_types is None:  # validated now; a COPY validates each chunk as it sends it
            self._fill(batch, requests)
        if not requests:
            return []
        with sending(None, len(requests)) as send:
            if conn is not None:
                async with conn.transaction():
                    return await self._write_many(
                        conn, requests, batch, copy_types=copy_types,
                        allow_unknown_type=allow_unknown_type, send=send, notify=True)
            waker = self._waker_of(await self._rt.pool())
            # Plain runs by INSERT: one autocommit statement, all or nothing, with its wake-up
            # (one round trip, where BEGIN and COMMIT made three). Keyed ones take several, and
            # COPY a read of the definitions first and a wake-up after: in one transaction (one
            # now() for the definitions' read and the rows, no rows committed without their
            # wake-up).
            with waker.enqueueing() as inline:
                async with (self._rt.warm_connection() as own,
                            own.transaction() if batch.keyed or copy_types is not None
                            else nullcontext()):
                    runs = await self._write_many(
                        own, requests, batch, copy_types=copy_types,
                        allow_unknown_type=allow_unknown_type, send=send, notify=inline)
            if not inline:
                await waker.wake({r.pool for r in runs})
        return runs

    def accepts(self, job_type: str, allow_unknown_type: bool | None) -> bool:
        """Whether ``job_type`` is enqueued even if no worker has registered it: the caller
        (or the ``enqueue.allow_unknown_types`` setting) says so, or this process has a
        handler for it (its worker will register it with that definition)."""
        if allow_unknown_type is None:
            allow_unknown_type = self._rt.settings.enqueue.allow_unknown_types
        return allow_unknown_type or self._registry.get(job_type) is not None

    def prepare(self, request: EnqueueRequest) -> Prepared:
        """The request with this process's handler defaults and policy keys, validated."""
        spec = self._registry.get(request.job_type) if isinstance(request.job_type, str) else None
        if spec is not None:
            request = with_handler_defaults(request, spec)
        return prepare(request, self._rt.settings.max_input_bytes)

    def _waker_of(self, pool: Any) -> WakeSender:
        if self._waker is None:
            self._waker = WakeSender(pool, self._q)
        return self._waker

    def _fill(self, batch: Batch, requests: Iterable[EnqueueRequest]) -> Batch:
        """Validate each request into ``batch`` (the first bad one raises), as :meth:`prepare`
        would, but without copying the plain ones: a handler's defaults travel beside the
        request."""
        for request in requests:
            job_type = request.job_type
            spec = self._registry.get(job_type) if isinstance(job_type, str) else None
            if request.needs_locks or (spec is not None and _has_policies(spec)):
                batch.add_prepared(self.prepare(request))
            elif spec is None:
                batch.add(request, (request.pool, request.priority, request.max_attempts))
            else:
                batch.add(request, (
                    spec.pool if request.pool is None else request.pool,
                    spec.priority if request.priority is None else request.priority,
                    spec.retry.attempts if request.max_attempts is None
                    else request.max_attempts))
        return batch

    def _copy_types(self, requests: list[EnqueueRequest]) -> list[str] | None:
        """The job types of a batch that goes by COPY (at least ``COPY_MIN_RUNS`` runs, none
        with dedupe or concurrency keys or a handler's policies, which take ``_enqueue``), or
        None. A malformed type sends the batch the INSERT's way too, which refuses it before
        any statement (COPY reads the types' definitions first)."""
        if len(requests) < COPY_MIN_RUNS or any(
                r.needs_locks or type(r.job_type) is not str for r in requests):
            return None
        types = list(dict.fromkeys([r.job_type for r in requests]))
        for job_type in types:
            spec = self._registry.get(job_type)
            if not JOB_TYPE.fullmatch(job_type) or (spec is not None and _has_policies(spec)):
                return None
        return types

    async def _write_group(self, items: list[tuple[Prepared, bool]]) -> list[Run]:
        """Plain runs of concurrent :meth:`enqueue` calls (``(prepared, accept)`` each), in one
        autocommit statement with their wake-ups: alone, ``job_run_insert_one``; together,
        ``job_run_insert_bulk``, all or nothing (the batcher then writes each alone, so only a
        bad one fails)."""
        async with self._rt.warm_connection() as conn:
            if len(items) == 1:
                [(prepared, accept)] = items
                return [await self._write_one_traced(conn, prepared, notify=True,
                                                     accept=accept, trace_context=None)]
            batch = Batch(self._rt.settings.max_input_bytes)
            for prepared, _ in items:
                batch.add_prepared(prepared)
            ids, params = batch.params()
            refused = {p.request.job_type for p, accept in items if not accept}
            params.update(accept_types=[t for t in params["types"] if t not in refused] or None,
                          notify=True, channel=self._q.schema)
            with translated_errors():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(self._q.job_run_insert_bulk, params)
                    summary = await cur.fetchall()
        if summary[0]["inserted"] < len(ids):
            raise _LeftOut
        return batch.runs(ids, summary)

    async def _write_one(self, conn: AnyConn, prepared: Prepared, *, notify: bool,
                         accept: bool, send: Sending | None) -> Run:
        run = await self._write_one_traced(conn, prepared, notify=notify, accept=accept,
                                           trace_context=_trace_context_of(send))
        if send is not None:
            send.sent([(run.id, run.job_type, run.pool)])
        return run

    async def _write_one_traced(self, conn: AnyConn, prepared: Prepared, *, notify: bool,
                                accept: bool, trace_context: str | None) -> Run:
        if prepared.request.needs_locks:
            return await self._write_keyed(conn, prepared, notify=notify, accept=accept,
                                           trace_context=trace_context)
        with translated_errors():
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(self._q.job_run_insert_one, prepared.insert_params(
                    accept=accept, trace_context=trace_context, notify=notify,
                    channel=self._q.schema))
                row = await cur.fetchone()
        if row is None:  # the insert left it out: too large as the database prints it
            raise (await self._too_large(conn, [prepared.input_json]))
        return _inserted(prepared, row)

    async def _write_keyed(self, conn: AnyConn, prepared: Prepared, *, notify: bool,
                           accept: bool, trace_context: str | None = None) -> Run:
        if trace_context is None:
            return await self._call_enqueue(conn, prepared, notify=notify, accept=accept)
        # _enqueue takes no trace context: set it in the same transaction, before any worker
        # can claim the run (only when a tracer is installed).
        async with conn.transaction():
            run = await self._call_enqueue(conn, prepared, notify=notify, accept=accept)
            if run.id == prepared.id:  # created, not a dedupe hit
                await conn.execute(self._q.job_run_trace_context_set, {
                    "id": run.id, "trace_context": trace_context})
        return run

    async def _call_enqueue(self, conn: AnyConn, prepared: Prepared, *, notify: bool,
                            accept: bool) -> Run:
        with translated_errors():
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(self._q.job_run_enqueue,
                                  prepared.params(notify=notify, allow_unknown_type=accept))
                return _enqueued(await cur.fetchone())

    async def _write_many(self, conn: AnyConn, requests: list[EnqueueRequest], batch: Batch, *,
                          copy_types: list[str] | None, allow_unknown_type: bool | None,
                          send: Sending | None, notify: bool) -> list[Run]:
        """``enqueue_many``'s runs and, with ``notify``, their wake-ups (one per pool,
        delivered when ``conn``'s transaction commits): by COPY when ``copy_types`` (``batch``
        still empty), else (or when a type needs the INSERT) as :meth:`_write_batch`."""
        trace_context = _trace_context_of(send)
        runs = None
        if copy_types is not None:
            if conn.pgconn.pipeline_status == pq.PipelineStatus.OFF:  # no COPY in a pipeline
                with translated_errors():
                    runs = await copy_runs(
                        conn, self._q, requests, batch, self._fill, types=copy_types,
                        accept_types=[t for t in copy_types
                                      if self.accepts(t, allow_unknown_type)],
                        trace_context=trace_context)
            if runs is None:  # a type needs the INSERT, or the caller's pipeline does
                self._fill(batch, requests)
        if runs is None:
            runs = await self._write_batch(conn, batch, allow_unknown_type, trace_context,
                                           notify=notify)
        elif notify:
            await self._notify(conn, runs)
        if send is not None:
            send.sent([(r.id, r.job_type, r.pool) for r in runs])
        return runs

    async def _write_batch(self, conn: AnyConn, batch: Batch, allow_unknown_type: bool | None,
                           trace_context: str | None, *, notify: bool) -> list[Run]:
        """The plain runs by ``job_run_insert_bulk`` (with their wake-up when no keyed run
        follows), the keyed ones by ``_enqueue``, in their places."""
        plain: list[Run] = []
        if batch.requests:
            accept_types = [t for t in batch.types() if self.accepts(t, allow_unknown_type)]
            plain = await self._insert_bulk(conn, batch, accept_types, trace_context,
                                            notify=notify and not batch.keyed)
        runs = [await self._write_keyed(conn, at, notify=False, accept=self.accepts(
                    at.request.job_type, allow_unknown_type), trace_context=trace_context)
                if isinstance(at, Prepared) else at
                for at in batch.order(plain)]
        if notify and batch.keyed:  # otherwise the bulk statement woke them
            await self._notify(conn, runs)
        return runs

    async def _notify(self, conn: AnyConn, runs: list[Run]) -> None:
        """Wake the runs' pools when ``conn``'s transaction commits (at once in autocommit)."""
        await conn.execute(self._q.job_run_notify, {
            "channel": self._q.schema,
            "payloads": [wake_payload(p) for p in {r.pool for r in runs}]})

    async def _insert_bulk(self, conn: AnyConn, batch: Batch, accept_types: list[str],
                           trace_context: str | None, *, notify: bool) -> list[Run]:
        """The batch's plain runs by ``job_run_insert_bulk`` (with their wake-up: ``notify``)."""
        ids, params = batch.params(trace_context)
        params.update(accept_types=accept_types or None, notify=notify, channel=self._q.schema)
        with translated_errors():
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(self._q.job_run_insert_bulk, params)
                summary = await cur.fetchall()
        if summary[0]["inserted"] < len(ids):  # the caller's transaction (or ours) rolls
            raise (await self._too_large(conn, batch.inputs))  # the batch back
        return batch.runs(ids, summary)

    async def _too_large(self, conn: AnyConn, inputs: list[str]) -> PayloadTooLarge:
        """An insert left rows out: the first input too large as the database prints it (1e300
        is 5 bytes in Python's JSON and 301 in jsonb's). An error path: one round trip per
        input until found."""
        async with conn.cursor(row_factory=dict_row) as cur:
            for text in inputs:
                await cur.execute(self._q.job_run_input_size, {"input": text})
                row = await cur.fetchone()
                if row is not None and row["size"] > MAX_INPUT_BYTES:
                    return PayloadTooLarge(int(row["size"]), MAX_INPUT_BYTES)
        raise RuntimeError("the insert left a run out, yet no input is too large")


def with_handler_defaults(request: EnqueueRequest, spec: HandlerSpec) -> EnqueueRequest:
    """The request with the handler's defaults where it gave none, and the run's keys computed
    from the handler's policies (explicit values win). Applied here, they hold even before any
    worker has stored the definition the SQL would otherwise apply."""
    return with_values(request, {
        "max_attempts": spec.retry.attempts if request.max_attempts is None
        else request.max_attempts,
        "pool": spec.pool if request.pool is None else request.pool,
        "priority": spec.priority if request.priority is None else request.priority,
        **_policy_fields(spec, request)})


def _policy_fields(spec: HandlerSpec, request: EnqueueRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if (c := spec.concurrency) is not None and request.concurrency_key is None:
        out.update(concurrency_key=key_for(c.key, request.input, "concurrency"),
                   concurrency_limit=c.limit, concurrency_collision=c.collision)
    if (d := spec.dedupe) is not None and request.dedupe_key is None:
        out.update(dedupe_key=key_for(d.key, request.input, "dedupe"),
                   dedupe_window_s=d.window_s, dedupe_states=d.states)
    if (s := spec.scope) is not None and request.scope_entity_id is None:
        out.update(scope_entity_type=s.entity,
                   scope_entity_id=key_for(s.id_from, request.input, "scope id"))
    return out


def _has_policies(spec: HandlerSpec) -> bool:
    return spec.concurrency is not None or spec.dedupe is not None or spec.scope is not None


def _enqueue_sync_on(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> Run:
    with translated_errors(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return _enqueued(cur.fetchone())


def _enqueued(row: dict[str, Any] | None) -> Run:
    if row is None:  # pragma: no cover - _enqueue always returns a row
        raise RuntimeError("enqueue returned no row")
    return Run.from_row(row)


def _inserted(prepared: Prepared, row: tuple[Any, ...]) -> Run:
    """The run ``job_run_insert_one`` wrote: what the caller sent, with what the statement
    applied (``pool, priority, max_attempts, timeout_s, created_at``)."""
    pool, priority, max_attempts, timeout_s, created_at, _ = row
    r = prepared.request
    return run_of({
        "id": prepared.id, "job_type": r.job_type, "status": RunStatus.PENDING, "input": r.input,
        "pool": pool, "priority": priority,
        "run_at": created_at if r.run_at is None else r.run_at.astimezone(created_at.tzinfo),
        "attempts": 0, "max_attempts": max_attempts, "created_at": created_at,
        "tags": [] if r.tags is None else list(r.tags), "timeout_s": timeout_s,
        "trigger_source": "manual"})


def _trace_context_of(send: Sending | None) -> str | None:
    return send.trace_context if send is not None else None
