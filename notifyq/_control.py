"""Operations on existing runs: get, list, cancel, retry (one or many), replay from a step,
delete and reschedule (many, by id or by filter, in batches), stats, the per-pool
overview and per-minute series, leaders and workers (CLI, API and dashboard share these)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, LiteralString, NoReturn, TypedDict, overload
from uuid import UUID

from psycopg.errors import QueryCanceled
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._db.rows import picked_row, run_row, typed_dict_row
from notifyq._errors import InvalidTransition, RunNotFound, UnknownStep
from notifyq._limits import MAX_PAGE, RUN_AT_RANGE
from notifyq._notifier import cancel_payload, wake_payload
from notifyq._pause import Pause, PauseControl
from notifyq._run import RUN_FIELDS, RUN_STATUSES, Run, RunStatus


class StepRow(TypedDict):
    """A run's memoized step (``app.steps``): a dict, with these keys."""

    step_id: str
    seq: int
    kind: str
    """step, checkpoint, child, sleep or signal"""
    status: str
    output: Any
    error: dict[str, Any] | None
    attempts: int
    attempt: int
    started_at: datetime | None
    finished_at: datetime | None


class TimedStep(StepRow):
    """A step in a run's timeline (:class:`RunDetail`)."""

    duration_s: float | None
    memoized: bool
    """Its result is stored: a replay of the run returns it instead of running the step."""


@dataclass(frozen=True, slots=True)
class StatusCount:
    """How many runs of a job type in a pool have a status (job_run_count_by_status)."""

    job_type: str
    pool: str
    status: str
    count: int


@dataclass(frozen=True, slots=True)
class PoolBacklog:
    """A pool's runs runnable now, and how long the oldest has waited (queue latency)."""

    pool: str
    runnable: int
    oldest_age_s: float


@dataclass(frozen=True, slots=True)
class Stats:
    counts: list[StatusCount]
    runnable: list[PoolBacklog]
    """Only pools with runs runnable now (paused ones included: their runs wait)."""
    paused: list[Pause] = field(default_factory=list)
    """The paused pools and job types."""

    def to_json(self) -> dict[str, Any]:
        return {"counts": [asdict(c) for c in self.counts],
                "runnable": [asdict(r) for r in self.runnable],
                "paused": [p.to_json() for p in self.paused]}


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run with its step timeline and its children (``notifyq runs show``, ``GET
    /v1/jobs/{id}``)."""

    run: Run
    steps: list[TimedStep]
    """In execution order."""
    children: list[Run]
    """Runs it spawned, oldest first."""
    wait: dict[str, Any] | None = None
    """What a ``waiting`` run waits for: ``kind`` (sleep, children, signal), ``until`` (the
    sleep's end or the wait's deadline; None without one), ``token`` (a signal's),
    ``waiting_on`` (children's ids) and ``children_done``."""

    def to_json(self) -> dict[str, Any]:
        return {**self.run.to_json(), "wait": _jsonable(self.wait),
                "steps": [{k: v.isoformat() if isinstance(v, datetime) else v
                           for k, v in step.items()} for step in self.steps],
                "children": [{"id": str(c.id), "job_type": c.job_type,
                              "status": c.status.value} for c in self.children]}


@dataclass(frozen=True, slots=True)
class Replay:
    """A replay from a step (``notifyq runs replay``, ``POST /v1/jobs/{id}/replay``): the run,
    pending again; ``kept`` steps recorded before ``from_step`` that the replay reuses, and
    ``dropped`` ones (``from_step`` and after) that run again."""

    run: Run
    from_step: str
    kept: int
    dropped: int

    def to_json(self) -> dict[str, Any]:
        return {**self.run.to_json(), "replay": {
            "from_step": self.from_step, "steps_kept": self.kept, "steps_dropped": self.dropped}}


_step_row = typed_dict_row(StepRow)
_STEPS_NAMED = 20  # most step ids an unknown-step error lists

BulkAction = Literal["cancel", "retry", "delete", "reschedule"]
BULK_ACTIONS: tuple[BulkAction, ...] = ("cancel", "retry", "delete", "reschedule")
BULK_STATUSES: dict[str, tuple[str, ...]] = {
    "cancel": ("pending", "waiting", "running"),
    "retry": ("failed", "canceled", "timed_out"),
    "delete": ("completed", "failed", "canceled", "timed_out"),
    "reschedule": ("pending",),
}
"""The statuses each bulk action applies to (cancel and retry as the single-run actions;
delete only finished runs: cancel live ones first; reschedule only pending runs)."""
BULK_BATCH = 500
"""Runs a bulk action changes in one transaction (the default batch size), about 0.1 s on a
busy table: row locks are held that long at most, and a failure loses one batch's work."""
BULK_BATCH_MAX = 5000
BULK_MAX = 10_000
"""Most runs one bulk request of the API or the dashboard changes; what is left is counted in
the answer, and the same request again goes on. The CLI goes on by itself."""
COUNT_CAP = BULK_MAX
"""A count stops here: one confirmation changes at most this many anyway, and counting the
rest of a broad filter would read the whole table."""
RUN_STATES: dict[str, dict[str, Any]] = {
    "pending": {"status": "pending", "due": "now"},
    "scheduled": {"status": "pending", "due": "later", "retried": False},
    "retrying": {"status": "pending", "due": "later", "retried": True},
    "running": {"status": "running"},
    "waiting": {"status": "waiting"},
    "failed": {"status": "failed"},
    "timed_out": {"status": "timed_out"},
    "completed": {"status": "completed"},
    "canceled": {"status": "canceled"},
}
"""The dashboard's states of a run, as :class:`RunFilter` fields: the statuses, with pending
split into runnable now (``pending``), due later (``scheduled``) and due later after a failed
attempt (``retrying``: its backoff). Each run is in exactly one."""
_HEX = re.compile(r"^[0-9a-f]{1,32}$")
_SUFFIX = re.compile(r"^[0-9a-f]{1,12}$")
_SHORTEST_COUNT_MS = 50
"""A budgeted count with less time left than this is run only when its plan is cheap
(``_CHEAP_COUNT_COST``), with this long; its plan gets at least this long."""
_CHEAP_COUNT_COST = 100.0
"""A count planned under this reads a few pages (a small table): it is run even when the
budget is spent (on a loaded machine), not estimated. At 1,000 the live states' counts of 10
million runs ran too, which added 0.1-0.3 s to a loaded machine's counts."""
COUNT_COST_MAX = 15_000.0
"""A budgeted count whose plan costs more than this (the planner's units) is not run: its
estimate is given instead. On 10 million runs (bench/RESULTS.md, 2026-12-07) the dashboard's
counts planned under it took at most 62 ms on a busy machine, those over it 35 ms to 4.5 s."""
_NO_WAIT_DEADLINE = 2900  # durable waits without a deadline run_at 2999-12-31


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    """Which runs a listing, a count or a bulk action is about. ``created_after`` /
    ``created_before`` and ``id_prefix`` (hex digits, dashes ignored) bound the id: run ids are
    UUIDv7, so each is a range of the primary key. ``id_suffix`` (up to 12 hex digits) is how
    the id ends: its random part, what tells apart the runs of one millisecond (the dashboard's
    short id). It is checked on each run of the id range: give a time range or a prefix with
    it on a large table."""

    status: str | None = None
    job_type: str | None = None
    pool: str | None = None
    tag: str | None = None
    scope_entity_type: str | None = None
    scope_entity_id: str | None = None
    tenant_id: str | None = None
    tenant_ids: list[str] | None = None
    """Only runs of these tenants (None: every run, tenant or not): a tenant-scoped API token's
    tenants, which no other filter can widen."""
    trigger_source: str | None = None
    parent_run_id: UUID | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    id_prefix: str | None = None
    status_in: tuple[str, ...] | None = None
    """Any of these statuses (``status`` is one)."""
    due: Literal["now", "later"] | None = None
    """Only runs whose ``run_at`` has come (``now``: pending ones are runnable) or not yet
    (``later``: pending ones are scheduled)."""
    finished_within_s: int | None = None
    """Only runs finished in the last this many seconds."""
    leased_by: str | None = None
    """Only runs leased by this worker (its id): with ``status`` running, those it holds."""
    id_suffix: str | None = None
    retried: bool | None = None
    """Only runs tried before (True: ``attempts > 0``) or never tried (False)."""
    ids: tuple[UUID, ...] | None = None
    """Only these runs (the dashboard's counts of an id's end: the runs ending so, looked up
    once for all its counts)."""

    def __post_init__(self) -> None:
        for status in (self.status, *(self.status_in or ())):
            if status is not None:
                RunStatus(status)  # ValueError names the bad status
        if self.due not in (None, "now", "later"):
            raise ValueError(f"due must be now or later, got {self.due!r}")
        if self.finished_within_s is not None and self.finished_within_s < 1:
            raise ValueError(f"finished within must be positive, got {self.finished_within_s} s")
        if self.id_prefix is not None and not _HEX.fullmatch(self.hex_prefix):
            raise ValueError(f"id prefix {self.id_prefix!r} must be 1 to 32 hex digits "
                             "(dashes allowed)")
        if self.id_suffix is not None and not _SUFFIX.fullmatch(self.id_suffix.lower()):
            raise ValueError(f"id end {self.id_suffix!r} must be 1 to 12 hex digits (the last "
                             "part of an id)")

    @property
    def hex_prefix(self) -> str:
        return (self.id_prefix or "").replace("-", "").lower()

    def params(self, before: UUID | None = None, now: datetime | None = None) -> dict[str, Any]:
        """The query parameters: the filter's columns, ``min_id`` and ``before_id`` (the
        tighter of ``before`` and the filter's upper bound), and ``now`` (None: the
        database's clock) that ``due`` and ``finished_within_s`` count from."""
        low, high = [self.created_after and _id_at(self.created_after)], [
            before, self.created_before and _id_at(self.created_before)]
        if self.id_prefix is not None:
            digits = self.hex_prefix
            low.append(UUID(int=int(digits, 16) << 4 * (32 - len(digits))))
            top = (int(digits, 16) + 1) << 4 * (32 - len(digits))
            high.append(UUID(int=top) if top < 1 << 128 else None)
        lows = [u for u in low if u is not None]
        highs = [u for u in high if u is not None]
        columns = {k: v for k, v in asdict(self).items()
                   if k not in ("created_after", "created_before", "id_prefix", "id_suffix")}
        return {**columns, "status_in": list(self.status_in) if self.status_in else None,
                "ids": list(self.ids) if self.ids is not None else None,
                "now": now, "min_id": max(lows, default=None),
                "before_id": min(highs, default=None),
                "id_suffix": self.id_suffix and self.id_suffix.lower()}


def _planned(explained: list[dict[str, Any]]) -> tuple[float, int]:
    """The total cost of job_run_count_plan's plan (its ``QUERY PLAN``) and the rows it
    estimates under its LIMIT (what the count would be without its cap)."""
    top = node = explained[0]["Plan"]
    while node["Node Type"] != "Limit":
        node = next(p for p in node["Plans"] if p.get("Parent Relationship") == "Outer")
    under = next(p for p in node["Plans"] if p.get("Parent Relationship") == "Outer")
    return float(top["Total Cost"]), int(under["Plan Rows"])


def _id_at(moment: datetime) -> UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond."""
    millis = int(moment.timestamp() * 1000)
    return UUID(int=max(0, millis) << 80)


@dataclass(frozen=True, slots=True)
class Count:
    """How many runs match: counted up to ``COUNT_CAP`` (``capped``: that many or more), or,
    where counting would read too long, the planner's estimate (``estimated``)."""

    n: int
    estimated: bool = False

    @property
    def capped(self) -> bool:
        return not self.estimated and self.n >= COUNT_CAP


@dataclass(frozen=True, slots=True)
class BulkResult:
    """A bulk action's answer: ``changed`` runs (``requested`` running ones asked to stop, for
    a cancel); ``remaining``: matching runs left when the request stopped at its limit;
    ``batches``: the transactions it took."""

    action: str
    changed: int
    requested: int = 0
    remaining: int = 0
    ids: list[UUID] = field(default_factory=list)
    batches: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "changed": self.changed, "requested": self.requested,
                "remaining": self.remaining, "batches": self.batches}


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkOptions:
    """How a bulk action runs: ``run_at`` (reschedule only, required there), ``batch_size``
    runs a transaction (1 to ``BULK_BATCH_MAX``), at most ``limit`` runs in one call (None: all
    that match), ``progress`` called after each batch with the runs changed so far."""

    run_at: datetime | None = None
    batch_size: int = BULK_BATCH
    limit: int | None = BULK_MAX
    progress: Callable[[int], None] | None = None

    def check(self, action: BulkAction) -> None:
        if action not in BULK_ACTIONS:
            raise ValueError(f"bulk action must be one of {', '.join(BULK_ACTIONS)}, "
                             f"got {action!r}")
        if not 1 <= self.batch_size <= BULK_BATCH_MAX:
            raise ValueError(f"batch size must be between 1 and {BULK_BATCH_MAX}, "
                             f"got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be positive, got {self.limit}")
        if (action == "reschedule") != (self.run_at is not None):
            raise ValueError("reschedule needs run_at (and only reschedule takes one)")
        if self.run_at is not None and (self.run_at.tzinfo is None or not (
                RUN_AT_RANGE[0] <= self.run_at < RUN_AT_RANGE[1])):
            raise ValueError(f"run_at {self.run_at.isoformat()} must have a UTC offset and be "
                             f"in [{RUN_AT_RANGE[0]:%Y-%m-%d}, {RUN_AT_RANGE[1]:%Y-%m-%d})")


@dataclass(frozen=True, slots=True)
class Workers:
    """The workers alive (from the registry each worker renews with its heartbeat) and the
    leaders."""

    items: list[dict[str, Any]]
    leaders: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"items": [_jsonable(w) for w in self.items],
                "leaders": [_jsonable(r) for r in self.leaders]}


class RunControl:
    def __init__(self, queries: Queries, clock: Clock) -> None:
        self._q = queries
        self._clock = clock

    async def get(self, conn: AsyncConn, run_id: UUID, *,
                  tenant_ids: list[str] | None = None) -> Run:
        """The run; RunNotFound when there is none, or none of ``tenant_ids`` (None: any)."""
        run = await self._run(conn, self._q.job_run_get_in_tenants,
                              {"id": run_id, "tenant_ids": tenant_ids})
        if run is None:
            raise RunNotFound(f"no run {run_id}")
        return run

    async def list_runs(self, conn: AsyncConn, *, limit: int = 50, before: UUID | None = None,
                        **filters: Any) -> list[Run]:
        """Newest first; pass the last run's id as ``before`` for the next page. ``filters``
        are :class:`RunFilter`'s fields."""
        return await self.list_filtered(conn, RunFilter(**filters), limit=limit, before=before)

    async def list_filtered(self, conn: AsyncConn, where: RunFilter, *, limit: int = 50,
                            before: UUID | None = None) -> list[Run]:
        return await self._runs(conn, self._q.job_run_list, {
            **self._params(where, before), "limit": max(1, min(limit, MAX_PAGE))})

    async def list_with_tenants(self, conn: AsyncConn, where: RunFilter, *, limit: int = 50,
                                before: UUID | None = None) -> list[ListedRun]:
        """:meth:`list_filtered`, each run with its tenant (the dashboard's list)."""
        async with conn.cursor(row_factory=_listed_row) as cur:
            await cur.execute(self._q.job_run_list, {
                **self._params(where, before), "limit": max(1, min(limit, MAX_PAGE))})
            return await cur.fetchall()

    async def count(self, conn: AsyncConn, where: RunFilter, action: BulkAction) -> int:
        """Runs matching ``where`` that ``action`` applies to, counted up to ``COUNT_CAP``."""
        return await self._count(conn, where, BULK_STATUSES[action])

    async def with_ids_ending(self, conn: AsyncConn, where: RunFilter) -> RunFilter:
        """``where`` with its id's end looked up once: the runs of its id range ending so as
        ``ids`` (unchanged when there are more than ``COUNT_CAP``), for several counts of the
        same filter (the dashboard's tabs), each of which would look them up again."""
        if where.id_suffix is None:
            return where
        ending = RunFilter(created_after=where.created_after, id_prefix=where.id_prefix,
                           created_before=where.created_before, id_suffix=where.id_suffix)
        cur = await conn.execute(self._q.job_run_list_ids, {
            **self._params(ending), "statuses": list(RUN_STATUSES), "limit": COUNT_CAP + 1})
        ids = tuple(row["id"] for row in await cur.fetchall())
        return where if len(ids) > COUNT_CAP else replace(where, id_suffix=None, ids=ids)

    async def count_within(self, conn: AsyncConn, where: RunFilter, action: BulkAction, *,
                           budget_s: float) -> Count | None:
        """:meth:`count` within ``budget_s`` (see :meth:`count_states`): the dashboard's
        confirmation of a bulk action by filter."""
        deadline = time.monotonic() + budget_s
        async with conn.transaction():
            await conn.execute(self._q.job_run_read_no_jit)
            return await self._count_before(conn, where, BULK_STATUSES[action], deadline)

    @overload
    async def count_states(self, conn: AsyncConn, where: RunFilter) -> dict[str, int]: ...

    @overload
    async def count_states(self, conn: AsyncConn, where: RunFilter, *,
                           budget_s: float) -> dict[str, Count | None]: ...

    async def count_states(self, conn: AsyncConn, where: RunFilter, *,
                           budget_s: float | None = None) -> Mapping[str, int | Count | None]:
        """Per state of ``RUN_STATES``, the runs matching ``where`` but for its status, each
        counted up to ``COUNT_CAP`` (the live states, first, read their partial indexes; a
        finished state stops at the cap or reads every run of the filter's id range). With
        ``budget_s`` the counts share that much time and each is a :class:`Count`: a count
        whose plan says it would read much of the table (``COUNT_COST_MAX``), or that is still
        reading when the budget is spent (stopped by the server), is the planner's estimate;
        None when even that did not come in time."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        counts: dict[str, int | Count | None] = {}
        async with conn.transaction():
            await conn.execute(self._q.job_run_read_no_jit)
            for state, fields in RUN_STATES.items():
                one, statuses = replace(where, **fields), (fields["status"],)
                counts[state] = (await self._count(conn, one, statuses) if deadline is None
                                 else await self._count_before(conn, one, statuses, deadline))
        return counts

    @overload
    async def count_matching(self, conn: AsyncConn, where: RunFilter) -> int: ...

    @overload
    async def count_matching(self, conn: AsyncConn, where: RunFilter, *,
                             budget_s: float) -> Count | None: ...

    async def count_matching(self, conn: AsyncConn, where: RunFilter, *,
                             budget_s: float | None = None) -> int | Count | None:
        """Runs matching ``where``, counted up to ``COUNT_CAP`` (with ``budget_s``: as each
        of :meth:`count_states`)."""
        async with conn.transaction():
            await conn.execute(self._q.job_run_read_no_jit)
            if budget_s is None:
                return await self._count(conn, where, RUN_STATUSES)
            return await self._count_before(conn, where, RUN_STATUSES,
                                            time.monotonic() + budget_s)

    async def _count_before(self, conn: AsyncConn, where: RunFilter, statuses: tuple[str, ...],
                            deadline: float) -> Count | None:
        """:meth:`_count`, or its estimate when its plan costs over ``COUNT_COST_MAX`` (over
        ``_CHEAP_COUNT_COST`` when less than ``_SHORTEST_COUNT_MS`` is left before
        ``deadline``, monotonic), or it is still reading then (stopped by the server's
        ``statement_timeout``); None when not even the plan came by then (or within
        ``_SHORTEST_COUNT_MS``: a lock). In a savepoint, so that the counts after it run."""
        left_ms = int((deadline - time.monotonic()) * 1000)
        params = {**self._params(where), "statuses": list(statuses), "cap": COUNT_CAP}
        estimate = None
        try:
            async with conn.transaction():
                await conn.execute(self._q.job_run_count_timeout,
                                   {"ms": f"{max(left_ms, _SHORTEST_COUNT_MS)}ms"})
                cur = await conn.execute(self._q.job_run_count_plan, params, prepare=False)
                cost, rows = _planned((await cur.fetchall())[0]["QUERY PLAN"])
                estimate = Count(rows, estimated=True)
                if cost > (COUNT_COST_MAX if left_ms >= _SHORTEST_COUNT_MS else _CHEAP_COUNT_COST):
                    return estimate
                return Count(await self._counted(conn, params))
        except QueryCanceled:
            return estimate

    async def _count(self, conn: AsyncConn, where: RunFilter, statuses: tuple[str, ...]) -> int:
        return await self._counted(conn, {**self._params(where), "statuses": list(statuses),
                                          "cap": COUNT_CAP})

    async def _counted(self, conn: AsyncConn, params: dict[str, Any]) -> int:
        cur = await conn.execute(self._q.job_run_count, params)
        row = await cur.fetchone()
        return int(row["n"]) if row else 0

    def _params(self, where: RunFilter, before: UUID | None = None) -> dict[str, Any]:
        return where.params(before, self._clock.db_now())

    async def bulk(self, conn: AsyncConn, action: BulkAction, *,
                   ids: list[UUID] | None = None, where: RunFilter | None = None,
                   limit: int = BULK_MAX, options: BulkOptions | None = None,
                   tenant_ids: list[str] | None = None) -> BulkResult:
        """Cancel, retry, delete or reschedule the runs ``ids``, or those matching ``where``,
        as the single-run actions do (runs the action does not apply to are left as they are),
        each batch in its own transaction. ``limit`` is the default options' limit. Runs of
        other tenants than ``tenant_ids`` (None: any) are left out like those."""
        if where is not None and tenant_ids is not None:
            where = replace(where, tenant_ids=tenant_ids)
        opts = options or BulkOptions(limit=limit)
        opts.check(action)
        if (ids is None) == (where is None):
            raise ValueError("bulk: give either ids or a filter")
        cap = opts.limit if opts.limit is not None else sys.maxsize
        done: list[dict[str, Any]] = []
        batches = 0
        if ids is not None:
            for start in range(0, min(len(ids), cap), opts.batch_size):
                page = ids[start:min(start + opts.batch_size, cap)]
                done += await self._change(conn, action, page, opts.run_at, tenant_ids)
                batches += 1
                _report(opts, done)
            return _bulk_result(action, done, 0, batches)
        assert where is not None  # noqa: S101 - checked above
        before = None
        while len(done) < cap:
            cur = await conn.execute(self._q.job_run_list_ids, {
                **self._params(where, before), "statuses": list(BULK_STATUSES[action]),
                "limit": min(opts.batch_size, cap - len(done))})
            page = [r["id"] for r in await cur.fetchall()]
            if not page:
                break
            done += await self._change(conn, action, page, opts.run_at, where.tenant_ids)
            batches += 1
            _report(opts, done)
            before = page[-1]
        remaining = await self.count(conn, where, action) if len(done) >= cap else 0
        return _bulk_result(action, done, remaining, batches)

    async def _change(self, conn: AsyncConn, action: BulkAction, ids: list[UUID],
                      run_at: datetime | None = None,
                      tenant_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """One batch in one transaction, with the NOTIFYs it calls for."""
        queries = {"cancel": self._q.job_run_cancel_many, "retry": self._q.job_run_retry_many,
                   "delete": self._q.job_run_delete_many,
                   "reschedule": self._q.job_run_reschedule_many}
        async with conn.transaction():
            rows = await (await conn.execute(queries[action], {
                "ids": ids, "now": self._clock.db_now(), "run_at": run_at,
                "tenant_ids": tenant_ids})).fetchall()
            payloads = []
            if action == "cancel":
                payloads = [cancel_payload(r["id"]) for r in rows
                            if r["status"] == RunStatus.RUNNING]
            elif action in ("retry", "reschedule"):
                # A later run_at needs no wake-up (the producers' timers find it), but a
                # wake-up costs one poll at most: simpler to always send it.
                payloads = [wake_payload(pool) for pool in sorted({r["pool"] for r in rows})]
            if payloads:
                await self._notify(conn, payloads)
        return rows

    async def cancel(self, conn: AsyncConn, run_id: UUID, *,
                     tenant_ids: list[str] | None = None) -> Run:
        """Cancel a pending or waiting run at once; ask a running one's worker to stop. A run
        of another tenant than ``tenant_ids`` (None: any) is RunNotFound."""
        async with conn.transaction():
            run = await self._run(conn, self._q.job_run_cancel, {
                "id": run_id, "now": self._clock.db_now(), "tenant_ids": tenant_ids})
            if run is None:
                await self._explain(conn, run_id, "cancel", tenant_ids)
            if run.status == RunStatus.RUNNING:
                await self._notify(conn, [cancel_payload(run_id)])
        return run

    async def retry(self, conn: AsyncConn, run_id: UUID, *,
                    tenant_ids: list[str] | None = None) -> Run:
        """Put a failed, canceled or timed-out run back to pending, runnable now. A run of
        another tenant than ``tenant_ids`` (None: any) is RunNotFound."""
        async with conn.transaction():
            run = await self._run(conn, self._q.job_run_retry, {
                "id": run_id, "now": self._clock.db_now(), "tenant_ids": tenant_ids})
            if run is None:
                await self._explain(conn, run_id, "retry", tenant_ids)
            await self._notify(conn, [wake_payload(run.pool)])
        return run

    async def replay(self, conn: AsyncConn, run_id: UUID, from_step: str, *,
                     tenant_ids: list[str] | None = None) -> Replay:
        """Run a finished durable run again from the step ``from_step``: the steps recorded
        before it (in execution order) are reused, it and the later ones run again.

        Raises RunNotFound, InvalidTransition (the run is not finished, or recorded no steps)
        and UnknownStep (the run has no step ``from_step``; the message lists those it has).
        A run of another tenant than ``tenant_ids`` (None: any) is RunNotFound."""
        async with conn.transaction():
            run = await self._run(conn, self._q.job_run_get_for_update,
                                  {"id": run_id, "tenant_ids": tenant_ids})
            if run is None:
                raise RunNotFound(f"no run {run_id}")
            if not run.status.terminal:
                raise InvalidTransition(
                    f"cannot replay run {run_id}: it is {run.status.value}; wait until it is "
                    "finished (or cancel it) first")
            steps = await self.steps(conn, run_id)
            seq = next((s["seq"] for s in steps if s["step_id"] == from_step), None)
            if not steps:
                raise InvalidTransition(
                    f"cannot replay run {run_id} from a step: it recorded no steps (it is not "
                    "a durable run); retry it instead")
            if seq is None:
                raise UnknownStep(f"run {run_id} has no step {from_step!r}; its steps: "
                                  + _step_names(steps))
            counts = await (await conn.execute(self._q.job_step_replay_from, {
                "run_id": run_id, "seq": seq, "attempt": run.attempts + 1})).fetchone()
            replayed = await self._run(conn, self._q.job_run_replay, {
                "id": run_id, "now": self._clock.db_now()})
            if replayed is None or counts is None:  # the row is locked and finished
                raise InvalidTransition(f"cannot replay run {run_id}")
            await self._notify(conn, [wake_payload(replayed.pool)])
        return Replay(replayed, from_step, int(counts["kept"]), int(counts["dropped"]))

    async def signal(self, conn: AsyncConn, token: str, payload: Any, *,
                     tenant_ids: list[str] | None = None) -> int:
        """Deliver a signal (stored for a run that waits later); returns the runs woken. With
        ``tenant_ids``, only to a run of those tenants waiting now: nothing is stored."""
        row = await (await conn.execute(self._q.job_signal_send, {
            "token": token, "payload": Jsonb(payload), "tenant_ids": tenant_ids})).fetchone()
        return int(row["woken"]) if row else 0

    async def steps(self, conn: AsyncConn, run_id: UUID) -> list[StepRow]:
        """A run's memoized steps in execution order."""
        async with conn.cursor(row_factory=_step_row) as cur:
            await cur.execute(self._q.job_step_list, {"run_id": run_id})
            return await cur.fetchall()

    async def detail(self, conn: AsyncConn, run_id: UUID, *, limit: int = 1000,
                     tenant_ids: list[str] | None = None) -> RunDetail:
        """The run, its step timeline, its children (at most ``limit`` of each) and what it
        waits for. A run of another tenant than ``tenant_ids`` (None: any) is RunNotFound, and
        so are its children of other tenants left out."""
        row = await (await conn.execute(self._q.job_run_get_in_tenants,
                                        {"id": run_id, "tenant_ids": tenant_ids})).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id}")
        steps = (await self.steps(conn, run_id))[:limit]
        children = await self._runs(conn, self._q.job_run_list_children, {
            "parent_run_id": run_id, "limit": limit, "tenant_ids": tenant_ids})
        return RunDetail(Run.from_row(row), [_timed(step) for step in steps], children,
                         _wait(row))

    async def stats(self, conn: AsyncConn) -> Stats:
        async with conn.cursor(row_factory=class_row(StatusCount)) as cur:
            await cur.execute(self._q.job_run_count_by_status)
            counts = await cur.fetchall()
        async with conn.cursor(row_factory=class_row(PoolBacklog)) as cur:
            await cur.execute(self._q.job_run_oldest_runnable, {"now": self._clock.db_now()})
            runnable = await cur.fetchall()
        return Stats(counts, runnable, await PauseControl(self._q, self._clock).list(conn))

    async def _run(self, conn: AsyncConn, query: LiteralString,
                   params: dict[str, Any]) -> Run | None:
        async with conn.cursor(row_factory=run_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchone()

    async def _runs(self, conn: AsyncConn, query: LiteralString,
                    params: dict[str, Any]) -> list[Run]:
        async with conn.cursor(row_factory=run_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()

    async def overview(self, conn: AsyncConn) -> list[dict[str, Any]]:
        """Per pool: runnable, scheduled, running, waiting, failed in the last hour, the
        oldest runnable run's age in seconds, and whether it is paused (``pause``: why and
        since when). Idle pools are listed too (those of registered job types, of live
        workers, and paused ones), so a pool can be paused before it has a backlog."""
        now = {"now": self._clock.db_now()}
        rows = await self._read(conn, self._q.job_run_pool_overview, now)
        pauses = {p.name: p for p in await PauseControl(self._q, self._clock).list(conn)
                  if p.kind == "pool"}
        known = {r["pool"] for r in await self._read(conn, self._q.job_pool_list, now)}
        idle = [{"pool": name, "runnable": 0, "scheduled": 0, "running": 0, "waiting": 0,
                 "failed_last_hour": 0, "oldest_runnable_age_s": 0.0}
                for name in (known | set(pauses)) - {r["pool"] for r in rows}]
        return sorted(({**r, "paused": r["pool"] in pauses, "pause": pauses.get(r["pool"])}
                       for r in rows + idle), key=lambda r: r["pool"])

    async def type_overview(self, conn: AsyncConn) -> list[dict[str, Any]]:
        """Per job type (every registered one, and any other with live or recent runs): its
        runs by live state, and those finished in the last hour."""
        rows = await self._read(conn, self._q.job_run_type_overview,
                                {"now": self._clock.db_now()})
        known = {t for t, _ in await self.job_types(conn)} - {r["job_type"] for r in rows}
        idle = [dict.fromkeys(_TYPE_COUNTS, 0) | {"job_type": t} for t in known]
        return sorted(rows + idle, key=lambda r: r["job_type"])

    async def job_types(self, conn: AsyncConn) -> list[tuple[str, str]]:
        """The registered job types with their pools, by name."""
        rows = await (await conn.execute(self._q.job_list)).fetchall()
        return [(r["type"], r["pool"]) for r in rows]

    async def series(self, conn: AsyncConn, minutes: int = 60) -> list[dict[str, Any]]:
        """Per minute of the last ``minutes``, oldest first: completed, failed, and the p50
        and p95 queue latency (run_at to start) of runs that ran once."""
        return await self._read(conn, self._q.job_run_series, {
            "now": self._clock.db_now(), "minutes": max(1, min(minutes, 24 * 60))})

    async def list_workers(self, conn: AsyncConn) -> Workers:
        """The workers alive (renewed within a lease) and who leads."""
        now = {"now": self._clock.db_now()}
        workers = await (await conn.execute(self._q.worker_list, now)).fetchall()
        leaders = await (await conn.execute(self._q.leader_list, now)).fetchall()
        return Workers(items=workers, leaders=leaders)

    async def _read(self, conn: AsyncConn, query: str,
                    params: dict[str, Any]) -> list[dict[str, Any]]:
        """An aggregate for the dashboard, planned without JIT (see job_run_read_no_jit)."""
        async with conn.transaction():
            await conn.execute(self._q.job_run_read_no_jit)
            return await (await conn.execute(query, params)).fetchall()

    async def _explain(self, conn: AsyncConn, run_id: UUID, action: str,
                       tenant_ids: list[str] | None = None) -> NoReturn:
        run = await self.get(conn, run_id, tenant_ids=tenant_ids)
        raise InvalidTransition(f"cannot {action} run {run_id}: it is {run.status.value}")

    async def _notify(self, conn: AsyncConn, payloads: list[str]) -> None:
        await conn.execute(self._q.job_run_notify, {"channel": self._q.schema,
                                                     "payloads": payloads})


@dataclass(frozen=True, slots=True)
class ListedRun:
    """A run of the dashboard's list, with its tenant (not a field of :class:`Run`)."""

    run: Run
    tenant_id: str | None

    def state(self, now: datetime) -> str:
        """Its state of ``RUN_STATES`` at ``now``."""
        run = self.run
        if run.status != RunStatus.PENDING or run.run_at <= now:
            return run.status.value
        return "retrying" if run.attempts > 0 else "scheduled"

    @property
    def next_attempt(self) -> datetime | None:
        """When it runs next: a pending run's ``run_at``, a waiting run's deadline (None for
        a wait without one and for any other run)."""
        status, at = self.run.status, self.run.run_at
        if status == RunStatus.PENDING or (status == RunStatus.WAITING
                                           and at.year < _NO_WAIT_DEADLINE):
            return at
        return None


def _listed(*, tenant_id: str | None, **columns: Any) -> ListedRun:
    return ListedRun(Run.from_columns(**columns), tenant_id)


_listed_row = picked_row(_listed, (*RUN_FIELDS, "tenant_id"))
_TYPE_COUNTS = ("pending", "scheduled", "retrying", "running", "waiting",
                "completed_last_hour", "failed_last_hour", "canceled_last_hour")


def _step_names(steps: list[StepRow]) -> str:
    names = ", ".join(repr(s["step_id"]) for s in steps[:_STEPS_NAMED])
    return names + (f" and {len(steps) - _STEPS_NAMED} more" if len(steps) > _STEPS_NAMED else "")


def _timed(step: StepRow) -> TimedStep:
    started, finished = step["started_at"], step["finished_at"]
    duration = (finished - started).total_seconds() if started and finished else None
    return {**step, "duration_s": duration, "memoized": step["status"] == "completed"}


def _wait(row: dict[str, Any]) -> dict[str, Any] | None:
    if row.get("status") != RunStatus.WAITING or row.get("wait_kind") is None:
        return None
    until = row["run_at"]
    return {"kind": row["wait_kind"],
            "until": None if until.year >= _NO_WAIT_DEADLINE else until,
            "token": row.get("wait_token"),
            "waiting_on": list(row.get("waiting_on") or []),
            "children_done": list(row.get("children_done") or [])}


def _bulk_result(action: str, rows: list[dict[str, Any]], remaining: int,
                 batches: int) -> BulkResult:
    running = sum(1 for r in rows if r["status"] == RunStatus.RUNNING) if action == "cancel" else 0
    return BulkResult(action, len(rows) - running, running, remaining, [r["id"] for r in rows],
                      batches)


def _report(options: BulkOptions, done: list[dict[str, Any]]) -> None:
    if options.progress is not None:
        options.progress(len(done))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return value
