"""Webhooks: endpoints with their health (success rate over the last day, last attempt, last
failure, why disabled), their deliveries; messages with every attempt (status code, duration,
error kind, response excerpt), pending ones with their next attempt and whether the circuit
holds them; messages filtered by event type and endpoint, their failed and retrying deliveries
counted; the event-type catalog (name, description, schema); and the actions resend, resend
every failed delivery of an endpoint since a time, send an endpoint the messages it missed
since a time (counted and confirmed first), enable / disable (after a confirmation)
and rotate secret.

A rotation answers with a redirect (reloading the page does not rotate again); the new secret
waits in this process's memory, keyed by the session's CSRF token and the endpoint, for
``REVEAL_S`` and is removed when the endpoint's page shows it: shown once, never in a URL,
a log or the database in clear."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._errors import ConfigError, InvalidEndpoint, InvalidTransition, WebhookNotFound
from notifyq._ui.web import Problem, Signed, Ui, query, redirect, required_time
from notifyq._webhooks.endpoints import Endpoint
from notifyq._webhooks.routes import MESSAGE_ID
from notifyq._webhooks.service import Webhooks

PAGE = 50
DONE = {"disable": "Endpoint disabled", "enable": "Endpoint enabled",
        "resend": "Resent", "rotate": "Secret rotated", "recover": "Failed deliveries resent",
        "replay": "Missed messages sent, a delivery each",
        "replay-more": "Missed messages sent, a delivery each; more are left: replay again",
        "replay-none": "Nothing to replay: the endpoint missed no message since then",
        "ordered": "Deliveries go one at a time, in send order",
        "unordered": "Deliveries go in parallel again",
        "give-up": "Delivery given up: the next message goes",
        "rate": "Rate limit saved"}
RECOVER_SINCE = timedelta(days=1)
"""What "Resend failed" offers to go back by, to begin with."""
REVEAL_S = 60.0
"""How long a rotated secret waits for its one showing (the redirect takes milliseconds)."""


class Reveals:
    """New secrets waiting to be shown once to the session that asked for them."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, UUID], tuple[float, str]] = {}

    def hold(self, csrf: str, endpoint_id: UUID, secret: str, now: float) -> None:
        self._waiting = {k: v for k, v in self._waiting.items() if v[0] > now}
        self._waiting[(csrf, endpoint_id)] = (now + REVEAL_S, secret)

    def take(self, csrf: str, endpoint_id: UUID, now: float) -> str | None:
        expires, secret = self._waiting.pop((csrf, endpoint_id), (0.0, None))
        return secret if expires > now else None


OPERATOR_EVENTS_SHOWN = 20
"""The recent operator events under the endpoints (``notifyq webhooks events`` lists more)."""


def _endpoint_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise Problem(422, "Not an endpoint id",
                      f"{text[:80]!r} is not an endpoint id (a UUID)") from None


def _message_id(text: str) -> str:
    if not re.fullmatch(MESSAGE_ID, text):
        raise Problem(422, "Not a message id", f"{text[:80]!r} is not a message id")
    return text


def _service_of(app: App) -> Callable[[], Webhooks]:
    def service() -> Webhooks:
        if app._webhooks is None:
            raise Problem(409, "Webhooks are not enabled here", "this server has no keyring "
                          "(webhook secrets are stored encrypted): set NOTIFYQ_KEYS and "
                          "NOTIFYQ_ACTIVE_KEY_VERSION, or remove webhooks.enabled=false")
        return app._webhooks
    return service


def add_webhook_pages(router: APIRouter, app: App, ui: Ui) -> None:
    reveals = Reveals()
    service = _service_of(app)

    @router.get("/webhooks", response_class=HTMLResponse)
    async def endpoints(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "webhooks.html", **await _overview(service()),
                       done=_done(request))

    @router.get("/webhooks/endpoints/{id}", response_class=HTMLResponse)
    async def endpoint(request: Request, id: str, viewer: Signed) -> Response:
        endpoint_id = _endpoint_id(id)
        hooks = service()
        found = await _endpoint(hooks, endpoint_id)
        before = request.query_params.get("cursor")
        deliveries = await hooks.list_messages(
            endpoint_id=endpoint_id, before=_message_id(before) if before else None,
            limit=PAGE)
        health = next(iter(await hooks.health(endpoint_ids=[endpoint_id])), None)
        secret = reveals.take(viewer.csrf, endpoint_id, time.monotonic())
        return ui.page(request, viewer, "webhook_endpoint.html", endpoint=found,
                       health=health, deliveries=deliveries, secret=secret,
                       next_cursor=deliveries[-1]["id"] if len(deliveries) == PAGE else None,
                       done=_done(request), recover_since=(datetime.now(UTC) - RECOVER_SINCE)
                       .strftime("%Y-%m-%dT%H:%M"))

    _add_order_actions(router, ui, service)  # before /{action}, which would take their paths

    @router.post("/webhooks/endpoints/{id}/{action}", response_class=HTMLResponse)
    async def endpoint_action(request: Request, id: str, action: str) -> Response:
        form = await ui.form(request)
        viewer, hooks, endpoint_id = ui.viewer(request), service(), _endpoint_id(id)
        if action == "disable" and form.get("confirm") != "yes":
            found, path = await _endpoint(hooks, endpoint_id), f"/webhooks/endpoints/{endpoint_id}"
            return ui.confirm(
                request, question=f"Disable {found.url}?",
                consequence="Its pending deliveries are canceled, with their runs, and no "
                "message is sent to it until it is enabled again (enabling does not bring the "
                "canceled deliveries back: resend them from their messages).",
                button="Disable and cancel pending deliveries", action=f"{path}/disable",
                back=path)
        try:
            if action in ("disable", "enable", "rate"):
                await _change(hooks, endpoint_id, action, form)
            elif action == "recover":
                since = _since(form)
                recovered = await hooks.recover(endpoint_id, since)
                return redirect(request, f"/webhooks/endpoints/{endpoint_id}", done=action,
                                changed=str(len(recovered)))
            elif action == "replay":
                since = _since(form)
                path = f"/webhooks/endpoints/{endpoint_id}"
                if form.get("confirm") != "yes":
                    found = await _endpoint(hooks, endpoint_id)
                    missed = await hooks.replay_missing(endpoint_id, since, dry_run=True)
                    if not missed.count:
                        return redirect(request, path, done="replay-none")
                    many = (f"at least {missed.count:,}; this sends the oldest {missed.count:,}"
                            if missed.more else f"{missed.count:,}")
                    return ui.confirm(
                        request,
                        question=f"Send {found.url} what it missed since {form['since']} UTC?",
                        consequence=f"It never got {many} message(s) sent since then (while "
                        "it was disabled, or before it subscribed to their type): each gets a "
                        "delivery and a new series of attempts.",
                        button="Send the missed messages", action=f"{path}/replay",
                        back=path, form=form)
                replayed = await hooks.replay_missing(endpoint_id, since)
                return redirect(request, path, done="replay-more" if replayed.more else action,
                                changed=str(replayed.count))
            elif action == "rotate":
                rotated = await hooks.rotate_secret(endpoint_id)
                assert rotated.secret is not None  # noqa: S101 - a rotation returns it
                reveals.hold(viewer.csrf, endpoint_id, rotated.secret, time.monotonic())
            else:
                raise Problem(404, "Not found", f"no action {action!r}")
        except WebhookNotFound:
            raise Problem(404, "No such endpoint", f"there is no endpoint {endpoint_id}") from None
        except (ConfigError, InvalidEndpoint) as exc:
            raise Problem(409, "Refused", str(exc)) from None
        return redirect(request, f"/webhooks/endpoints/{endpoint_id}", done=action)

    _add_message_pages(router, ui, service)


def _add_order_actions(router: APIRouter, ui: Ui, service: Callable[[], Webhooks]) -> None:
    """An endpoint's order (one delivery at a time, in send order, or in parallel) and giving
    up one of its pending deliveries (asked first): what unblocks an ordered endpoint."""

    @router.post("/webhooks/endpoints/{id}/order", response_class=HTMLResponse)
    async def order(request: Request, id: str) -> Response:
        form = await ui.form(request)
        endpoint_id, ordered = _endpoint_id(id), form.get("ordered") == "yes"
        await _endpoint(service(), endpoint_id)
        await service().update_endpoint(endpoint_id, ordered=ordered)
        return redirect(request, f"/webhooks/endpoints/{endpoint_id}",
                        done="ordered" if ordered else "unordered")

    @router.post("/webhooks/endpoints/{id}/give-up", response_class=HTMLResponse)
    async def give_up(request: Request, id: str) -> Response:
        form = await ui.form(request)
        endpoint_id = _endpoint_id(id)
        message_id = _message_id(form.get("message_id", ""))
        path = f"/webhooks/endpoints/{endpoint_id}"
        if form.get("confirm") != "yes":
            return ui.confirm(
                request, question=f"Give up message {message_id}?",
                consequence="Its delivery to this endpoint fails now and is not tried again "
                "(\"Resend failed\" can start it anew); on an ordered endpoint the next "
                "message goes at once.",
                button="Give up this delivery", action=f"{path}/give-up", back=path, form=form)
        try:
            await service().give_up(message_id, endpoint_id, reason="given up in the dashboard")
        except WebhookNotFound as exc:
            raise Problem(404, "Nothing to give up", str(exc)) from None
        except InvalidTransition as exc:
            raise Problem(409, "Refused", str(exc)) from None
        return redirect(request, path, done="give-up")


def _add_message_pages(router: APIRouter, ui: Ui, service: Callable[[], Webhooks]) -> None:

    @router.get("/webhooks/event-types", response_class=HTMLResponse)
    async def event_types(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "webhook_event_types.html",
                       event_types=await service().event_types())

    @router.get("/webhooks/messages", response_class=HTMLResponse)
    async def messages(request: Request, viewer: Signed) -> Response:
        hooks = service()
        filters = query(request.query_params, "type", "endpoint")
        before = request.query_params.get("cursor")
        items = await hooks.list_messages(
            before=_message_id(before) if before else None, limit=PAGE,
            event_type=filters.get("type"),
            to_endpoint=_endpoint_id(filters["endpoint"]) if "endpoint" in filters else None)
        return ui.page(request, viewer, "webhook_messages.html", messages=items,
                       filters=filters, endpoints=await hooks.list_endpoints(limit=1000),
                       next_cursor=items[-1]["id"] if len(items) == PAGE else None)

    @router.get("/webhooks/messages/{id}", response_class=HTMLResponse)
    async def message(request: Request, id: str, viewer: Signed) -> Response:
        hooks, message_id = service(), _message_id(id)
        try:
            found = await hooks.message(message_id)
        except WebhookNotFound:
            raise Problem(404, "No such message", f"there is no message {message_id}") from None
        attempts = await hooks.attempts(message_id)
        return ui.page(request, viewer, "webhook_message.html", message=found,
                       attempts=attempts, done=_done(request))

    @router.post("/webhooks/messages/{id}/resend")
    async def resend(request: Request, id: str) -> Response:
        form = await ui.form(request)
        message_id = _message_id(id)
        endpoint = form.get("endpoint_id") or None
        try:
            rows = await service().resend(message_id, endpoint_id=endpoint and
                                          _endpoint_id(endpoint))
        except WebhookNotFound as exc:
            raise Problem(404, "Nothing to resend", str(exc)) from None
        except InvalidTransition as exc:
            raise Problem(409, "Cannot resend", str(exc)) from None
        return redirect(request, f"/webhooks/messages/{message_id}", done="resend",
                        changed=str(len(rows)))


async def _overview(hooks: Webhooks) -> dict[str, Any]:
    """The Webhooks page: every endpoint with its health, and the latest operator events."""
    items = await hooks.list_endpoints(limit=1000)
    health = {h["endpoint_id"]: h for h in await hooks.health(
        endpoint_ids=[e.id for e in items])}
    return {"endpoints": items, "health": health,
            "events": await hooks.operator_events(limit=OPERATOR_EVENTS_SHOWN)}


async def _endpoint(hooks: Webhooks, endpoint_id: UUID) -> Endpoint:
    try:
        return await hooks.get_endpoint(endpoint_id)
    except WebhookNotFound:
        raise Problem(404, "No such endpoint", f"there is no endpoint {endpoint_id}") from None


async def _change(hooks: Webhooks, endpoint_id: UUID, action: str,
                  form: dict[str, str]) -> None:
    if action == "disable":
        await hooks.disable_endpoint(endpoint_id, "disabled in the dashboard")
    elif action == "enable":
        await hooks.enable_endpoint(endpoint_id)
    else:
        await hooks.update_endpoint(endpoint_id, rate_limit=_rate(form))


def _rate(form: dict[str, str]) -> int | None:
    """The rate-limit form's deliveries per second; empty: unlimited."""
    text = form.get("rate_limit", "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise Problem(422, "Invalid rate limit", f"rate_limit: {text!r} is not a whole number "
                      "of deliveries per second (leave it empty for unlimited)")
    return int(text)


def _since(form: dict[str, str]) -> datetime:
    return required_time(form, "since", "since: give a time (UTC)")


def _done(request: Request) -> dict[str, Any] | None:
    action = request.query_params.get("done")
    if action not in DONE:
        return None
    changed = request.query_params.get("changed", "")
    return {"action": action, "title": DONE[action],
            **({"changed": int(changed)} if changed.isdigit() else {})}
