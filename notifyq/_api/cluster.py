"""The ``/v1`` routes about the cluster as a whole: the per-pool overview, per-minute series,
workers and leaders, pausing and resuming pools and job types; and the run
filter that ``GET /v1/jobs`` and the dashboard share. Thin calls into
:class:`~notifyq._control.RunControl` and :class:`~notifyq._pause.PauseControl`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Path, Query
from fastapi.exceptions import RequestValidationError

from notifyq._api import schemas
from notifyq._app import App
from notifyq._control import RunFilter
from notifyq._http.schemas import responses_for
from notifyq._limits import JOB_TYPE, POOL
from notifyq._pause import PauseKind
from notifyq._rate import list_windows
from notifyq._run import RunStatus

AUTH = (401, 403)
Label = Annotated[str | None, Query(min_length=1, max_length=512, pattern=r"^[^\x00]+$")]


def run_filter(  # noqa: PLR0917 - one parameter per query filter
    status: RunStatus | None = None,
    type: Annotated[str | None, Query(pattern=JOB_TYPE.pattern)] = None,
    pool: Annotated[str | None, Query(pattern=POOL.pattern)] = None,
    tag: Annotated[str | None, Query(min_length=1, max_length=128,
                                     pattern=r"^[^\x00]+$")] = None,
    scope: Label = None,
    scope_id: Label = None,
    tenant: Label = None,
    parent: UUID | None = None,
    created_after: Annotated[datetime | None, Query(
        description="runs created at or after this time")] = None,
    created_before: Annotated[datetime | None, Query(
        description="runs created before this time")] = None,
    id_prefix: Annotated[str | None, Query(
        pattern=r"^[0-9a-fA-F-]*[0-9a-fA-F][0-9a-fA-F-]*$", max_length=36,
        description="the start of the run id")] = None,
) -> RunFilter:
    """A FastAPI dependency: the query string's run filter (422 naming a bad parameter)."""
    try:
        return RunFilter(status=status.value if status else None, job_type=type, pool=pool,
                         tag=tag, scope_entity_type=scope, scope_entity_id=scope_id,
                         tenant_id=tenant, parent_run_id=parent, created_after=created_after,
                         created_before=created_before, id_prefix=id_prefix)
    except ValueError as exc:
        raise RequestValidationError([{"loc": ("query", "id_prefix"), "msg": str(exc),
                                       "type": "value_error"}]) from None


def add_cluster_routes(router: APIRouter, app: App, read: list[Any], admin: list[Any]) -> None:
    control = app._control
    _add_pause_routes(router, app, read, admin)

    @router.get("/stats/pools", dependencies=read, response_model=schemas.PoolsOut,
                responses=responses_for(*AUTH),
                summary="Per pool: runnable, scheduled, running, waiting, failed in the last "
                        "hour, oldest runnable age")
    async def pools() -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            return {"items": await control.overview(conn)}

    @router.get("/stats/series", dependencies=read, response_model=schemas.SeriesOut,
                responses=responses_for(*AUTH),
                summary="Per minute: runs completed and failed, queue latency p50/p95")
    async def series(minutes: Annotated[int, Query(ge=1, le=1440)] = 60) -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            return {"items": await control.series(conn, minutes)}

    @router.get("/rate-limits", dependencies=read, response_model=schemas.RateWindowsOut,
                responses=responses_for(*AUTH),
                summary="Rate-limited keys: starts in the current window, runnable backlog, "
                        "when the next run may start")
    async def rate_limits() -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            windows = await list_windows(conn, app._runtime.queries, app.clock)
        return {"items": [w.to_json() for w in windows]}

    @router.get("/workers", dependencies=read, response_model=schemas.WorkersOut,
                responses=responses_for(*AUTH),
                summary="Workers alive (once they register) and the current leaders")
    async def workers() -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            return (await control.list_workers(conn)).to_json()



PoolName = Annotated[str, Path(pattern=POOL.pattern, description="the pool's name")]
TypeName = Annotated[str, Path(pattern=JOB_TYPE.pattern, description="the job type")]


def _add_pause_routes(router: APIRouter, app: App, read: list[Any], admin: list[Any]) -> None:
    pauses = app._pauses

    async def pause(kind: PauseKind, name: str, body: schemas.PauseIn | None) -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            paused, created = await pauses.pause(conn, kind, name,
                                                 reason=body.reason if body else None)
        return {**paused.to_json(), "created": created}

    async def resume(kind: PauseKind, name: str) -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            resumed = await pauses.resume(conn, kind, name)
        return {"kind": kind, "name": name, "resumed": resumed is not None}

    @router.get("/pauses", dependencies=read, response_model=schemas.PausesOut,
                responses=responses_for(*AUTH), summary="The paused pools and job types")
    async def list_pauses() -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            return {"items": [p.to_json() for p in await pauses.list(conn)]}

    @router.post("/pools/{name}/pause", dependencies=admin, response_model=schemas.PausedOut,
                 responses=responses_for(*AUTH),
                 summary="Pause a pool: no worker claims its runs from its next claim on; "
                         "running runs finish")
    async def pause_pool(name: PoolName,
                         body: Annotated[schemas.PauseIn | None, Body()] = None) -> Any:
        return await pause("pool", name, body)

    @router.post("/pools/{name}/resume", dependencies=admin, response_model=schemas.ResumedOut,
                 responses=responses_for(*AUTH),
                 summary="Resume a paused pool (its workers are woken at once)")
    async def resume_pool(name: PoolName) -> Any:
        return await resume("pool", name)

    @router.post("/types/{name}/pause", dependencies=admin, response_model=schemas.PausedOut,
                 responses=responses_for(*AUTH),
                 summary="Pause a job type: no worker claims its runs from its next claim "
                         "on; running runs finish")
    async def pause_type(name: TypeName,
                         body: Annotated[schemas.PauseIn | None, Body()] = None) -> Any:
        return await pause("type", name, body)

    @router.post("/types/{name}/resume", dependencies=admin, response_model=schemas.ResumedOut,
                 responses=responses_for(*AUTH),
                 summary="Resume a paused job type (the pools' workers are woken at once)")
    async def resume_type(name: TypeName) -> Any:
        return await resume("type", name)
