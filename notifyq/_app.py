"""The application object: handler registry, enqueue, run control and the in-process worker."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from notifyq._clock import Clock, SystemClock
from notifyq._control import RunControl, Stats
from notifyq._db import migrate as migrations
from notifyq._db.pool import AsyncConn, check_connection_sync, open_pool, require_dsn
from notifyq._db.queries import Queries, queries_for
from notifyq._dispatch.retry import RetryPolicy
from notifyq._dispatch.worker import Worker
from notifyq._durable.policies import (
    ConcurrencyPolicy,
    DedupePolicy,
    ReplayFrom,
    Scope,
    key_for,
)
from notifyq._enqueue.bulk import Batch
from notifyq._enqueue.validate import (
    MAX_INPUT_BYTES,
    EnqueueRequest,
    Prepared,
    coerce_requests,
    encode_input,
    prepare,
    translated_errors,
)
from notifyq._errors import ConfigError, PayloadTooLarge
from notifyq._notifier import WakeSender, wake_payload
from notifyq._registry import HandlerSpec, PeriodicSpec, Registry
from notifyq._run import Run
from notifyq._settings import Settings, load_settings

if TYPE_CHECKING:
    from notifyq._keys.columns import EncryptedColumn
    from notifyq._keys.keyring import Keyring

log = logging.getLogger("notifyq")

T = TypeVar("T")


class App:
    """A notifyq application: register handlers, enqueue runs, run workers.

    Example::

        app = App()  # NOTIFYQ_DATABASE_URL, schema "notifyq"

        @app.handler("email.send", retry=RetryPolicy(attempts=5), timeout_s=30)
        async def send_email(ctx: JobContext) -> dict:
            return {"to": ctx.input["to"]}

        run = await app.enqueue("email.send", {"to": "a@b.c"})
        await app.run_worker(concurrency=10)
    """

    def __init__(self, dsn: str | None = None, *, schema: str | None = None,
                 settings: Settings | None = None, clock: Clock | None = None) -> None:
        overrides: dict[str, Any] = {}
        if dsn is not None:
            overrides["database_url"] = dsn
        if schema is not None:
            overrides["schema_name"] = schema
        if settings is None:
            settings = load_settings(**overrides)
        elif overrides:
            settings = settings.model_copy(update=overrides)
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.registry = Registry(settings.env)
        self.queries: Queries = queries_for(settings.schema_name)
        self.runs = RunControl(self.queries, self.clock)
        self._pool: AsyncConnectionPool[AsyncConn] | None = None
        self._sync_pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] | None = None
        self._waker: WakeSender | None = None
        self._open_lock = anyio.Lock()
        self._init_keys()
        self._init_webhooks()

    # -- secrets at rest ----------------------------------------------------------------------

    def _init_keys(self) -> None:
        from notifyq._keys.admin import REENCRYPT, KeyAdmin
        from notifyq._keys.columns import EncryptedColumns
        from notifyq._keys.reencrypt import Reencryptor

        self._keyring: Keyring | None = None
        self.keys = KeyAdmin(self)
        """Key administration: ``sync``, ``status``, ``rotate``, ``retire``."""
        self.encrypted_columns = EncryptedColumns()
        for column in self.settings.encrypted_columns:
            self.encrypted_columns.register(column.table, pk=column.pk, column=column.column)
        if self.has_keyring:
            self.handler(REENCRYPT, retry=RetryPolicy(attempts=25, base_s=1, max_s=300))(
                Reencryptor(self))

    def _init_webhooks(self) -> None:
        from notifyq._webhooks.deliver import Deliverer
        from notifyq._webhooks.service import DELIVER, POOL, Webhooks

        self.webhooks = Webhooks(self)
        """Webhook endpoints and messages: ``create_endpoint``, ``send``, ``attempts``,
        ``resend``, ``recover`` (see notifyq/webhooks/service.py)."""
        self.deliverer = Deliverer(self)
        self.handler(DELIVER, pool=POOL, timeout_s=self.settings.webhooks.timeout_s + 30,
                     retry=RetryPolicy(attempts=100, base_s=1, max_s=300))(self.deliverer)

    @property
    def has_keyring(self) -> bool:
        return self.settings.keys is not None or self.settings.key_file is not None

    @property
    def keyring(self) -> Keyring:
        """The master keys from ``NOTIFYQ_KEYS`` / ``NOTIFYQ_KEY_FILE`` and
        ``NOTIFYQ_ACTIVE_KEY_VERSION``, built on first use. Workers check it against the
        database at start (``app.keys.sync``)."""
        if self._keyring is None:
            from notifyq._keys.keyring import Keyring, configured_keys

            keys = self.settings.keys
            try:
                found = configured_keys(keys.get_secret_value() if keys else None,
                                        self.settings.key_file, self.settings.active_key_version)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if found is None:
                raise ConfigError("no keyring is configured: set NOTIFYQ_KEYS (or "
                                  "NOTIFYQ_KEY_FILE) and NOTIFYQ_ACTIVE_KEY_VERSION")
            self._keyring = Keyring(found[0], active=found[1])
        return self._keyring

    def encrypted_column(self, table: str, *, pk: str = "id", column: str) -> EncryptedColumn:
        """Register one of your ``bytea`` columns of notifyq ciphertexts (``schema.table``) so
        key rotation re-encrypts it; returns it (``.context(row_id)`` for encrypt/decrypt)."""
        return self.encrypted_columns.register(table, pk=pk, column=column)

    # -- registration -------------------------------------------------------------------------

    def handler(self, job_type: str, *, retry: RetryPolicy | None = None,
                timeout_s: float | None = None, pool: str = "default", priority: int = 0,
                version: int = 1, concurrency: ConcurrencyPolicy | None = None,
                dedupe: DedupePolicy | None = None, scope: Scope | None = None,
                replay_from: ReplayFrom = "last_step") -> Callable[[T], T]:
        """Register a handler: an async function, a sync function (run in a worker thread), or
        a class / instance with a ``handle(ctx)`` method.

        Policies: ``retry`` (attempts and backoff), ``timeout_s``, ``concurrency`` (at most N
        running per key), ``dedupe`` (one run per key within a window), ``scope`` (the entity
        a run is about), ``replay_from`` (which memoized steps a retry reuses).
        """
        def register(target: T) -> T:
            self.registry.register(job_type, target, retry=retry, timeout_s=timeout_s,
                                   pool=pool, priority=priority, version=version,
                                   concurrency=concurrency, dedupe=dedupe, scope=scope,
                                   replay_from=replay_from)
            return target
        return register

    def periodic(self, job_type: str | None = None, *, every: timedelta,
                 input: Mapping[str, Any] | list[Any] | None = None,
                 **handler_options: Any) -> Callable[[T], T]:
        """Enqueue one run per tick of ``every``, cluster-wide, however many workers run.

        Stack it on ``@app.handler(...)``, or give ``job_type`` to register the handler too::

            @app.periodic(every=timedelta(minutes=5))
            @app.handler("report.build")
            async def build_report(ctx): ...
        """
        if every < timedelta(milliseconds=100):
            raise ConfigError(f"periodic every must be at least 100 ms, got {every}")

        def register(target: T) -> T:
            name = job_type
            if name is None:
                name = self.registry.type_of(target)
                if name is None:
                    raise ConfigError("@app.periodic needs job_type=... or an @app.handler below")
            else:
                self.handler(name, **handler_options)(target)
            self.registry.periodic.append(PeriodicSpec(name, every, dict(input or {})
                                                       if not isinstance(input, list) else input))
            return target
        return register

    # -- connections --------------------------------------------------------------------------

    async def pool(self) -> AsyncConnectionPool[AsyncConn]:
        """The app's connection pool, opened on first use."""
        if self._pool is None:
            async with self._open_lock:
                if self._pool is None:
                    dsn = require_dsn(self.settings.database_url)
                    pool = await open_pool(dsn, max_size=self.settings.pool_max_size)
                    self._waker = WakeSender(pool, self.queries)
                    self._pool = pool
        return self._pool

    async def close(self) -> None:
        await self.deliverer.aclose()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._sync_pool is not None:
            self._sync_pool.close()
            self._sync_pool = None

    async def __aenter__(self) -> App:
        await self.pool()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations; return the names applied."""
        async with (await self.pool()).connection() as conn:
            applied = await migrations.migrate(conn, self.settings.schema_name)
        return [f"{m.version:04d}_{m.name}" for m in applied]

    # -- enqueue ------------------------------------------------------------------------------

    async def enqueue(self, job_type: str, input: Any = None, *,
                      run_at: datetime | None = None, priority: int | None = None,
                      pool: str | None = None, max_attempts: int | None = None,
                      dedupe_key: str | None = None, tags: Sequence[str] | None = None,
                      tenant_id: str | None = None, allow_unknown_type: bool | None = None,
                      conn: psycopg.AsyncConnection[Any] | None = None) -> Run:
        """Enqueue one run and return it (the existing run when ``dedupe_key`` matched).

        With ``conn``, the row is written in that connection's open transaction and workers
        are woken when it commits; a rollback leaves nothing behind.

        Once any worker has registered handlers, a type that no worker has registered (and
        this app has no handler for) raises :class:`~notifyq._errors.UnknownJobType`;
        ``allow_unknown_type=True`` accepts it (default: the ``enqueue.allow_unknown_types``
        setting).
        """
        run, _ = await self.enqueue_request(EnqueueRequest(
            job_type=job_type, input={} if input is None else input, run_at=run_at,
            priority=priority, pool=pool, max_attempts=max_attempts, dedupe_key=dedupe_key,
            tags=tags, tenant_id=tenant_id), conn=conn, allow_unknown_type=allow_unknown_type)
        return run

    async def enqueue_request(self, request: EnqueueRequest, *,
                              conn: psycopg.AsyncConnection[Any] | None = None,
                              allow_unknown_type: bool | None = None) -> tuple[Run, bool]:
        """:meth:`enqueue` from an :class:`EnqueueRequest`; also says whether the run was
        created (False: a dedupe key matched an existing run, which is returned)."""
        prepared = self._prepare(request)
        accept = self._accepts(request.job_type, allow_unknown_type)
        run = await self._enqueue_prepared(prepared, conn, accept)
        return run, run.id == prepared.id

    def _accepts(self, job_type: str, allow_unknown_type: bool | None) -> bool:
        """Whether ``job_type`` is enqueued even if no worker has registered it: the caller
        (or the setting) says so, or this app has a handler for it (its worker will register
        it with that definition)."""
        if allow_unknown_type is None:
            allow_unknown_type = self.settings.enqueue.allow_unknown_types
        return allow_unknown_type or self.registry.get(job_type) is not None

    async def _enqueue_prepared(self, prepared: Prepared,
                                conn: psycopg.AsyncConnection[Any] | None, accept: bool) -> Run:
        if conn is not None:
            return await self._enqueue_on(conn, prepared, notify=True, accept=accept)
        db = await self.pool()
        waker = self._waker
        if waker is None:  # pragma: no cover - set by pool()
            raise RuntimeError("app is not open")
        with waker.enqueueing() as inline:
            async with db.connection() as own:
                if prepared.request.needs_locks:
                    run = await self._enqueue_on(own, prepared, notify=inline, accept=accept)
                else:
                    run = await self._insert_plain(own, prepared, notify=inline, accept=accept)
        if not inline:
            await waker.wake({run.pool})
        return run

    async def _insert_plain(self, conn: psycopg.AsyncConnection[Any], prepared: Prepared, *,
                            notify: bool, accept: bool) -> Run:
        """A run without dedupe or concurrency keys, validated here already: a plain INSERT
        (the bulk statement with one row) instead of the plpgsql function, with the NOTIFY in
        the same statement when asked. Server time per enqueue: 200 us (function) -> 25 us."""
        with translated_errors():
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(self.queries.job_run_insert_many, {
                    "rows": f"[{prepared.record()}]", "notify": notify,
                    "channel": self.queries.schema,
                    "accept_types": [prepared.request.job_type] if accept else None})
                row = await cur.fetchone()
        if row is None:
            raise await self._too_large(conn, prepared)
        row["input"] = prepared.request.input
        return Run.from_row(row)

    async def _too_large(self, conn: psycopg.AsyncConnection[Any],
                         prepared: Prepared) -> PayloadTooLarge:
        """The insert left this row out: its input is too large as the database prints it."""
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.queries.job_run_input_size, {"input": prepared.input_json})
            row = await cur.fetchone()
        return PayloadTooLarge(int(row["size"]) if row else 0, MAX_INPUT_BYTES)

    async def enqueue_many(self, items: Iterable[EnqueueRequest | Mapping[str, Any]], *,
                           conn: psycopg.AsyncConnection[Any] | None = None,
                           allow_unknown_type: bool | None = None) -> list[Run]:
        """Enqueue many runs in one transaction and one statement, with one NOTIFY per pool.
        Returns the runs in the order given, which is also the order they run in at equal
        priority and run_at. A type no worker has registered refuses the whole batch
        (:class:`~notifyq._errors.UnknownJobType`), as :meth:`enqueue` says."""
        batch = self._batch(coerce_requests(items))
        if not batch:
            return []
        if conn is not None:
            async with conn.transaction():
                runs = await self._insert_many(conn, batch, allow_unknown_type)
                await self._notify_pools(conn, {r.pool for r in runs})
            return runs
        db = await self.pool()
        async with db.connection() as own, own.transaction():
            runs = await self._insert_many(own, batch, allow_unknown_type)
        await self._wake({r.pool for r in runs})
        return runs

    def enqueue_sync(self, job_type: str, input: Any = None, *,
                     run_at: datetime | None = None, priority: int | None = None,
                     pool: str | None = None, max_attempts: int | None = None,
                     dedupe_key: str | None = None, tags: Sequence[str] | None = None,
                     tenant_id: str | None = None, allow_unknown_type: bool | None = None,
                     conn: psycopg.Connection[Any] | None = None) -> Run:
        """:meth:`enqueue` for synchronous code (Django, Flask, scripts)."""
        prepared = self._prepare(EnqueueRequest(
            job_type=job_type, input={} if input is None else input, run_at=run_at,
            priority=priority, pool=pool, max_attempts=max_attempts, dedupe_key=dedupe_key,
            tags=tags, tenant_id=tenant_id))
        accept = self._accepts(job_type, allow_unknown_type)
        if conn is not None:
            return self._enqueue_on_sync(conn, prepared, accept)
        with self._sync().connection() as own:
            return self._enqueue_on_sync(own, prepared, accept)

    async def _wake(self, pools: set[str]) -> None:
        if self._waker is not None:
            await self._waker.wake(pools)

    def _prepare(self, request: EnqueueRequest) -> Prepared:
        # Defaults from a handler registered in this app, so they hold even before any worker
        # has upserted the job definition the SQL function would otherwise apply.
        spec = self.registry.get(request.job_type) if isinstance(request.job_type, str) else None
        if spec is not None:
            request = dataclasses.replace(
                request,
                max_attempts=spec.retry.attempts if request.max_attempts is None
                else request.max_attempts,
                pool=spec.pool if request.pool is None else request.pool,
                priority=spec.priority if request.priority is None else request.priority,
                **_policy_fields(spec, request))
        return prepare(request, self.settings.max_input_bytes)

    def _batch(self, requests: list[EnqueueRequest]) -> Batch:
        """Validate every request (the first bad one raises), as :meth:`_prepare` would, but
        without copying the plain ones: a handler's defaults travel beside the request."""
        batch = Batch(self.settings.max_input_bytes)
        for request in requests:
            job_type = request.job_type
            spec = self.registry.get(job_type) if isinstance(job_type, str) else None
            if request.needs_locks or (spec is not None and _has_policies(spec)):
                batch.add_prepared(self._prepare(request))
            elif spec is None:
                batch.add(request, (request.pool, request.priority, request.max_attempts))
            else:
                batch.add(request, (
                    spec.pool if request.pool is None else request.pool,
                    spec.priority if request.priority is None else request.priority,
                    spec.retry.attempts if request.max_attempts is None
                    else request.max_attempts))
        return batch

    async def _enqueue_on(self, conn: psycopg.AsyncConnection[Any], prepared: Prepared, *,
                          notify: bool, accept: bool) -> Run:
        with translated_errors():
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(self.queries.job_run_enqueue,
                                  prepared.params(notify=notify, allow_unknown_type=accept))
                return _enqueued(await cur.fetchone())

    def _enqueue_on_sync(self, conn: psycopg.Connection[Any], prepared: Prepared,
                         accept: bool) -> Run:
        with translated_errors(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self.queries.job_run_enqueue,
                        prepared.params(notify=True, allow_unknown_type=accept))
            return _enqueued(cur.fetchone())

    async def _insert_many(self, conn: psycopg.AsyncConnection[Any], batch: Batch,
                           allow_unknown_type: bool | None) -> list[Run]:
        plain: list[Run] = []
        if batch.requests:
            ids, params = batch.params()
            params["accept_types"] = [t for t in params["types"]
                                      if self._accepts(t, allow_unknown_type)] or None
            with translated_errors():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(self.queries.job_run_insert_bulk, params)
                    summary = await cur.fetchall()
            if summary[0]["inserted"] < len(ids):  # the caller's transaction (or ours) rolls
                raise await self._first_too_large(conn, batch.inputs)  # the batch back
            plain = batch.runs(ids, summary)
        return [await self._enqueue_on(conn, at, notify=False, accept=self._accepts(
                    at.request.job_type, allow_unknown_type))
                if isinstance(at, Prepared) else at
                for at in batch.order(plain)]

    async def _first_too_large(self, conn: psycopg.AsyncConnection[Any],
                               inputs: list[str]) -> PayloadTooLarge:
        """The bulk insert left rows out: the first input too large as the database prints it
        (an error path: one round trip per input until found)."""
        async with conn.cursor(row_factory=dict_row) as cur:
            for text in inputs:
                await cur.execute(self.queries.job_run_input_size, {"input": text})
                row = await cur.fetchone()
                if row is not None and row["size"] > MAX_INPUT_BYTES:
                    return PayloadTooLarge(int(row["size"]), MAX_INPUT_BYTES)
        raise RuntimeError("the bulk insert left a run out, yet no input is too large")

    async def _notify_pools(self, conn: psycopg.AsyncConnection[Any], pools: set[str]) -> None:
        await conn.execute(self.queries.job_run_notify, {
            "channel": self.queries.schema, "payloads": [wake_payload(p) for p in pools]})

    def _sync(self) -> ConnectionPool[psycopg.Connection[dict[str, Any]]]:
        if self._sync_pool is None:
            dsn = require_dsn(self.settings.database_url)
            check_connection_sync(dsn)  # a bad DSN fails now with its cause, not in 30 s
            self._sync_pool = ConnectionPool(
                dsn, min_size=1, max_size=self.settings.pool_max_size,
                kwargs={"autocommit": True, "row_factory": dict_row,
                        "application_name": "notifyq"},
                connection_class=psycopg.Connection[dict[str, Any]], open=True)
        return self._sync_pool

    # -- run control --------------------------------------------------------------------------

    async def get_run(self, run_id: UUID | str) -> Run:
        """The run as stored; :class:`~notifyq._errors.RunNotFound` for an unknown id."""
        async with (await self.pool()).connection() as conn:
            return await self.runs.get(conn, _uuid(run_id))

    async def list_runs(self, **filters: Any) -> list[Run]:
        async with (await self.pool()).connection() as conn:
            return await self.runs.list_runs(conn, **filters)

    async def runs_for_scope(self, entity: str, entity_id: str, *, limit: int = 50,
                             before: UUID | None = None) -> list[Run]:
        """The runs about one business entity (see ``Scope``), newest first."""
        return await self.list_runs(scope_entity_type=entity, scope_entity_id=entity_id,
                                    limit=limit, before=before)

    async def signal(self, token: str, payload: Any = None) -> int:
        """Send a signal to ``ctx.wait_for_signal(token)``. It is delivered once: to the run
        waiting on ``token`` the longest (returns 1), or, when none waits, queued for the next
        wait on it, oldest first (returns 0), until ``purger.signal_retention_s`` expires it."""
        if not isinstance(token, str) or not 0 < len(token) <= 512:
            raise ValueError("signal token must be a string of 1 to 512 characters")
        encode_input([payload])  # JSON and size check, same as an input
        async with (await self.pool()).connection() as conn:
            return await self.runs.signal(conn, token, {} if payload is None else payload)

    async def steps(self, run_id: UUID | str) -> list[dict[str, Any]]:
        """A run's recorded steps in execution order (step_id, seq, kind, status, output,
        error, attempts, attempt, started_at, finished_at)."""
        async with (await self.pool()).connection() as conn:
            return await self.runs.steps(conn, _uuid(run_id))

    async def cancel(self, run_id: UUID | str) -> Run:
        """Cancel a pending or waiting run at once; ask a running one to stop (an async handler
        is cancelled, a sync one sees ``ctx.cancel_requested``)."""
        async with (await self.pool()).connection() as conn:
            return await self.runs.cancel(conn, _uuid(run_id))

    async def retry(self, run_id: UUID | str) -> Run:
        """Put a failed, canceled or timed-out run back in line now, with one more attempt."""
        async with (await self.pool()).connection() as conn:
            return await self.runs.retry(conn, _uuid(run_id))

    async def stats(self) -> Stats:
        async with (await self.pool()).connection() as conn:
            return await self.runs.stats(conn)

    # -- workers ------------------------------------------------------------------------------

    def worker(self, *, concurrency: int | None = None, pools: list[str] | None = None,
               burst: bool = False) -> Worker:
        """Build (not start) a worker; :meth:`run_worker` is the usual entry point."""
        if self._pool is None:
            raise RuntimeError("open the app first: await app.pool() or async with app")
        cfg = self.settings.worker
        if pools is None:
            pools = list(cfg.pools) if "pools" in cfg.model_fields_set else sorted(
                {"default", *self.registry.pools()})
        return Worker(
            db=self._pool, queries=self.queries, clock=self.clock, settings=self.settings,
            registry=self.registry,
            listen_dsn=self.settings.listen_database_url or self.settings.database_url,
            concurrency=concurrency or cfg.concurrency, pools=pools, burst=burst)

    async def run_worker(self, *, concurrency: int | None = None, pools: list[str] | None = None,
                         burst: bool = False,
                         task_status: TaskStatus[Worker] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run a worker in this process until cancelled (then shut down gracefully), or in
        burst mode until nothing is runnable. With ``await tg.start(app.run_worker)`` the caller
        gets the :class:`Worker` once it is built (``notifyq serve`` reads its counters)."""
        db = await self.pool()
        async with db.connection() as conn:
            await migrations.require_current(conn, self.settings.schema_name)
            if self.has_keyring:
                await self.keys.sync(conn)
            # One transaction: enqueuers see all of this worker's types registered or none (one
            # at a time, an enqueue of the next type was refused while the first was in). In
            # type order, so workers of different apps lock shared rows in the same order.
            async with conn.transaction():
                for spec in sorted(self.registry.specs(), key=lambda s: s.job_type):
                    params = spec.definition()
                    params["retry_policy"] = Jsonb(params["retry_policy"])
                    await conn.execute(self.queries.job_upsert, params)
                # Runs enqueued before these definitions existed take their defaults now.
                await conn.execute(self.queries.job_run_apply_definitions, {
                    "now": self.clock.db_now(), "channel": self.queries.schema})
        worker = self.worker(concurrency=concurrency, pools=pools, burst=burst)
        log.info("worker %s: pools %s, concurrency %d, handlers %s", worker.id,
                 ",".join(worker.producers), worker.slots.size,
                 ",".join(s.job_type for s in self.registry.specs()) or "-")
        task_status.started(worker)
        await worker.run()


def _enqueued(row: dict[str, Any] | None) -> Run:
    if row is None:  # pragma: no cover - _enqueue always returns a row
        raise RuntimeError("enqueue returned no row")
    return Run.from_row(row)


def _has_policies(spec: HandlerSpec) -> bool:
    return spec.concurrency is not None or spec.dedupe is not None or spec.scope is not None


def _policy_fields(spec: HandlerSpec, request: EnqueueRequest) -> dict[str, Any]:
    """The run's keys computed from the handler's policies (explicit values win)."""
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


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value)
    except ValueError:
        raise ValueError(f"not a run id (UUID): {value!r}") from None
