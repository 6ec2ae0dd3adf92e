"""The customer portal's pages: one tenant's endpoints (list, add with event types from the
catalog, disable / enable, rotate secret shown once, change event types, resend failed, replay
missed), the messages delivered to them with every attempt (resend one), and the event-type
catalog.

Every page and action checks the session's tenant in SQL before it reads or changes anything:
an endpoint of another tenant (or of none) and a message with no delivery to the tenant's
endpoints are a 404 with the words of an unknown id. A message sent by event type to several
tenants' endpoints shows only this tenant's deliveries and attempts.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._errors import ConfigError, InvalidEndpoint, WebhookNotFound
from notifyq._ui.portal_web import Customer, PortalUi
from notifyq._ui.web import Problem, read_form_lists, redirect
from notifyq._ui.webhooks import (
    DONE,
    PAGE,
    RECOVER_SINCE,
    Reveals,
    _endpoint_id,
    _message_id,
    _since,
)
from notifyq._webhooks.endpoints import Endpoint

DONE_HERE = {**DONE, "added": "Endpoint added", "types": "Event types saved"}


def add_portal_pages(router: APIRouter, ui: PortalUi) -> None:
    reveals = Reveals()
    _add_endpoint_pages(router, ui, reveals)
    _add_endpoint_actions(router, ui, reveals)
    _add_message_pages(router, ui)

    @router.get("/event-types", response_class=HTMLResponse)
    async def event_types(request: Request) -> Response:
        viewer = await ui.viewer(request)
        return ui.page(request, viewer, "portal_event_types.html",
                       event_types=await ui.hooks().event_types())


async def _own_endpoint(ui: PortalUi, viewer: Customer, text: str) -> Endpoint:
    """The endpoint ``text`` names if it is the viewer's tenant's, else a 404 (the same page
    as for an id that does not exist)."""
    endpoint_id = _endpoint_id(text)
    try:
        if await ui.portal.owns(endpoint_id, viewer.tenant_id):
            return await ui.hooks().get_endpoint(endpoint_id)
    except WebhookNotFound:
        pass
    raise Problem(404, "No such endpoint", f"there is no endpoint {endpoint_id}")


def _types(form: dict[str, list[str]]) -> list[str] | None:
    """The event types chosen in the form: None for every type (the default), else the ticked
    ones (or, without a catalog, the names typed, comma-separated); at least one."""
    if form.get("all_types", ["yes"])[-1] != "no":
        return None
    chosen = sorted({t.strip() for field in form.get("event_type", [])
                     for t in field.split(",") if t.strip()})
    if not chosen:
        raise InvalidEndpoint("event_types: choose at least one event type, or every type")
    return chosen


def _add_endpoint_pages(router: APIRouter, ui: PortalUi, reveals: Reveals) -> None:
    @router.get("/", response_class=HTMLResponse)
    async def endpoints(request: Request) -> Response:
        viewer = await ui.viewer(request)
        hooks = ui.hooks()
        items = await hooks.list_endpoints(tenant_ids=[viewer.tenant_id], limit=1000)
        health = {h["endpoint_id"]: h for h in await hooks.health(
            endpoint_ids=[e.id for e in items], tenant_ids=[viewer.tenant_id])}
        return ui.page(request, viewer, "portal_endpoints.html", endpoints=items,
                       health=health, done=_done(request))

    @router.get("/endpoints/new", response_class=HTMLResponse)
    async def new_endpoint(request: Request) -> Response:
        viewer = await ui.viewer(request)
        return ui.page(request, viewer, "portal_endpoint_new.html",
                       event_types=await ui.hooks().event_types(), error=None, given={})

    @router.post("/endpoints", response_class=HTMLResponse)
    async def add_endpoint(request: Request) -> Response:
        viewer, form = await ui.form(request)
        lists = await read_form_lists(request)
        hooks = ui.hooks()
        try:
            created = await hooks.create_endpoint(
                form.get("url", "").strip(), description=form.get("description", "").strip(),
                event_types=_types(lists), tenant_id=viewer.tenant_id)
        except (InvalidEndpoint, ConfigError) as exc:
            return ui.page(request, viewer, "portal_endpoint_new.html", status=422,
                           event_types=await hooks.event_types(), error=str(exc),
                           given={**form, "types": lists.get("event_type", [])})
        assert created.secret is not None  # noqa: S101 - a new endpoint carries it
        reveals.hold(viewer.csrf, created.id, created.secret, time.monotonic())
        return redirect(request, f"/endpoints/{created.id}", done="added")

    @router.get("/endpoints/{id}", response_class=HTMLResponse)
    async def endpoint(request: Request, id: str) -> Response:
        viewer = await ui.viewer(request)
        found = await _own_endpoint(ui, viewer, id)
        hooks = ui.hooks()
        before = request.query_params.get("cursor")
        deliveries = await hooks.list_messages(
            endpoint_id=found.id, before=_message_id(before) if before else None, limit=PAGE)
        health = next(iter(await hooks.health(endpoint_ids=[found.id])), None)
        secret = reveals.take(viewer.csrf, found.id, time.monotonic())
        return ui.page(request, viewer, "portal_endpoint.html", endpoint=found, health=health,
                       deliveries=deliveries, secret=secret,
                       event_types=await hooks.event_types(),
                       next_cursor=deliveries[-1]["id"] if len(deliveries) == PAGE else None,
                       done=_done(request),
                       recover_since=(datetime.now(UTC) - RECOVER_SINCE)
                       .strftime("%Y-%m-%dT%H:%M"))


def _done(request: Request) -> dict[str, Any] | None:
    action = request.query_params.get("done")
    if action not in DONE_HERE:
        return None
    changed = request.query_params.get("changed", "")
    return {"action": action, "title": DONE_HERE[action],
            **({"changed": int(changed)} if changed.isdigit() else {})}


def _add_endpoint_actions(router: APIRouter, ui: PortalUi, reveals: Reveals) -> None:
    @router.post("/endpoints/{id}/{action}", response_class=HTMLResponse)
    async def endpoint_action(request: Request, id: str, action: str) -> Response:
        viewer, form = await ui.form(request)
        found = await _own_endpoint(ui, viewer, id)
        hooks, path = ui.hooks(), f"/endpoints/{found.id}"
        try:
            if action == "disable":
                if form.get("confirm") != "yes":
                    return ui.confirm(
                        request, viewer, question=f"Disable {found.url}?",
                        consequence="Its pending deliveries are canceled and nothing is sent "
                        "to it until you enable it again (then \"Replay missed\" sends what "
                        "it missed).", button="Disable and cancel pending deliveries",
                        action=f"{path}/disable", back=path)
                await hooks.disable_endpoint(found.id, "disabled in the customer portal")
            elif action == "enable":
                await hooks.enable_endpoint(found.id)
            elif action == "rotate":
                rotated = await hooks.rotate_secret(found.id)
                assert rotated.secret is not None  # noqa: S101 - a rotation returns it
                reveals.hold(viewer.csrf, found.id, rotated.secret, time.monotonic())
            elif action == "event-types":
                await hooks.update_endpoint(found.id,
                                            event_types=_types(await read_form_lists(request)))
            elif action == "recover":
                recovered = await hooks.recover(found.id, _since(form))
                return redirect(request, path, done=action, changed=str(len(recovered)))
            elif action == "replay":
                return await _replay(request, ui, viewer, found, form)
            else:
                raise Problem(404, "Not found", f"no action {action[:40]!r}")
        except WebhookNotFound:
            raise Problem(404, "No such endpoint", f"there is no endpoint {found.id}") from None
        except (ConfigError, InvalidEndpoint) as exc:
            raise Problem(422 if isinstance(exc, InvalidEndpoint) else 409, "Refused",
                          str(exc)) from None
        return redirect(request, path, done="types" if action == "event-types" else action)


async def _replay(request: Request, ui: PortalUi, viewer: Customer, found: Endpoint,
                  form: dict[str, str]) -> Response:
    hooks, path, since = ui.hooks(), f"/endpoints/{found.id}", _since(form)
    if form.get("confirm") != "yes":
        missed = await hooks.replay_missing(found.id, since, dry_run=True)
        if not missed.count:
            return redirect(request, path, done="replay-none")
        many = (f"at least {missed.count:,}; this sends the oldest {missed.count:,}"
                if missed.more else f"{missed.count:,}")
        return ui.confirm(
            request, viewer, question=f"Send {found.url} what it missed since {form['since']} "
            "UTC?", consequence=f"It never got {many} message(s) sent since then: each gets a "
            "delivery and a new series of attempts.", button="Send the missed messages",
            action=f"{path}/replay", back=path, form=form)
    replayed = await hooks.replay_missing(found.id, since)
    return redirect(request, path, done="replay-more" if replayed.more else "replay",
                    changed=str(replayed.count))


def _add_message_pages(router: APIRouter, ui: PortalUi) -> None:
    @router.get("/messages", response_class=HTMLResponse)
    async def messages(request: Request) -> Response:
        viewer = await ui.viewer(request)
        before = request.query_params.get("cursor")
        items = await ui.portal.messages(viewer.tenant_id, limit=PAGE,
                                         before=_message_id(before) if before else None)
        return ui.page(request, viewer, "portal_messages.html", messages=items,
                       next_cursor=items[-1]["id"] if len(items) == PAGE else None)

    @router.get("/messages/{id}", response_class=HTMLResponse)
    async def message(request: Request, id: str) -> Response:
        viewer = await ui.viewer(request)
        message_id, hooks = _message_id(id), ui.hooks()
        mine = await _reached(ui, viewer, message_id)
        found = await hooks.message(message_id)
        deliveries = [d for d in found["deliveries"] if d["endpoint_id"] in mine]
        attempts = [a for a in await hooks.attempts(message_id) if a["endpoint_id"] in mine]
        return ui.page(request, viewer, "portal_message.html",
                       message={**found, "deliveries": deliveries}, attempts=attempts,
                       done=_done(request))

    @router.post("/messages/{id}/resend")
    async def resend(request: Request, id: str) -> Response:
        viewer, form = await ui.form(request)
        message_id = _message_id(id)
        mine = await _reached(ui, viewer, message_id)
        endpoint = _endpoint_id(form.get("endpoint_id", ""))
        if endpoint not in mine:
            raise Problem(404, "Nothing to resend", f"no delivery of webhook message "
                          f"{message_id} to endpoint {endpoint}")
        rows = await ui.hooks().resend(message_id, endpoint_id=endpoint)
        return redirect(request, f"/messages/{message_id}", done="resend",
                        changed=str(len(rows)))


async def _reached(ui: PortalUi, viewer: Customer, message_id: str) -> set[Any]:
    mine = await ui.portal.reached(message_id, viewer.tenant_id)
    if not mine:
        raise Problem(404, "No such message", f"there is no message {message_id}")
    return mine
