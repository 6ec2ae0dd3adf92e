"""The ASGI application of ``notifyq serve`` (FastAPI, served by hypercorn).

Example::

    api = create_api(app, ServiceState())
    await hypercorn.asyncio.serve(api, config, shutdown_trigger=stop.wait)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from notifyq._api import schemas
from notifyq._api.routes import build_router
from notifyq._app import App
from notifyq._db import migrate as migrations
from notifyq._dispatch.worker import Worker
from notifyq._http import problems
from notifyq._http.auth import PUBLIC_PATHS, Authenticator, RequireToken
from notifyq._http.metrics import CONTENT_TYPE, Metrics
from notifyq._ui.app import create_ui
from notifyq._ui.portal import create_portal
from notifyq._ui.portal_web import COOKIE as PORTAL_COOKIE
from notifyq._ui.portal_web import portal_form_limit
from notifyq._ui.session import COOKIE as SESSION_COOKIE
from notifyq._ui.session import Sessions
from notifyq._ui.web import form_limit

log = logging.getLogger("notifyq.api")

READY_TIMEOUT_S = 2.0
DOCS_ASSETS = "/v1/docs/assets"


@dataclass
class ServiceState:
    """What the probes and metrics read about the rest of the process."""

    worker: Worker | None = None
    """The in-process worker, once started (None with ``--no-worker``)."""
    metrics: Metrics = field(default_factory=Metrics)


class BodyLimit:
    """Refuse a request body over what its route takes, or slower than ``body_timeout_s``,
    before anything parses it; both answers close the connection.

    ``/v1`` (what :class:`RequireToken` let through) takes up to ``max_bytes``, the dashboard
    what ``ui_limit`` says (the sign-in form from anyone, other forms from a session), the
    customer portal what :func:`~notifyq._ui.portal_web.portal_form_limit` says, anything
    else nothing: the probes, ``/metrics``, the docs and unknown paths. A declared
    Content-Length over the limit is refused at once (413); otherwise the body is read within
    ``body_timeout_s`` (else 408), buffered up to the limit, then handed on. Every path took
    ``max_bytes`` with no deadline before issue 31: 60 stalled ``POST /healthz`` of 1 MiB held
    67 MB of the server's RSS (83 -> 149 MB) and their connections, indefinitely."""

    def __init__(self, app: ASGIApp, max_bytes: int, *, body_timeout_s: float,
                 ui_limit: Callable[[Scope], int]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s
        self.ui_limit = ui_limit

    def limit(self, scope: Scope) -> int:
        path: str = scope["path"]
        if path.startswith("/v1/") and not path.startswith(PUBLIC_PATHS):
            return self.max_bytes
        if path.startswith("/ui/"):
            return self.ui_limit(scope)
        if path.startswith("/portal/"):
            cookie = Request(scope).cookies.get(PORTAL_COOKIE)
            return portal_form_limit(scope["method"], path.removeprefix("/portal"), cookie)
        return 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await self._refuse(scope, receive, send, 400, "invalid Content-Length")
                return
            if size > limit:
                await self._refuse(scope, receive, send, 413, self._too_large(size, limit))
                return
        body: bytes | int | None = None
        with anyio.move_on_after(self.body_timeout_s):
            body = await self._read(receive, limit)
        if body is None:
            await self._refuse(scope, receive, send, 408, (
                f"the request body did not arrive within {self.body_timeout_s:g} s"))
            return
        if isinstance(body, int):
            await self._refuse(scope, receive, send, 413, self._too_large(body, limit))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _read(receive: Receive, limit: int) -> bytes | int:
        """The whole body, or its size so far once that is over ``limit``."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            total += len(chunks[-1])
            if total > limit:
                return total
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    def _too_large(size: int, limit: int) -> str:
        if limit == 0:
            return "this route takes no request body"
        return f"the request body is {size} bytes or more; the limit is {limit} bytes"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int,
                      detail: str) -> None:
        response = problems.problem(status, detail, field="body",
                                    headers={"Connection": "close"})
        await response(scope, receive, send)


class RequestCap:
    """At most ``max_requests`` requests handled at once: one more is answered 503 with
    ``Retry-After: 1`` before anything reads it, and its connection closed. hypercorn (0.18)
    limits neither connections nor requests; its keep-alive timer closes a connection that has
    no request in flight (its headers included) after 5 s, so connections that cost more than
    that are the ones counted here."""

    def __init__(self, app: ASGIApp, max_requests: int) -> None:
        self.app = app
        self.max_requests = max_requests
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_requests:
            response = problems.problem(503, f"this server handles {self.max_requests} "
                                        "requests at once (api.max_concurrent_requests): try "
                                        "again shortly", headers={"Retry-After": "1",
                                                                  "Connection": "close"})
            await response(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class JsonBodies:
    """Read every ``/v1`` request body as JSON whatever its Content-Type says: ``curl -d``
    sends ``application/x-www-form-urlencoded``, and FastAPI (even with
    ``strict_content_type=False``, which covers only a missing header) would hand such a
    body to validation as bytes, a 422. No ``/v1`` route takes anything but JSON, so the
    header is set to ``application/json``; a body that is not JSON is then the usual 400
    problem. FastAPI's strict default guards APIs without authentication against cross-site
    "simple" requests; every ``/v1`` route needs a bearer token, which such a request cannot
    carry."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def create_api(app: App, state: ServiceState) -> FastAPI:
    """The admin API for ``app``: ``/v1`` (OpenAPI at ``/v1/openapi.json``), ``/healthz``,
    ``/readyz``, ``/metrics``, the dashboard at ``/ui/`` and the customer portal at
    ``/portal/``."""
    auth = Authenticator(app.settings.api)
    api = FastAPI(title="notifyq admin API", version="1", openapi_url="/v1/openapi.json",
                  docs_url=None, redoc_url=None)
    problems.install(api)
    api.include_router(build_router(app, auth, state.metrics.enqueued),
                       dependencies=[Depends(problems.remember_route)])
    _add_probes(api, app, state)
    _add_docs(api)
    _add_dashboard(api, app, auth)
    _add_portal(api, app, auth)
    settings = app.settings.api
    api.add_middleware(JsonBodies)
    api.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s, ui_limit=_dashboard_limit(auth))
    api.add_middleware(RequireToken, auth=auth)  # a stranger's /v1 body is never read
    api.add_middleware(RequestCap, max_requests=settings.max_concurrent_requests)
    api.add_middleware(problems.Unexpected)  # added last: the outermost, sees every error
    return api


def _dashboard_limit(auth: Authenticator) -> Callable[[Scope], int]:
    """:func:`~notifyq._ui.web.form_limit` of a request under ``/ui``, for :class:`BodyLimit`."""
    sessions = Sessions(auth)

    def limit(scope: Scope) -> int:
        cookie = Request(scope).cookies.get(SESSION_COOKIE)
        return form_limit(sessions, scope["method"], scope["path"].removeprefix("/ui"), cookie)
    return limit


def _add_docs(api: FastAPI) -> None:
    """Swagger UI at ``/v1/docs``, its JS and CSS served from ``/v1/docs/assets`` out of the
    ``fastapi-offline`` package (FastAPI's own page loads them from a CDN: blank offline or
    behind a firewall). Like the OpenAPI document, no token needed: it holds no data."""
    import fastapi_offline

    assets = Path(fastapi_offline.__file__).parent / "static"
    api.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")

    @api.get("/v1/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}/v1/openapi.json", title=f"{api.title} (Swagger UI)",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            oauth2_redirect_url=None,
            # Swagger UI would send the document to validator.swagger.io for a badge.
            swagger_ui_parameters={"validatorUrl": None})


def _add_dashboard(api: FastAPI, app: App, auth: Authenticator) -> None:
    """The dashboard at ``/ui/`` (sign in with an API token; see notifyq/_ui/app.py)."""
    api.mount("/ui", create_ui(app, auth), name="ui")

    @api.get("/ui", include_in_schema=False)
    async def dashboard(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/", status_code=308)


def _add_portal(api: FastAPI, app: App, auth: Authenticator) -> None:
    """The customer portal at ``/portal/`` (one tenant's webhooks; see notifyq/_ui/portal.py)."""
    api.mount("/portal", create_portal(app, auth), name="portal")

    @api.get("/portal", include_in_schema=False)
    async def portal(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/portal/", status_code=308)


def _add_probes(api: FastAPI, app: App, state: ServiceState) -> None:
    @api.get("/healthz", response_model=schemas.Health, tags=["probes"],
             summary="The process is alive")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "checks": {}}

    @api.get("/readyz", response_model=schemas.Health, tags=["probes"],
             responses={503: {"model": schemas.Health}},
             summary="Database reachable, schema current, listener connected (or poll-only)")
    async def readyz() -> JSONResponse:
        checks = await readiness(app, state)
        ok = all(v == "ok" or v.startswith("ok ") for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks},
                            status_code=200 if ok else 503)

    @api.get("/metrics", tags=["probes"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE: {}}}},
             summary="Prometheus metrics")
    async def metrics() -> Response:
        stats = None
        try:
            with anyio.fail_after(READY_TIMEOUT_S):
                stats = await app.stats()
        except (psycopg.Error, TimeoutError) as exc:
            log.warning("metrics: database unreachable (%s)", type(exc).__name__)
        return Response(state.metrics.render(stats, state.worker), media_type=CONTENT_TYPE)


async def readiness(app: App, state: ServiceState) -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        with anyio.fail_after(READY_TIMEOUT_S):
            db = await app.pool()
            async with db.connection() as conn:
                checks["database"] = "ok"
                current = await migrations.state(conn, app.settings.schema_name)
        checks["schema"] = _schema_check(current)
    except (psycopg.Error, TimeoutError, OSError) as exc:
        checks.setdefault("database", f"unreachable ({type(exc).__name__})")
    worker = state.worker
    if worker is None:
        checks["listener"] = "ok (no worker in this process)"
    elif worker.notifier is None:
        checks["listener"] = "ok (poll-only)"
    else:
        checks["listener"] = "ok" if worker.notifier.connected else "disconnected"
    return checks


def _schema_check(state: migrations.MigrationState) -> str:
    if state.unknown:
        return "ahead: migrated by a newer notifyq; upgrade this one"
    if not state.applied:
        return "not migrated: run `notifyq migrate`"
    if state.pending:
        missing = ", ".join(f"{m.version:04d}_{m.name}" for m in state.pending)
        return f"behind (missing {missing}): run `notifyq migrate`"
    return "ok"
