"""Operations on existing runs: get, list, cancel, retry, stats (CLI and API share these)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, LiteralString, NoReturn, TypedDict
from uuid import UUID

from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._db.rows import run_row, typed_dict_row
from notifyq._errors import InvalidTransition, RunNotFound
from notifyq._limits import MAX_PAGE
from notifyq._notifier import cancel_payload, wake_payload
from notifyq._run import Run, RunStatus


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
    """Only pools with runs runnable now."""

    def to_json(self) -> dict[str, Any]:
        return {"counts": [asdict(c) for c in self.counts],
                "runnable": [asdict(r) for r in self.runnable]}


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run with its step timeline and its children (``notifyq runs show``, ``GET
    /v1/jobs/{id}``)."""

    run: Run
    steps: list[TimedStep]
    """In execution order."""
    children: list[Run]
    """Runs it spawned, oldest first."""

    def to_json(self) -> dict[str, Any]:
        return {**self.run.to_json(),
                "steps": [{k: v.isoformat() if isinstance(v, datetime) else v
                           for k, v in step.items()} for step in self.steps],
                "children": [{"id": str(c.id), "job_type": c.job_type,
                              "status": c.status.value} for c in self.children]}


_step_row = typed_dict_row(StepRow)


class RunControl:
    def __init__(self, queries: Queries, clock: Clock) -> None:
        self._q = queries
        self._clock = clock

    async def get(self, conn: AsyncConn, run_id: UUID) -> Run:
        run = await self._run(conn, self._q.job_run_get, {"id": run_id})
        if run is None:
            raise RunNotFound(f"no run {run_id}")
        return run

    async def list_runs(self, conn: AsyncConn, *, status: str | None = None,
                        job_type: str | None = None, pool: str | None = None,
                        tag: str | None = None, scope_entity_type: str | None = None,
                        scope_entity_id: str | None = None, tenant_id: str | None = None,
                        trigger_source: str | None = None, parent_run_id: UUID | None = None,
                        limit: int = 50, before: UUID | None = None) -> list[Run]:
        """Newest first; pass the last run's id as ``before`` for the next page."""
        if status is not None:
            RunStatus(status)  # ValueError names the bad status
        return await self._runs(conn, self._q.job_run_list, {
            "status": status, "job_type": job_type, "pool": pool, "tag": tag,
            "scope_entity_type": scope_entity_type, "scope_entity_id": scope_entity_id,
            "tenant_id": tenant_id, "trigger_source": trigger_source,
            "parent_run_id": parent_run_id, "limit": max(1, min(limit, MAX_PAGE)),
            "before_id": before})

    async def cancel(self, conn: AsyncConn, run_id: UUID) -> Run:
        """Cancel a pending or waiting run at once; ask a running one's worker to stop."""
        async with conn.transaction():
            run = await self._run(conn, self._q.job_run_cancel, {
                "id": run_id, "now": self._clock.db_now()})
            if run is None:
                await self._explain(conn, run_id, "cancel")
            if run.status == RunStatus.RUNNING:
                await self._notify(conn, [cancel_payload(run_id)])
        return run

    async def retry(self, conn: AsyncConn, run_id: UUID) -> Run:
        """Put a failed, canceled or timed-out run back to pending, runnable now."""
        async with conn.transaction():
            run = await self._run(conn, self._q.job_run_retry, {
                "id": run_id, "now": self._clock.db_now()})
            if run is None:
                await self._explain(conn, run_id, "retry")
            await self._notify(conn, [wake_payload(run.pool)])
        return run

    async def signal(self, conn: AsyncConn, token: str, payload: Any) -> int:
        """Deliver a signal (stored for a run that waits later); returns the runs woken."""
        row = await (await conn.execute(self._q.job_signal_send, {
            "token": token, "payload": Jsonb(payload)})).fetchone()
        return int(row["woken"]) if row else 0

    async def steps(self, conn: AsyncConn, run_id: UUID) -> list[StepRow]:
        """A run's memoized steps in execution order."""
        async with conn.cursor(row_factory=_step_row) as cur:
            await cur.execute(self._q.job_step_list, {"run_id": run_id})
            return await cur.fetchall()

    async def detail(self, conn: AsyncConn, run_id: UUID, *, limit: int = 1000) -> RunDetail:
        """The run, its step timeline and its children (at most ``limit`` of each)."""
        run = await self.get(conn, run_id)
        steps = (await self.steps(conn, run_id))[:limit]
        children = await self._runs(conn, self._q.job_run_list_children, {
            "parent_run_id": run_id, "limit": limit})
        return RunDetail(run, [_timed(step) for step in steps], children)

    async def stats(self, conn: AsyncConn) -> Stats:
        async with conn.cursor(row_factory=class_row(StatusCount)) as cur:
            await cur.execute(self._q.job_run_count_by_status)
            counts = await cur.fetchall()
        async with conn.cursor(row_factory=class_row(PoolBacklog)) as cur:
            await cur.execute(self._q.job_run_oldest_runnable, {"now": self._clock.db_now()})
            runnable = await cur.fetchall()
        return Stats(counts, runnable)

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

    async def _explain(self, conn: AsyncConn, run_id: UUID, action: str) -> NoReturn:
        run = await self.get(conn, run_id)
        raise InvalidTransition(f"cannot {action} run {run_id}: it is {run.status.value}")

    async def _notify(self, conn: AsyncConn, payloads: list[str]) -> None:
        await conn.execute(self._q.job_run_notify, {"channel": self._q.schema,
                                                     "payloads": payloads})


def _timed(step: StepRow) -> TimedStep:
    started, finished = step["started_at"], step["finished_at"]
    duration = (finished - started).total_seconds() if started and finished else None
    return {**step, "duration_s": duration, "memoized": step["status"] == "completed"}
