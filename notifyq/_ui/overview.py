"""The overview: per pool what is runnable, scheduled, running, waiting and failed in the last
hour, the oldest runnable run's age, whether it is paused, why and since when (with pause,
after a confirmation, and resume for admins; idle pools are listed too),
workers and leaders; charts of the last hour per minute. The panels refresh every few seconds
(htmx), the charts from their JSON (uPlot)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from notifyq._app import App
from notifyq._limits import POOL
from notifyq._ui.web import SECURITY_HEADERS, Problem, Signed, Ui, redirect

REFRESH_S = 2


def add_overview_pages(router: APIRouter, app: App, ui: Ui) -> None:
    control = app._control

    async def panels() -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            pools = await control.overview(conn)
            workers = await control.list_workers(conn)
        return {"pools": pools, "workers": workers, "refresh_s": REFRESH_S}

    @router.get("/", response_class=HTMLResponse)
    async def overview(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "overview.html", **await panels())

    @router.get("/overview/panels", response_class=HTMLResponse)
    async def overview_panels(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "overview_panels.html", **await panels())

    @router.get("/overview/series.json")
    async def series(viewer: Signed,
                     minutes: Annotated[int, Query(ge=1, le=1440)] = 60) -> Response:
        async with (await app.pool()).connection() as conn:
            rows = await control.series(conn, minutes)
        # Columns, as uPlot takes them: x in Unix seconds, then one array per series.
        data = {"t": [int(r["minute"].timestamp()) for r in rows],
                "completed": [r["completed"] / 60 for r in rows],
                "failed": [r["failed"] / 60 for r in rows],
                "p50": [r["latency_p50_s"] for r in rows],
                "p95": [r["latency_p95_s"] for r in rows]}
        return JSONResponse(data, headers=SECURITY_HEADERS)

    @router.post("/pools/{pool}/{action}")
    async def pause_or_resume(request: Request, pool: str, action: str) -> Response:
        form = await ui.form(request)  # admin, Origin, CSRF
        if not POOL.fullmatch(pool):
            raise Problem(422, "Not a pool name", f"{pool!r} must match {POOL.pattern}")
        if action == "pause" and form.get("confirm") != "yes":
            return ui.confirm(
                request, question=f"Pause pool {pool}?",
                consequence="Workers stop claiming its runs at their next claim; runs already "
                "running finish. Its pending runs wait until it is resumed.",
                button=f"Pause {pool}", action=f"/pools/{pool}/pause", back="/")
        if action == "pause":
            await app.pause(pool=pool, reason="paused from the dashboard")
        elif action == "resume":
            await app.resume(pool=pool)
        else:
            raise Problem(404, "Not found", f"no action {action!r}")
        return redirect(request, "/")
