"""Job types: per registered type (and any other with live or recent runs) its live runs by
state, each a link to exactly those runs, and over the last hour the runs finished, the
throughput and the failure rate. Read like the overview: partial indexes and the finished-runs
index by time, never the whole history."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._ui.web import Signed, Ui

LIVE_STATES = ("pending", "scheduled", "retrying", "running", "waiting")


def add_job_type_pages(router: APIRouter, app: App, ui: Ui) -> None:
    @router.get("/types", response_class=HTMLResponse)
    async def job_types(request: Request, viewer: Signed) -> Response:
        async with (await app.pool()).connection() as conn:
            rows = await app._control.type_overview(conn)
        return ui.page(request, viewer, "types.html", types=[_rates(r) for r in rows],
                       live_states=LIVE_STATES)


def _rates(row: dict[str, Any]) -> dict[str, Any]:
    """Completed a minute, and the share of the finished runs that failed (or timed out);
    canceled ones are neither."""
    done, failed = row["completed_last_hour"], row["failed_last_hour"]
    return {**row, "per_minute": done / 60,
            "failure_rate": failed / (done + failed) if done + failed else None}
