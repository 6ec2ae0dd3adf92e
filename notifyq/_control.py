"""Operations on existing runs: get, list, cancel, retry, stats (CLI and API share these)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID

from psycopg.types.json import Jsonb

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._errors import InvalidTransition, RunNotFound
from notifyq._notifier import cancel_payload, wake_payload
from notifyq._run import Run, RunStatus


@dataclass(frozen=True, slots=True)
class Stats:
    counts: list[dict[str, Any]]
    """Rows of {job_type, pool, status, count}."""
    runnable: list[dict[str, Any]]
    """Per pool: {pool, runnable, oldest_age_s} for runs runnable now."""

    def to_json(self) -> dict[str, Any]:
        return {"counts": self.counts, "runnable": self.runnable}


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run with its step timeline and its children (``notifyq runs show``, ``GET
    /v1/jobs/{id}``)."""

    run: Run
    steps: list[dict[str, Any]]
    """In execution order: step_id, seq, kind (step, checkpoint, child, sleep, signal), status,
    output, error, attempts, attempt, started_at, finished_at, ``duration_s`` and ``memoized``
    (its result is stored: a replay of the run returns it instead of running the step)."""
    children: list[Run]
    """Runs it spawned, oldest first."""

    def to_json(self) -> dict[str, Any]:
        return {**self.run.to_json(),
                "steps": [{k: v.isoformat() if isinstance(v, datetime) else v
                           for k, v in step.items()} for step in self.steps],
                "children": [{"id": str(c.id), "job_type": c.job_type,
                              "status": c.status.value} for c in self.children]}


class RunControl:
    def __init__(self, queries: Queries, clock: Clock) -> None:
        self._q = queries
        self._clock = clock

    async def get(self, conn: AsyncConn, run_id: UUID) -> Run:
        row = await (await conn.execute(self._q.job_run_get, {"id": run_id})).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id}")
        return Run.from_row(row)

    async def list_runs(self, conn: AsyncConn, *, status: str | None = None,
                        job_type: str | None = None, pool: str | None = None,
                        tag: str | None = None, scope_entity_type: str | None = None,
                        scope_entity_id: str | None = None, tenant_id: str | None = None,
                        trigger_source: str | None = None, parent_run_id: UUID | None = None,
                        limit: int = 50, before: UUID | None = None) -> list[Run]:
        """Newest first; pass the last run's id as ``before`` for the next page."""
        if status is not None:
            RunStatus(status)  # ValueError names the bad status
        cur = await conn.execute(self._q.job_run_list, {
            "status": status, "job_type": job_type, "pool": pool, "tag": tag,
            "scope_entity_type": scope_entity_type, "scope_entity_id": scope_entity_id,
            "tenant_id": tenant_id, "trigger_source": trigger_source,
            "parent_run_id": parent_run_id, "limit": max(1, min(limit, 1000)),
            "before_id": before})
        return [Run.from_row(r) for r in await cur.fetchall()]

    async def cancel(self, conn: AsyncConn, run_id: UUID) -> Run:
        """Cancel a pending or waiting run at once; ask a running one's worker to stop."""
        async with conn.transaction():
            row = await (await conn.execute(self._q.job_run_cancel, {
                "id": run_id, "now": self._clock.db_now()})).fetchone()
            if row is None:
                await self._explain(conn, run_id, "cancel")
            if row["status"] == RunStatus.RUNNING:
                await self._notify(conn, [cancel_payload(run_id)])
        return Run.from_row(row)

    async def retry(self, conn: AsyncConn, run_id: UUID) -> Run:
        """Put a failed, canceled or timed-out run back to pending, runnable now."""
        async with conn.transaction():
            row = await (await conn.execute(self._q.job_run_retry, {
                "id": run_id, "now": self._clock.db_now()})).fetchone()
            if row is None:
                await self._explain(conn, run_id, "retry")
            await self._notify(conn, [wake_payload(row["pool"])])
        return Run.from_row(row)

    async def signal(self, conn: AsyncConn, token: str, payload: Any) -> int:
        """Deliver a signal (stored for a run that waits later); returns the runs woken."""
        row = await (await conn.execute(self._q.job_signal_send, {
            "token": token, "payload": Jsonb(payload)})).fetchone()
        return int(row["woken"]) if row else 0

    async def steps(self, conn: AsyncConn, run_id: UUID) -> list[dict[str, Any]]:
        """A run's memoized steps in execution order."""
        return await (await conn.execute(self._q.job_step_list, {"run_id": run_id})).fetchall()

    async def detail(self, conn: AsyncConn, run_id: UUID, *, limit: int = 1000) -> RunDetail:
        """The run, its step timeline and its children (at most ``limit`` of each)."""
        run = await self.get(conn, run_id)
        steps = (await self.steps(conn, run_id))[:limit]
        children = await (await conn.execute(self._q.job_run_list_children, {
            "parent_run_id": run_id, "limit": limit})).fetchall()
        return RunDetail(run, [_timed(step) for step in steps],
                         [Run.from_row(c) for c in children])

    async def stats(self, conn: AsyncConn) -> Stats:
        counts = await (await conn.execute(self._q.job_run_count_by_status)).fetchall()
        runnable = await (await conn.execute(self._q.job_run_oldest_runnable, {
            "now": self._clock.db_now()})).fetchall()
        return Stats(counts, runnable)

    async def _explain(self, conn: AsyncConn, run_id: UUID, action: str) -> NoReturn:
        run = await self.get(conn, run_id)
        raise InvalidTransition(f"cannot {action} run {run_id}: it is {run.status.value}")

    async def _notify(self, conn: AsyncConn, payloads: list[str]) -> None:
        await conn.execute(self._q.job_run_notify, {"channel": self._q.schema,
                                                     "payloads": payloads})


def _timed(step: dict[str, Any]) -> dict[str, Any]:
    started, finished = step.get("started_at"), step.get("finished_at")
    duration = (finished - started).total_seconds() if started and finished else None
    return {**step, "duration_s": duration, "memoized": step["status"] == "completed"}
