"""Periodic schedules: each one's cadence (interval, or cron and time zone), whether it is paused,
its last tick (with its run) and next tick."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._ui.web import Signed, Ui


def add_schedule_pages(router: APIRouter, app: App, ui: Ui) -> None:

    @router.get("/schedules", response_class=HTMLResponse)
    async def schedules(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "schedules.html", schedules=await app.schedules())
