"""The dashboard of ``notifyq serve``, mounted at ``/ui`` on the API's port.

Server-rendered HTML (Jinja2) with two small vendored scripts (htmx for in-place updates,
uPlot for the charts) served from the package: no CDN, no build step, works offline. Every
page reads through the same functions as the ``/v1`` API (RunControl, Webhooks, KeyAdmin).

Example::

    api.mount("/ui", create_ui(app, Authenticator(app.settings.api)))
"""

from __future__ import annotations

import secrets
import time
import urllib.parse

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from notifyq._app import App
from notifyq._http.auth import Authenticator
from notifyq._ui.job_types import add_job_type_pages
from notifyq._ui.keys import add_key_pages
from notifyq._ui.overview import add_overview_pages
from notifyq._ui.render import STATIC, environment
from notifyq._ui.run_actions import add_run_actions
from notifyq._ui.runs import add_run_pages
from notifyq._ui.schedules import add_schedule_pages
from notifyq._ui.session import COOKIE, SESSION_S, Sessions
from notifyq._ui.web import (
    SECURITY_HEADERS,
    Problem,
    SignInNeeded,
    Ui,
    base_of,
    read_form,
    redirect,
    same_origin,
)
from notifyq._ui.webhooks import add_webhook_pages
from notifyq._version import VERSION

PRE_COOKIE = "nq_signin"
"""A random value set with the sign-in form and sent back with it (a login CSRF guard)."""


def create_ui(app: App, auth: Authenticator) -> FastAPI:
    ui = Ui(environment(), Sessions(auth), VERSION)
    web = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    web.state.ui = ui
    web.mount("/static", StaticFiles(directory=STATIC), name="static")
    _add_handlers(web, ui)
    router = APIRouter()
    _add_sign_in(router, ui, auth)
    add_overview_pages(router, app, ui)
    add_run_actions(router, app, ui)  # before add_run_pages: its /runs/{id}/{action} takes all
    add_run_pages(router, app, ui)
    add_job_type_pages(router, app, ui)
    add_webhook_pages(router, app, ui)
    add_key_pages(router, app, ui)
    add_schedule_pages(router, app, ui)
    web.include_router(router)
    return web


def _add_handlers(web: FastAPI, ui: Ui) -> None:
    async def sign_in(request: Request, exc: Exception) -> Response:
        if request.headers.get("hx-request"):  # htmx: send the whole page to the sign-in form
            return Response(status_code=401, headers={
                "HX-Redirect": f"{base_of(request)}/signin"})
        if request.method != "GET":
            return ui.problem(request, Problem(401, "Signed out", "your session has ended: "
                                               "sign in again, then repeat the action"))
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return redirect(request, "/signin", next=target)

    async def problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Problem)  # noqa: S101 - registered for this type
        return ui.problem(request, exc)

    async def not_found(request: Request, exc: Exception) -> Response:
        return ui.problem(request, Problem(404, "Not found", "there is no such page"))

    web.add_exception_handler(SignInNeeded, sign_in)
    web.add_exception_handler(Problem, problem)
    web.add_exception_handler(404, not_found)


def _safe_next(base: str, target: str | None) -> str:
    """Only a path of the dashboard itself: never another site (``//evil``, ``https://``)."""
    if not target or not target.startswith(base + "/") or target.startswith("//"):
        return base + "/"
    parts = urllib.parse.urlsplit(target)
    return base + "/" if parts.scheme or parts.netloc else target


def _add_sign_in(router: APIRouter, ui: Ui, auth: Authenticator) -> None:
    @router.get("/signin", response_class=HTMLResponse)
    async def sign_in_form(request: Request) -> Response:
        return _form(request, ui, auth, status=200)

    @router.post("/signin", response_class=HTMLResponse)
    async def sign_in(request: Request) -> Response:
        form = await read_form(request)
        pre = request.cookies.get(PRE_COOKIE)
        if not same_origin(request) or not pre or form.get("pre") != pre:
            return _form(request, ui, auth, status=403,
                         error="the sign-in form had expired: try again")
        token = auth.identify(form.get("token", "").strip())
        if token is None:
            return _form(request, ui, auth, status=401, error="that token is not valid here")
        if token.tenants is not None:
            # The dashboard's pages are about every tenant (overview, pools, schedules, keys).
            return _form(request, ui, auth, status=403, error=(
                f"token {token.name!r} is limited to tenants; the dashboard shows every "
                "tenant: sign in with a token configured without `tenants` (a tenant's "
                "webhooks are in the customer portal, /portal/)"))
        base = base_of(request)
        response = redirect(request, "")
        response.headers["location"] = _safe_next(base, form.get("next"))
        response.set_cookie(COOKIE, ui.sessions.issue(token.name, time.time()),
                            max_age=SESSION_S, path=base + "/", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
        response.delete_cookie(PRE_COOKIE, path=base + "/")
        return response

    @router.post("/signout")
    async def sign_out(request: Request) -> Response:
        await ui.form(request, admin=False)
        response = redirect(request, "/signin")
        response.delete_cookie(COOKIE, path=base_of(request) + "/")
        return response


def _form(request: Request, ui: Ui, auth: Authenticator, *, status: int,
          error: str | None = None) -> Response:
    pre = secrets.token_urlsafe(18)
    response = ui.page(request, None, "signin.html", status=status, pre=pre, error=error,
                       configured=auth.configured,
                       next=_safe_next(base_of(request), request.query_params.get("next")))
    response.set_cookie(PRE_COOKIE, pre, max_age=3600, path=base_of(request) + "/",
                        httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response
