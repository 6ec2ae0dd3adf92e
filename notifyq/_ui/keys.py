"""Keys: the key versions with their state, rows per version of every registered encrypted
column, the rotation's progress (a bar, the rate and the time left), and the actions rotate and
retire (the retirement guard's answer shown as it is)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._errors import ConfigError, InvalidTransition, RotationInProgress
from notifyq._ui.web import Problem, Signed, Ui, redirect


def add_key_pages(router: APIRouter, app: App, ui: Ui) -> None:

    async def status() -> dict[str, Any] | None:
        async with (await app.pool()).connection() as conn:
            try:
                return await app.keys.status(conn)
            except ConfigError:
                return None

    @router.get("/keys", response_class=HTMLResponse)
    async def keys(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "keys.html", keys=await status(),
                       keyring=app.has_keyring, done=request.query_params.get("done"))

    @router.get("/keys/panel", response_class=HTMLResponse)
    async def progress(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "keys_panel.html", keys=await status())

    @router.post("/keys/rotate")
    async def rotate(request: Request) -> Response:
        await ui.form(request)
        async with (await app.pool()).connection() as conn:
            try:
                await app.keys.rotate(conn)
            except (ConfigError, RotationInProgress) as exc:
                raise Problem(409, "Cannot rotate now", str(exc)) from None
        return redirect(request, "/keys", done="rotate")

    @router.post("/keys/{version}/retire", response_class=HTMLResponse)
    async def retire(request: Request, version: str) -> Response:
        await ui.form(request)
        if not version.isdigit() or not 1 <= int(version) <= 2_147_483_647:
            raise Problem(422, "Not a key version", f"{version[:20]!r} is not a key version")
        async with (await app.pool()).connection() as conn:
            try:
                await app.keys.retire(conn, int(version))
            except (ConfigError, InvalidTransition) as exc:
                # The guard's answer, word for word: why it may not be retired yet.
                raise Problem(409, f"Key version {version} stays", str(exc)) from None
        return redirect(request, "/keys", done="retire")
