"""A run's actions beyond cancel, retry and signal (runs.py), as the API does them: replay from
a step, delete, reschedule, and pause or resume its job type. Replay, delete and a pause ask to
confirm first: a page that says what will happen and posts the same form again with
``confirm=yes`` (no script needed). Like every change, admin sessions only: ``Ui.form``
refuses read-only ones.

These routes are added before runs.py's ``/runs/{id}/{action}``, which would take them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._control import BulkAction, BulkOptions
from notifyq._errors import InvalidTransition, RunNotFound, UnknownStep
from notifyq._ui.runs import run_id
from notifyq._ui.web import Problem, Ui, redirect, required_time

ASKS = {
    "replay": ("Replay this run from step {from_step}?",
               "The steps it recorded before that one are reused; that step and every later "
               "one run again, with their side effects.", "Replay from {from_step}"),
    "delete": ("Delete this run?",
               "Its record, steps, input and output are deleted for good.", "Delete the run"),
    "pause_type": ("Pause job type {job_type}?",
                   "No worker claims its runs (in any pool) until it is resumed: pending runs "
                   "wait, running ones finish.", "Pause {job_type}"),
}
"""What each action asks before it acts: the question, what it does, the button."""


def add_run_actions(router: APIRouter, app: App, ui: Ui) -> None:
    control = app._control

    def confirmed(request: Request, target: UUID, action: str,
                  form: dict[str, str], **words: str) -> Response | None:
        """The confirmation page, unless the form says it was confirmed."""
        if action not in ASKS or form.get("confirm") == "yes":
            return None
        question, consequence, button = (text.format(**words) for text in ASKS[action])
        return ui.confirm(request, question=question, consequence=consequence, button=button,
                          action=f"/runs/{target}/{action}", back=f"/runs/{target}", form=form)

    @router.post("/runs/{id}/replay", response_class=HTMLResponse)
    async def replay(request: Request, id: str) -> Response:
        form = await ui.form(request)
        target, step = run_id(id), form.get("from_step", "")
        if asked := confirmed(request, target, "replay", form, from_step=step):
            return asked
        with _refusals(target, "replay"):
            await app.replay(target, from_step=step)
        return redirect(request, f"/runs/{target}", done="replay")

    @router.post("/runs/{id}/delete", response_class=HTMLResponse)
    async def delete(request: Request, id: str) -> Response:
        form = await ui.form(request)
        target = run_id(id)
        if asked := confirmed(request, target, "delete", form):
            return asked
        await _change(app, target, "delete")
        return redirect(request, "/runs", done="delete", changed="1")

    @router.post("/runs/{id}/reschedule")
    async def reschedule(request: Request, id: str) -> Response:
        form = await ui.form(request)
        target = run_id(id)
        run_at = required_time(form, "run_at", "run_at: when the run may start (UTC)")
        await _change(app, target, "reschedule", run_at=run_at)
        return redirect(request, f"/runs/{target}", done="reschedule")

    async def type_action(request: Request, id: str, action: str) -> Response:
        form = await ui.form(request)
        target = run_id(id)
        async with (await app.pool()).connection() as conn:
            with _refusals(target, action):
                job_type = (await control.get(conn, target)).job_type
        if action == "resume":
            await app.resume(job_type=job_type)
        elif asked := confirmed(request, target, "pause_type", form, job_type=job_type):
            return asked
        else:
            await app.pause(job_type=job_type, reason="paused from the dashboard")
        return redirect(request, f"/runs/{target}", done=f"{action}_type")

    @router.post("/runs/{id}/pause_type", response_class=HTMLResponse)
    async def pause_type(request: Request, id: str) -> Response:
        return await type_action(request, id, "pause")

    @router.post("/runs/{id}/resume_type")
    async def resume_type(request: Request, id: str) -> Response:
        return await type_action(request, id, "resume")


async def _change(app: App, target: UUID, action: BulkAction, **options: Any) -> None:
    """Delete or reschedule one run as the API's bulk action does (the same statuses)."""
    try:
        async with (await app.pool()).connection() as conn:
            done = await app._control.bulk(conn, action, ids=[target],
                                           options=BulkOptions(**options))
            if not done.changed:
                run = await app._control.get(conn, target)
    except RunNotFound:
        raise Problem(404, "No such run", f"there is no run {target}") from None
    except ValueError as exc:
        raise Problem(422, f"Cannot {action} this run", str(exc)) from None
    if not done.changed:
        only = ("finished runs (cancel a live one first)" if action == "delete"
                else "pending runs")
        raise Problem(409, f"Cannot {action} this run",
                      f"run {target} is {run.status.value}: only {only} can be {action}d")


@contextmanager
def _refusals(target: UUID, action: str) -> Iterator[None]:
    try:
        yield
    except RunNotFound:
        raise Problem(404, "No such run", f"there is no run {target}") from None
    except UnknownStep as exc:
        raise Problem(422, "No such step", str(exc)) from None
    except InvalidTransition as exc:
        raise Problem(409, f"Cannot {action} this run", str(exc)) from None
