"""The application object: the user's facade over the runtime and the features it composes.

``App`` holds no logic of its own beyond wiring: enqueueing is :class:`~notifyq._enqueue.write.
Enqueuer`, run control :class:`~notifyq._control.RunControl`, keys :class:`~notifyq._keys.admin.
KeyAdmin`, webhooks :class:`~notifyq._webhooks.service.Webhooks`; each takes the
:class:`~notifyq._runtime.Runtime` and what else it uses, never the App.

The built-in job types are installed only where they can run: ``secret.reencrypt`` when a
keyring is configured, ``webhook.deliver`` (and with it the ``webhooks`` pool's producer) when
webhooks are enabled (``webhooks.enabled``, by default: when a keyring is configured, since
endpoint secrets are stored encrypted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from uuid import UUID

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from notifyq._awaiter import Awaiter
from notifyq._cadence import Cadence, Cron, Every
from notifyq._clock import Clock, SystemClock
from notifyq._control import RunControl, Stats, StepRow
from notifyq._db import migrate as migrations
from notifyq._db.pool import AsyncConn
from notifyq._dispatch.worker import Worker
from notifyq._enqueue.request import EnqueueRequest
from notifyq._enqueue.validate import encode_input
from notifyq._enqueue.write import Enqueuer
from notifyq._errors import ConfigError
from notifyq._keys.admin import REENCRYPT, KeyAdmin
from notifyq._keys.keeper import KeyKeeper
from notifyq._keys.reencrypt import Reencryptor
from notifyq._limits import MAX_SIGNAL_TOKEN_LEN
from notifyq._maintenance.scheduler import (
    schedule_list,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
)
from notifyq._pause import Pause, PauseControl
from notifyq._policies import (
    ConcurrencyPolicy,
    DedupePolicy,
    RateLimit,
    ReplayFrom,
    RetryPolicy,
    Scope,
)
from notifyq._registry import PeriodicSpec, Registry
from notifyq._run import Run, awaitable
from notifyq._runtime import Runtime
from notifyq._settings import Settings, load_settings
from notifyq._webhooks.deliver import Deliverer
from notifyq._webhooks.service import DELIVER, ENDPOINT_KEY, POOL, Webhooks

if TYPE_CHECKING:
    from notifyq._crypto.keyring import Keyring
    from notifyq._keys.columns import EncryptedColumn

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
        self.clock: Clock = clock or SystemClock()
        self._runtime = Runtime(settings, self.clock)
        self._registry = Registry(settings.env)
        self._enqueuer = Enqueuer(self._runtime, self._registry)
        self._control = RunControl(self._runtime.queries, self.clock)
        self._awaiter = Awaiter(self._runtime)
        self._pauses = PauseControl(self._runtime.queries, self.clock)
        self._columns = self._runtime.columns
        self.keys = KeyAdmin(self._runtime, self._enqueuer, self._control)
        """Key administration: ``sync``, ``status``, ``rotate``, ``retire``."""
        if self._runtime.has_keyring:
            self.handler(REENCRYPT, retry=RetryPolicy(attempts=25, base_s=1, max_s=300))(
                Reencryptor(self._runtime, self.keys))
        self._webhooks: Webhooks | None = None
        self._deliverer: Deliverer | None = None
        if self._webhooks_enabled():
            self._install_webhooks()

    @property
    def settings(self) -> Settings:
        """The validated settings (environment over ``notifyq.yaml`` over defaults)."""
        return self._runtime.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        # `serve` and the embedded database fill in what the process learns at start (the
        # embedded DSN, the bound port); every component reads them through the runtime.
        self._runtime.settings = settings

    # -- built-in features ---------------------------------------------------------------------

    def _webhooks_enabled(self) -> bool:
        enabled = self.settings.webhooks.enabled
        if enabled and not self._runtime.has_keyring:
            raise ConfigError("webhooks.enabled is true but no keyring is configured: webhook "
                              "secrets are stored encrypted, set NOTIFYQ_KEYS and "
                              "NOTIFYQ_ACTIVE_KEY_VERSION")
        return self._runtime.has_keyring if enabled is None else enabled

    def _install_webhooks(self) -> None:
        self._webhooks = Webhooks(self._runtime, self._columns)
        self._deliverer = Deliverer(self._runtime, self._webhooks.secret_column,
                                    self._webhooks.header_column)
        # One concurrency key per endpoint: the queue's keyed claim gives each endpoint at
        # most `endpoint_concurrency` of the delivery slots, in SQL, across all workers.
        self.handler(DELIVER, pool=POOL, timeout_s=self.settings.webhooks.timeout_s + 30,
                     retry=RetryPolicy(attempts=100, base_s=1, max_s=300),
                     concurrency=ConcurrencyPolicy(
                         key=ENDPOINT_KEY, limit=self.settings.webhooks.endpoint_concurrency),
                     )(self._deliverer)

    @property
    def webhooks(self) -> Webhooks:
        """Webhook endpoints and messages: ``create_endpoint``, ``send``, ``attempts``,
        ``resend``, ``recover``. Enabled when a keyring is configured (``webhooks.enabled``)."""
        if self._webhooks is None:
            raise ConfigError("webhooks are not enabled: configure a keyring (NOTIFYQ_KEYS and "
                              "NOTIFYQ_ACTIVE_KEY_VERSION; endpoint secrets are stored "
                              "encrypted), or remove webhooks.enabled=false")
        return self._webhooks

    @property
    def has_keyring(self) -> bool:
        return self._runtime.has_keyring

    @property
    def keyring(self) -> Keyring:
        """The master keys from ``NOTIFYQ_KEYS`` / ``NOTIFYQ_KEY_FILE`` and
        ``NOTIFYQ_ACTIVE_KEY_VERSION``, built on first use. It checks itself against the
        database before its first encrypt or decrypt and every ``key_check_interval_s`` after
        (two short statements on the app's synchronous pool; ``await app.keys.sync()`` at
        start does the first one without blocking): a wrong key raises ``ConfigError``, a
        retired version no longer decrypts, and it encrypts under the cluster's active version
        (``notifyq keys promote``), refusing with ``ConfigError`` when it does not hold it."""
        return self._runtime.keyring

    def encrypted_column(self, table: str, *, pk: str = "id", column: str) -> EncryptedColumn:
        """Register one of your ``bytea`` columns of notifyq ciphertexts (``schema.table``) so
        key rotation re-encrypts it; returns it (``.context(row_id)`` for encrypt/decrypt)."""
        return self._columns.register(table, pk=pk, column=column)

    # -- registration -------------------------------------------------------------------------

    def handler(self, job_type: str, *, retry: RetryPolicy | None = None,
                timeout_s: float | None = None, pool: str = "default", priority: int = 0,
                version: int = 1, concurrency: ConcurrencyPolicy | None = None,
                dedupe: DedupePolicy | None = None, scope: Scope | None = None,
                replay_from: ReplayFrom = "last_step",
                rate_limit: RateLimit | None = None) -> Callable[[T], T]:
        """Register a handler: an async function, a sync function (run in a worker thread), or
        a class / instance with a ``handle(ctx)`` method.

        Policies: ``retry`` (attempts and backoff), ``timeout_s``, ``concurrency`` (at most N
        running per key), ``dedupe`` (one run per key within a window), ``scope`` (the entity
        a run is about), ``replay_from`` (which memoized steps a retry reuses), ``rate_limit``
        (at most N runs started per period, per type or per key).
        """
        def register(target: T) -> T:
            self._registry.register(job_type, target, retry=retry, timeout_s=timeout_s,
                                   pool=pool, priority=priority, version=version,
                                   concurrency=concurrency, dedupe=dedupe, scope=scope,
                                   replay_from=replay_from, rate_limit=rate_limit)
            return target
        return register

    def periodic(self, job_type: str | None = None, *, every: timedelta | None = None,
                 cron: str | None = None, tz: str | None = None, name: str | None = None,
                 catch_up: bool = False, input: Mapping[str, Any] | list[Any] | None = None,
                 **handler_options: Any) -> Callable[[T], T]:
        """Enqueue one run per tick, cluster-wide, however many workers run: every ``every``
        (aligned to the Unix epoch), or at the times the 5-field ``cron`` expression matches in
        the IANA time zone ``tz`` (defaults to UTC; each matching wall-clock time runs once
        across daylight-saving changes). ``catch_up=True`` also enqueues the ticks missed while
        no worker ran (oldest first); by default they are skipped. ``name`` (defaults to
        ``type@cron(expression, tz)`` or ``type@<ms>ms``) is what pause and resume take.

        Stack it on ``@app.handler(...)``, or give ``job_type`` to register the handler too::

            @app.periodic(cron="0 9 * * MON-FRI", tz="Europe/Berlin", name="report.daily")
            @app.handler("report.build")
            async def build_report(ctx): ...
        """
        spec = _periodic_spec(every=every, cron=cron, tz=tz, name=name, catch_up=catch_up,
                              input=input)

        def register(target: T) -> T:
            kind = job_type
            if kind is None:
                kind = self._registry.type_of(target)
                if kind is None:
                    raise ConfigError("@app.periodic needs job_type=... or an @app.handler below")
            else:
                self.handler(kind, **handler_options)(target)
            self._registry.add_periodic(replace(spec, job_type=kind))
            return target
        return register

    # -- connections --------------------------------------------------------------------------

    async def pool(self) -> AsyncConnectionPool[AsyncConn]:
        """The app's connection pool, opened on first use."""
        return await self._runtime.pool()

    async def close(self) -> None:
        if self._deliverer is not None:
            await self._deliverer.aclose()
        await self._runtime.close()

    async def __aenter__(self) -> App:
        await self.pool()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations; return the names applied."""
        async with self._runtime.connection() as conn:
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
        this app has no handler for) raises :class:`~notifyq.UnknownJobType`;
        ``allow_unknown_type=True`` accepts it (default: the ``enqueue.allow_unknown_types``
        setting).

        notifyq's own job types (``webhook.deliver``, ``secret.reencrypt``) raise
        :class:`~notifyq.InvalidEnqueue`: :attr:`webhooks` and :attr:`keys` enqueue them.
        """
        run, _ = await self._enqueuer.enqueue(_request(
            job_type, input, run_at=run_at, priority=priority, pool=pool,
            max_attempts=max_attempts, dedupe_key=dedupe_key, tags=tags, tenant_id=tenant_id),
            conn=conn, allow_unknown_type=allow_unknown_type)
        return awaitable(run, self._awaiter)

    async def enqueue_request(self, request: EnqueueRequest, *,
                              conn: psycopg.AsyncConnection[Any] | None = None,
                              allow_unknown_type: bool | None = None) -> tuple[Run, bool]:
        """:meth:`enqueue` from an :class:`EnqueueRequest`; also says whether the run was
        created (False: a dedupe key matched an existing run, which is returned)."""
        run, created = await self._enqueuer.enqueue(request, conn=conn,
                                                    allow_unknown_type=allow_unknown_type)
        return awaitable(run, self._awaiter), created

    async def enqueue_many(self, items: Iterable[EnqueueRequest | Mapping[str, Any]], *,
                           conn: psycopg.AsyncConnection[Any] | None = None,
                           allow_unknown_type: bool | None = None) -> list[Run]:
        """Enqueue many runs in one transaction, all or nothing, with one NOTIFY per pool
        (one INSERT, or a COPY from 300 runs on). Returns the runs in the order given, which is
        also the order they run in at equal priority and run_at. A type no worker has
        registered refuses the whole batch (:class:`~notifyq.UnknownJobType`), as
        :meth:`enqueue` says."""
        runs = await self._enqueuer.enqueue_many(items, conn=conn,
                                                 allow_unknown_type=allow_unknown_type)
        for run in runs:
            awaitable(run, self._awaiter)
        return runs

    def enqueue_sync(self, job_type: str, input: Any = None, *,
                     run_at: datetime | None = None, priority: int | None = None,
                     pool: str | None = None, max_attempts: int | None = None,
                     dedupe_key: str | None = None, tags: Sequence[str] | None = None,
                     tenant_id: str | None = None, allow_unknown_type: bool | None = None,
                     conn: psycopg.Connection[Any] | None = None) -> Run:
        """:meth:`enqueue` for synchronous code (Django, Flask, scripts)."""
        return awaitable(self._enqueuer.enqueue_sync(_request(
            job_type, input, run_at=run_at, priority=priority, pool=pool,
            max_attempts=max_attempts, dedupe_key=dedupe_key, tags=tags, tenant_id=tenant_id),
            conn=conn, allow_unknown_type=allow_unknown_type), self._awaiter)

    # -- run control --------------------------------------------------------------------------

    async def get_run(self, run_id: UUID | str) -> Run:
        """The run as stored; :class:`~notifyq._errors.RunNotFound` for an unknown id."""
        async with self._runtime.connection() as conn:
            return awaitable(await self._control.get(conn, _uuid(run_id)), self._awaiter)

    async def wait(self, run_id: UUID | str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Wait until the run is finished and return its output; what ``run.result()`` does.

        Raises :class:`~notifyq.RunFailed` (``status`` and the stored ``error``) when the run
        ended failed, timed_out or canceled, :class:`~notifyq.ResultTimeout` (a
        ``TimeoutError``) after ``timeout`` seconds (None: no limit), and
        :class:`~notifyq.RunNotFound` for an unknown id. Woken by the run's completion NOTIFY
        (re-read every few seconds in case one is missed), not by polling::

            run = await app.enqueue("report.build", {"day": "2026-12-01"})
            report = await app.wait(run.id, timeout=60)
        """
        return await self._awaiter.wait(_uuid(run_id), timeout)

    async def list_runs(self, **filters: Any) -> list[Run]:
        async with self._runtime.connection() as conn:
            return await self._control.list_runs(conn, **filters)

    async def runs_for_scope(self, entity: str, entity_id: str, *, limit: int = 50,
                             before: UUID | None = None) -> list[Run]:
        """The runs about one business entity (see ``Scope``), newest first."""
        return await self.list_runs(scope_entity_type=entity, scope_entity_id=entity_id,
                                    limit=limit, before=before)

    async def signal(self, token: str, payload: Any = None) -> int:
        """Send a signal to ``ctx.wait_for_signal(token)``. It is delivered once: to the run
        waiting on ``token`` the longest (returns 1), or, when none waits, queued for the next
        wait on it, oldest first (returns 0), until ``purger.signal_retention_s`` expires it."""
        if not isinstance(token, str) or not 0 < len(token) <= MAX_SIGNAL_TOKEN_LEN:
            raise ValueError(f"signal token must be a string of 1 to {MAX_SIGNAL_TOKEN_LEN} "
                             "characters")
        encode_input([payload])  # JSON and size check, same as an input
        async with self._runtime.connection() as conn:
            return await self._control.signal(conn, token, {} if payload is None else payload)

    async def steps(self, run_id: UUID | str) -> list[StepRow]:
        """A run's recorded steps in execution order: dicts of step_id, seq, kind, status,
        output, error, attempts, attempt, started_at, finished_at."""
        async with self._runtime.connection() as conn:
            return await self._control.steps(conn, _uuid(run_id))

    async def cancel(self, run_id: UUID | str) -> Run:
        """Cancel a pending or waiting run at once; ask a running one to stop (an async handler
        is cancelled, a sync one sees ``ctx.cancel_requested``)."""
        async with self._runtime.connection() as conn:
            return await self._control.cancel(conn, _uuid(run_id))

    async def retry(self, run_id: UUID | str) -> Run:
        """Put a failed, canceled or timed-out run back in line now, with one more attempt."""
        async with self._runtime.connection() as conn:
            return awaitable(await self._control.retry(conn, _uuid(run_id)), self._awaiter)

    async def replay(self, run_id: UUID | str, *, from_step: str) -> Run:
        """Run a finished (completed, failed, timed-out or canceled) durable run again from the
        step ``from_step``: the steps it recorded before that one are reused, not run again
        (whatever the handler's ``replay_from``); ``from_step`` and the later steps run again.
        Returns the run, pending again (``await run.result()`` waits for the replay).

        Raises :class:`~notifyq.RunNotFound`, :class:`~notifyq.InvalidTransition` (the run is
        still live, or recorded no steps) and :class:`~notifyq.UnknownStep` (its message lists
        the run's steps)::

            run = await app.replay(run_id, from_step="charge")
        """
        async with self._runtime.connection() as conn:
            done = await self._control.replay(conn, _uuid(run_id), from_step)
        return awaitable(done.run, self._awaiter)

    async def stats(self) -> Stats:
        async with self._runtime.connection() as conn:
            return await self._control.stats(conn)

    async def schedules(self) -> list[dict[str, Any]]:
        """Every periodic schedule (any worker's, and this app's own) with its cadence, paused
        state, last tick (with that run's id and status) and next tick."""
        async with self._runtime.connection() as conn:
            return await schedule_list(conn, self._runtime.queries, self._registry.periodic,
                                       self.clock.now())

    async def pause_schedule(self, name: str) -> dict[str, Any]:
        """Stop a schedule ticking on every node (stored in the database) until resumed;
        :class:`~notifyq._errors.ScheduleNotFound` for an unknown name."""
        async with self._runtime.connection() as conn:
            return await schedule_pause(conn, self._runtime.queries, name, self.clock.db_now())

    async def resume_schedule(self, name: str) -> dict[str, Any]:
        """Let a paused schedule tick again from its next tick; the ticks that fell due while it
        was paused are skipped, even with ``catch_up``."""
        async with self._runtime.connection() as conn:
            return await schedule_resume(conn, self._runtime.queries, name, self.clock.db_now())

    async def trigger_schedule(self, name: str) -> dict[str, Any]:
        """Enqueue one run of a schedule now, with the input its worker declared, outside its
        cadence (the next tick still comes when it is due): ``{"name", "run_id"}``. Runs even
        while the schedule is paused (a deliberate act); ScheduleNotFound for an unknown
        name."""
        async with self._runtime.connection() as conn:
            return await schedule_trigger(conn, self._runtime.queries, name)

    # -- pause and resume ---------------------------------------------------------------------

    async def pause(self, *, pool: str | None = None, job_type: str | None = None,
                    reason: str | None = None) -> Pause:
        """Stop every worker claiming the runs of a pool or of a job type (one of the two),
        from its next claim on; pending runs stay pending, running ones finish. Pausing again
        keeps the first ``paused_at``. ::

            await app.pause(pool="reports", reason="nightly load test")
            await app.resume(pool="reports")
        """
        kind, name = _pause_target(pool, job_type)
        async with self._runtime.connection() as conn:
            paused, _ = await self._pauses.pause(conn, kind, name, reason=reason)
        return paused

    async def resume(self, *, pool: str | None = None, job_type: str | None = None) -> bool:
        """Let workers claim a paused pool's or type's runs again (woken at once); False when
        it was not paused."""
        kind, name = _pause_target(pool, job_type)
        async with self._runtime.connection() as conn:
            return await self._pauses.resume(conn, kind, name) is not None

    async def paused(self) -> list[Pause]:
        """The paused pools and job types."""
        async with self._runtime.connection() as conn:
            return await self._pauses.list(conn)

    # -- workers ------------------------------------------------------------------------------

    def worker(self, *, concurrency: int | None = None, pools: list[str] | None = None,
               burst: bool = False) -> Worker:
        """Build (not start) a worker; :meth:`run_worker` is the usual entry point."""
        db = self._runtime.opened
        if db is None:
            raise RuntimeError("open the app first: await app.pool() or async with app")
        cfg = self.settings.worker
        if pools is None:
            pools = list(cfg.pools) if "pools" in cfg.model_fields_set else sorted(
                {"default", *self._registry.pools()})
        return Worker(
            db=db, queries=self._runtime.queries, clock=self.clock, settings=self.settings,
            registry=self._registry,
            listen_dsn=self.settings.listen_url,
            concurrency=concurrency or cfg.concurrency, pools=pools, burst=burst,
            retry_shares={POOL: self.settings.webhooks.retry_share}
            if self._webhooks is not None else None)

    async def run_worker(self, *, concurrency: int | None = None, pools: list[str] | None = None,
                         burst: bool = False,
                         task_status: TaskStatus[Worker] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run a worker in this process until cancelled (then shut down gracefully), or in
        burst mode until nothing is runnable. With ``await tg.start(app.run_worker)`` the caller
        gets the :class:`Worker` once it is built (``notifyq serve`` reads its counters)."""
        db = await self.pool()
        holder = self._runtime.key_holder
        if holder.role != "serve":
            holder.role = "worker"
        async with db.connection() as conn:
            await migrations.require_current(conn, self.settings.schema_name)
            if self.has_keyring:
                await self.keys.sync(conn)
            if self._webhooks is not None:
                await self._webhooks.seal_clear_headers()
            # One transaction: enqueuers see all of this worker's types registered or none (one
            # at a time, an enqueue of the next type was refused while the first was in). In
            # type order, so workers of different apps lock shared rows in the same order.
            async with conn.transaction():
                for spec in sorted(self._registry.specs(), key=lambda s: s.job_type):
                    params = spec.definition()
                    params["retry_policy"] = Jsonb(params["retry_policy"])
                    await conn.execute(self._runtime.queries.job_upsert, params)
                # Runs enqueued before these definitions existed take their defaults now.
                await conn.execute(self._runtime.queries.job_run_apply_definitions, {
                    "now": self.clock.db_now(), "channel": self._runtime.queries.schema})
        worker = self.worker(concurrency=concurrency, pools=pools, burst=burst)
        if worker.notifier is not None:  # waits in this process ride the worker's listener
            self._awaiter.share(worker.notifier)
        log.info("worker %s: pools %s, concurrency %d, handlers %s", worker.id,
                 ",".join(worker.producers), worker.concurrency,
                 ",".join(s.job_type for s in self._registry.specs()) or "-")
        share = self.settings.webhooks.endpoint_concurrency
        if self._webhooks is not None and POOL in worker.producers and (
                share >= worker.concurrency):
            log.warning("webhooks.endpoint_concurrency (%d) is not below this worker's "
                        "concurrency (%d): one slow endpoint can take all its slots until its "
                        "circuit opens", share, worker.concurrency)
        task_status.started(worker)
        if not self.has_keyring:
            await worker.run()
            return
        keeper = KeyKeeper(self._runtime)
        if worker.notifier is not None:  # a promotion or retirement reaches it at once
            worker.notifier.subscribe(keeper.notified)
            worker.notifier.on_connect(keeper.wake)
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run)
            await worker.run()
            tg.cancel_scope.cancel()


def _request(job_type: str, input: Any, **fields: Any) -> EnqueueRequest:
    return EnqueueRequest(job_type=job_type, input={} if input is None else input, **fields)


def _pause_target(pool: str | None, job_type: str | None) -> tuple[Literal["pool", "type"], str]:
    if (pool is None) == (job_type is None):
        raise ValueError("give either pool or job_type")
    return ("pool", pool) if pool is not None else ("type", job_type or "")


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value)
    except ValueError:
        raise ValueError(f"not a run id (UUID): {value!r}") from None


def _periodic_spec(*, every: timedelta | None, cron: str | None, tz: str | None, name: str | None,
                   catch_up: bool, input: Mapping[str, Any] | list[Any] | None) -> PeriodicSpec:
    """The schedule ``@app.periodic`` declares, checked now: a bad expression, time zone or
    name fails at import time, not at the first tick."""
    cadence: Cadence
    if (every is None) == (cron is None):
        raise ConfigError("@app.periodic needs exactly one of every= and cron=")
    if every is not None:
        if tz is not None:
            raise ConfigError("tz= applies to cron= schedules only; every= ticks are instants")
        if every < timedelta(milliseconds=100):
            raise ConfigError(f"periodic every must be at least 100 ms, got {every}")
        cadence = Every(every)
    else:
        assert cron is not None  # noqa: S101 - exactly one of the two, checked above
        cadence = Cron(cron, "UTC" if tz is None else tz)
    if name is not None and not (0 < len(name) <= 512 and name.isprintable()):
        raise ConfigError(f"invalid schedule name {name!r}: 1 to 512 printable characters")
    if not isinstance(catch_up, bool):
        raise ConfigError(f"catch_up must be True or False, got {catch_up!r}")
    body = input if isinstance(input, list) else dict(input or {})
    encode_input(body)  # JSON and size, as at every tick
    return PeriodicSpec("", cadence, body, catch_up, name)
