"""Periodic schedules: each one's cadence (interval, or cron and time zone), whether it is paused,
its last tick (with its run) and next tick; admins pause and resume them (on every node, as
``notifyq schedules pause`` does) and trigger one run now."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._errors import ConfigError, ScheduleNotFound
from notifyq._ui.web import Problem, Signed, Ui, redirect

DONE = {"pause": "Schedule paused", "resume": "Schedule resumed",
        "trigger": "Schedule triggered: one run enqueued now"}


def add_schedule_pages(router: APIRouter, app: App, ui: Ui) -> None:

    @router.get("/schedules", response_class=HTMLResponse)
    async def schedules(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "schedules.html", schedules=await app.schedules(),
                       done=_done(request))

    @router.post("/schedules/{name:path}/pause")
    async def pause(request: Request, name: str) -> Response:
        await ui.form(request)  # admin, Origin, CSRF
        return await _act(request, name, "pause", app.pause_schedule)

    @router.post("/schedules/{name:path}/resume")
    async def resume(request: Request, name: str) -> Response:
        await ui.form(request)
        return await _act(request, name, "resume", app.resume_schedule)

    @router.post("/schedules/{name:path}/trigger")
    async def trigger(request: Request, name: str) -> Response:
        await ui.form(request)
        return await _act(request, name, "trigger", app.trigger_schedule)


async def _act(request: Request, name: str, action: str, change: Any) -> Response:
    try:
        await change(name)
    except ScheduleNotFound as exc:
        raise Problem(404, "No such schedule", str(exc)) from None
    except ConfigError as exc:
        raise Problem(409, "Cannot trigger this schedule", str(exc)) from None
    return redirect(request, "/schedules", done=action)


def _done(request: Request) -> dict[str, str] | None:
    action = request.query_params.get("done", "")
    return {"action": action, "title": DONE[action]} if action in DONE else None
