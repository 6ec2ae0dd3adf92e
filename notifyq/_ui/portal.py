"""The customer portal of ``notifyq serve``, mounted at ``/portal`` beside the dashboard.

A customer of the application manages their own webhook endpoints here, and sees nothing of
any other tenant. They sign in with a one-time link the application mints for them
(``POST /v1/portal/links``, ``app.webhooks.portal.mint``) or with an API token limited to
their tenants (``api.tokens[].tenants``). The link's code is in its fragment
(``/portal/link#<code>``): the page's script posts it (with the page's one-time value against
login CSRF), it is spent, and a session cookie (``nq_portal``: HttpOnly, SameSite=Strict,
Secure over https, scoped to ``/portal/``) takes its place. Sessions live in the database
(their SHA-256), so any replica accepts them and signing out ends them.

The pages reuse the dashboard's templates, styles, scripts, CSRF and Origin checks and security
headers (:mod:`notifyq._ui.web`); every page and action is checked against the session's one
tenant in SQL (another tenant's endpoint or message is a 404, as if it did not exist).

Example::

    api.mount("/portal", create_portal(app, Authenticator(app.settings.api)))
"""

from __future__ import annotations

import secrets

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from notifyq._app import App
from notifyq._http.auth import Authenticator
from notifyq._ui.portal_pages import add_portal_pages
from notifyq._ui.portal_web import COOKIE, PRE_COOKIE, PortalUi
from notifyq._ui.render import STATIC, environment
from notifyq._ui.session import Sessions, same_csrf
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
from notifyq._version import VERSION


def create_portal(app: App, auth: Authenticator) -> FastAPI:
    ui = PortalUi(Ui(environment(), Sessions(auth), VERSION), app, auth)
    web = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    web.mount("/static", StaticFiles(directory=STATIC), name="static")
    _add_handlers(web, ui)
    router = APIRouter()
    _add_sign_in(router, ui)
    add_portal_pages(router, ui)
    web.include_router(router)
    return web


def _add_handlers(web: FastAPI, ui: PortalUi) -> None:
    async def sign_in(request: Request, exc: Exception) -> Response:
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={
                "HX-Redirect": f"{base_of(request)}/signin"})
        if request.method != "GET":
            return _problem(request, ui, Problem(401, "Signed out", "your session has ended: "
                                                 "open a new link, then repeat the action"))
        return redirect(request, "/signin")

    async def problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Problem)  # noqa: S101 - registered for this type
        return _problem(request, ui, exc)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _problem(request, ui, Problem(404, "Not found", "there is no such page"))

    web.add_exception_handler(SignInNeeded, sign_in)
    web.add_exception_handler(Problem, problem)
    web.add_exception_handler(404, not_found)


def _problem(request: Request, ui: PortalUi, problem: Problem) -> HTMLResponse:
    return ui.page(request, None, "problem.html", status=problem.status, problem=problem,
                   home="Your endpoints")


def _set_session(request: Request, response: Response, cookie: str, session_s: float) -> None:
    base = base_of(request)
    response.set_cookie(COOKIE, cookie, max_age=int(session_s), path=base + "/",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    response.delete_cookie(PRE_COOKIE, path=base + "/")


def _pre_checked(request: Request, form: dict[str, str]) -> bool:
    pre = request.cookies.get(PRE_COOKIE)
    return (same_origin(request) and bool(pre)
            and secrets.compare_digest(form.get("pre", "").encode(), (pre or "").encode()))


def _add_sign_in(router: APIRouter, ui: PortalUi) -> None:
    @router.get("/link", response_class=HTMLResponse)
    async def link_page(request: Request) -> Response:
        return _form(request, ui, "portal_link.html", status=200)

    @router.post("/link", response_class=HTMLResponse)
    async def link(request: Request) -> Response:
        form = await read_form(request)
        if not _pre_checked(request, form):
            return _form(request, ui, "portal_link.html", status=403,
                         error="the sign-in page had expired: open the link again")
        started = await ui.portal.redeem(form.get("code", "").strip())
        if started is None:
            return _form(request, ui, "portal_link.html", status=403, error=(
                "this link is not valid: it has expired, was used already, or was not "
                "copied whole. Ask for a new link"))
        response = redirect(request, "/")
        _set_session(request, response, started[0], ui.portal.session_s)
        return response

    @router.get("/signin", response_class=HTMLResponse)
    async def sign_in_form(request: Request) -> Response:
        return _form(request, ui, "portal_signin.html", status=200)

    @router.post("/signin", response_class=HTMLResponse)
    async def sign_in(request: Request) -> Response:
        form = await read_form(request)
        if not _pre_checked(request, form):
            return _form(request, ui, "portal_signin.html", status=403,
                         error="the sign-in form had expired: try again")
        token = ui.auth.identify(form.get("token", "").strip())
        if token is None:
            return _form(request, ui, "portal_signin.html", status=401,
                         error="that token is not valid here")
        if token.tenants is None:
            return _form(request, ui, "portal_signin.html", status=403, error=(
                f"token {token.name!r} is not limited to tenants: the portal shows one "
                "tenant; use the dashboard (/ui/), or mint a portal link for the tenant"))
        tenant = form.get("tenant", "").strip() or (
            next(iter(token.tenants)) if len(token.tenants) == 1 else "")
        if tenant not in token.tenants:
            return _form(request, ui, "portal_signin.html", status=403, error=(
                "this token is limited to several tenants: name one of them" if not tenant
                else f"this token may not act for tenant {tenant!r}"))
        cookie, _ = await ui.portal.start(tenant, read_only="admin" not in token.scopes,
                                          token_name=token.name)
        response = redirect(request, "/")
        _set_session(request, response, cookie, ui.portal.session_s)
        return response

    @router.post("/signout")
    async def sign_out(request: Request) -> Response:
        viewer = await ui.viewer(request)
        form = await read_form(request)
        if not same_origin(request) or not same_csrf(viewer.csrf, form.get("csrf")):
            raise Problem(403, "The form has expired", "reload the page and try again")
        await ui.portal.end(request.cookies.get(COOKIE, ""))
        response = redirect(request, "/signin")
        response.delete_cookie(COOKIE, path=base_of(request) + "/")
        return response


def _form(request: Request, ui: PortalUi, template: str, *, status: int,
          error: str | None = None) -> Response:
    pre = secrets.token_urlsafe(18)
    response = ui.page(request, None, template, status=status, pre=pre, error=error,
                       session_h=ui.app.settings.webhooks.portal_session_s / 3600)
    response.set_cookie(PRE_COOKIE, pre, max_age=3600, path=base_of(request) + "/",
                        httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response

