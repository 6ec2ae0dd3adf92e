"""Periodic schedules: each schedule's interval, last tick (with its run) and next tick."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._maintenance.scheduler import schedule_list
from notifyq._ui.web import Signed, Ui


def add_schedule_pages(router: APIRouter, app: App, ui: Ui) -> None:

    @router.get("/schedules", response_class=HTMLResponse)
    async def schedules(request: Request, viewer: Signed) -> Response:
        async with (await app.pool()).connection() as conn:
            items = await schedule_list(conn, app._runtime.queries, app._registry.periodic,
                                        app.clock.now())
        return ui.page(request, viewer, "schedules.html", schedules=items)
