"""Errors as RFC 9457 problem details (``application/problem+json``), naming the field at
fault. Every refusal is a 4xx with one of these bodies; nothing a client sends becomes a 500."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import psycopg_pool
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from notifyq._errors import (
    ConcurrencyRejected,
    ConfigError,
    DatabaseUnavailable,
    InvalidEnqueue,
    InvalidTransition,
    PayloadTooLarge,
    RotationInProgress,
    RunNotFound,
    ScheduleNotFound,
    SchemaError,
)

log = logging.getLogger("notifyq.api")

MEDIA_TYPE = "application/problem+json"

TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
          405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
          413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
          500: "Internal Server Error", 503: "Service Unavailable"}

# The database went away (or never came): a 503 the client may retry, not a bug.
_DATABASE_DOWN = (psycopg.OperationalError, psycopg_pool.PoolTimeout, DatabaseUnavailable)


class ProblemResponse(JSONResponse):
    media_type = MEDIA_TYPE


def problem(status: int, detail: str, *, field: str | None = None,
            errors: list[dict[str, str]] | None = None,
            headers: dict[str, str] | None = None,
            extra: dict[str, Any] | None = None) -> ProblemResponse:
    """``extra``: members beside the standard ones (RFC 9457 extensions)."""
    body: dict[str, Any] = {"type": "about:blank", "title": TITLES.get(status, "Error"),
                            "status": status, "detail": detail}
    if field is not None:
        body["field"] = field
    if errors:
        body["errors"] = errors
    body.update(extra or {})
    return ProblemResponse(body, status_code=status, headers=headers)


def _field(loc: tuple[int | str, ...] | list[int | str]) -> str:
    # Union members appear in the location as tags ("dict[str,any]", "function-after[...]"):
    # the field is the path without them.
    parts = [str(p) for p in loc if isinstance(p, int) or p.isidentifier()]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:] or parts
    return ".".join(parts) or "body"


async def _validation(_: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, RequestValidationError)  # noqa: S101 - registered for this type
    errors: list[dict[str, str]] = []
    for error in exc.errors():
        item = {"field": _field(error.get("loc", ())), "message": str(error.get("msg", ""))}
        if item not in errors:
            errors.append(item)
    invalid = [e for e in exc.errors() if e.get("type") == "json_invalid"]
    if invalid:
        where = invalid[0].get("loc", ("body", "?"))[-1]
        reason = invalid[0].get("ctx", {}).get("error", "JSON decode error")
        return problem(400, f"the request body is not valid JSON ({reason} at character "
                       f"{where})", field="body")
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    return problem(422, f"{first['field']}: {first['message']}", field=first["field"],
                   errors=errors)


async def _http(_: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for this type
    return problem(exc.status_code, str(exc.detail),
                   headers=dict(exc.headers) if exc.headers else None)


async def _not_found(_: Request, exc: Exception) -> ProblemResponse:
    return problem(404, str(exc), field="id")


async def _schedule_not_found(_: Request, exc: Exception) -> ProblemResponse:
    return problem(404, str(exc), field="name")


async def _transition(_: Request, exc: Exception) -> ProblemResponse:
    return problem(409, str(exc), field="id")


async def _busy(_: Request, exc: Exception) -> ProblemResponse:
    return problem(409, str(exc), field="concurrency_key")


async def _config(_: Request, exc: Exception) -> ProblemResponse:
    """This server's configuration does not allow the request (e.g. webhooks without a
    keyring): the message says what to configure."""
    return problem(409, str(exc))


async def _schema(_: Request, exc: Exception) -> ProblemResponse:
    return problem(503, str(exc))


async def _invalid(_: Request, exc: Exception) -> ProblemResponse:
    if isinstance(exc, PayloadTooLarge):
        return problem(413, str(exc), field="input")
    return problem(422, str(exc), field=_enqueue_field(str(exc)))


def _enqueue_field(message: str) -> str:
    """InvalidEnqueue messages name their field in words; pick it out for the problem body."""
    text = message.split(": ", 1)[-1] if message.startswith("item ") else message
    for name in ("job type", "input", "pool", "priority", "max_attempts", "run_at", "tags",
                 "dedupe_key", "tenant_id", "concurrency", "dedupe", "scope"):
        if name in text:
            return "job_type" if name == "job type" else name
    return "body"


def install(api: FastAPI) -> None:
    api.add_exception_handler(RequestValidationError, _validation)
    api.add_exception_handler(HTTPException, _http)
    api.add_exception_handler(RunNotFound, _not_found)
    api.add_exception_handler(ScheduleNotFound, _schedule_not_found)
    api.add_exception_handler(InvalidTransition, _transition)
    api.add_exception_handler(RotationInProgress, _transition)
    api.add_exception_handler(SchemaError, _schema)
    api.add_exception_handler(ConfigError, _config)
    api.add_exception_handler(ConcurrencyRejected, _busy)
    api.add_exception_handler(InvalidEnqueue, _invalid)


ROUTE = "notifyq.route"
"""The scope key of the list :class:`Unexpected` passes down for :func:`remember_route`."""


async def remember_route(request: Request) -> None:
    """A dependency of the ``/v1`` routes: hand the matched route's template to
    :class:`Unexpected`, which sees only its own copy of the scope (the inner middlewares and
    the router work on copies)."""
    holder = request.scope.get(ROUTE)
    route = request.scope.get("route")
    if isinstance(holder, list) and route is not None:
        holder.append(str(getattr(route, "path", "?")))


class Unexpected:
    """The outermost ASGI layer: an exception no handler above mapped becomes a problem+json
    too. A lost database is a 503 (logged as a warning); anything else a 500 that shows no
    internals, only an id to find the one ERROR record (with the traceback) in the log.
    Without it Starlette answers text/plain and hypercorn logs the traceback a second time."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        route: list[str] = []

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app({**scope, ROUTE: route}, receive, watch)
        except Exception as exc:
            if started:  # too late for another response: let the server drop the connection
                raise
            await _unexpected(f"{scope['method']} {_where(scope, route)}", exc)(
                scope, receive, send)


def _where(scope: Scope, route: list[str]) -> str:
    """The route's template, never a /v1 path: a path may carry a signal token."""
    if route:
        return route[-1]
    path = str(scope.get("path", "?"))
    return "/v1/…" if path.startswith("/v1/") else path


def _unexpected(where: str, exc: Exception) -> ProblemResponse:
    if isinstance(exc, _DATABASE_DOWN):
        log.warning("%s: database unavailable (%s)", where, type(exc).__name__)
        return problem(503, "the database is unavailable; try again later",
                       headers={"Retry-After": "5"})
    error_id = uuid.uuid4().hex[:12]
    log.error("%s: unexpected %s (error id %s)", where, type(exc).__name__, error_id,
              exc_info=exc)
    return problem(500, f"unexpected server error (error id {error_id}); the server log has "
                   "the details")
