"""The ``/v1/schedules`` routes: periodic schedules with their last and next tick; pause and
resume one (the state is in the database, so every worker obeys), or trigger one now. Thin
calls into :class:`notifyq.App`.

A schedule's name may hold ``/`` (``report.build@cron(*/15 * * * *, UTC)``): the path takes it
whole, percent-encoded or not.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from notifyq._api import schemas
from notifyq._app import App
from notifyq._http.schemas import responses_for

AUTH = (401, 403)
Name = Annotated[str, Path(min_length=1, max_length=512, description="the schedule's name")]


def add_schedule_routes(router: APIRouter, app: App, read: list[Any], admin: list[Any]) -> None:

    @router.get("/schedules", dependencies=read, response_model=schemas.SchedulesOut,
                responses=responses_for(*AUTH),
                summary="Periodic schedules: cadence, paused or not, last and next tick")
    async def schedules() -> dict[str, Any]:
        return {"items": await app.schedules()}

    @router.post("/schedules/{name:path}/pause", dependencies=admin,
                 response_model=schemas.SchedulePaused, responses=responses_for(404, 422, *AUTH),
                 summary="Pause a schedule on every node until it is resumed")
    async def pause(name: Name) -> dict[str, Any]:
        return await app.pause_schedule(name)

    @router.post("/schedules/{name:path}/resume", dependencies=admin,
                 response_model=schemas.ScheduleResumed, responses=responses_for(404, 422, *AUTH),
                 summary="Resume a paused schedule; the ticks it was paused for are skipped")
    async def resume(name: Name) -> dict[str, Any]:
        return await app.resume_schedule(name)

    @router.post("/schedules/{name:path}/trigger", dependencies=admin, status_code=201,
                 response_model=schemas.ScheduleTriggered,
                 responses=responses_for(404, 409, 422, *AUTH),
                 summary="Enqueue one run of a schedule now, outside its cadence")
    async def trigger(name: Name) -> dict[str, Any]:
        return await app.trigger_schedule(name)
