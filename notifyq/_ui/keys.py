"""Keys: the key versions with their state, the live processes and the versions they hold,
rows per version of every registered encrypted column, the rotation's progress (a bar, the rate
and the time left), and the actions promote (after a confirmation that says which processes
lack the version), rotate and retire (the guards' answers shown as they are)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._errors import ConfigError, InvalidTransition, RotationInProgress
from notifyq._keys.admin import describe
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

    @router.post("/keys/{version}/promote", response_class=HTMLResponse)
    async def promote(request: Request, version: str) -> Response:
        form = await ui.form(request)
        number = _version(version)
        async with (await app.pool()).connection() as conn:
            if form.get("confirm") != "yes":
                ready = await app.keys.readiness(conn, number)
                return ui.page(request, ui.viewer(request), "keys_promote.html",
                               key_version=number, ready=ready,
                               lacking=describe(list(ready["lacking"])))
            by = f"dashboard (token {ui.viewer(request).name})"
            try:
                await app.keys.promote(conn, number, by=by)
            except (InvalidTransition, RotationInProgress) as exc:
                raise Problem(409, f"Key version {number} stays inactive", str(exc)) from None
        return redirect(request, "/keys", done="promote")

    @router.post("/keys/{version}/retire", response_class=HTMLResponse)
    async def retire(request: Request, version: str) -> Response:
        await ui.form(request)
        number = _version(version)
        async with (await app.pool()).connection() as conn:
            try:
                await app.keys.retire(conn, number)
            except (ConfigError, InvalidTransition) as exc:
                # The guard's answer, word for word: why it may not be retired yet.
                raise Problem(409, f"Key version {version} stays", str(exc)) from None
        return redirect(request, "/keys", done="retire")


def _version(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2_147_483_647:
        raise Problem(422, "Not a key version", f"{text[:20]!r} is not a key version")
    return int(text)
