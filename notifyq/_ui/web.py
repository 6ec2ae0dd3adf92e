"""What every dashboard page shares: who is looking (the session), the CSRF and Origin checks
of state-changing requests, problem pages, and rendering with security headers.

Pages are plain HTML forms and links that work without JavaScript; htmx (vendored) refreshes
parts of them in place. A state-changing request must be a POST from a session with the
``admin`` scope, carry that session's CSRF token (form field ``csrf`` or header
``X-CSRF-Token``) and, when the browser says where it comes from (``Origin``), come from this
server; the cookie is SameSite=Strict besides.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment

from notifyq._ui.session import COOKIE, Sessions, Viewer, same_csrf

MAX_FORM_BYTES = 64 * 1024
"""The largest form of a signed-in session (a bulk action's selection of runs)."""
SIGN_IN_FORM_BYTES = 4096
"""The sign-in form: a token, the form's nonce and where to go next."""

# Every script and style comes from this server (htmx's eval-based features are off, see
# base.html): an injected <script> or inline handler cannot run even if escaping failed.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "object-src 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Problem(Exception):
    """Answer with a problem page: ``status``, a title and what to do."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


class SignInNeeded(Exception):
    pass


@dataclass
class Ui:
    """The dashboard's shared parts, handed to every group of pages."""

    templates: Environment
    sessions: Sessions
    version: str

    def viewer(self, request: Request) -> Viewer:
        """A FastAPI dependency: the signed-in viewer, else off to the sign-in page."""
        viewer = self.sessions.open(request.cookies.get(COOKIE), time.time())
        if viewer is None:
            raise SignInNeeded
        return viewer

    async def form(self, request: Request, *, admin: bool = True) -> dict[str, str]:
        """The POSTed form, after the admin (unless ``admin`` is False), Origin and CSRF
        checks (403 otherwise)."""
        viewer = self.viewer(request)
        if admin and not viewer.admin:
            raise Problem(403, "Read-only session", f"the token {viewer.name!r} has the read "
                          "scope only: sign in with an admin token to change anything")
        if not same_origin(request):
            raise Problem(403, "Cross-site request refused",
                          "this request came from another site; use the dashboard itself")
        form = await read_form(request)
        if not same_csrf(viewer.csrf, request.headers.get("x-csrf-token") or form.get("csrf")):
            raise Problem(403, "The form has expired",
                          "the form's security token does not match this session (it was "
                          "opened before signing in again): reload the page and try again")
        return form

    def confirm(self, request: Request, *, question: str, consequence: str, button: str,
                action: str, back: str, form: Mapping[str, str] | None = None) -> HTMLResponse:
        """An action's confirmation page: its button posts ``form`` to ``action`` again, with
        ``confirm=yes`` (no JavaScript needed); "Go back" returns to ``back``."""
        fields = {k: v for k, v in (form or {}).items() if k not in ("csrf", "confirm")}
        return self.page(request, self.viewer(request), "confirm.html", question=question,
                         consequence=consequence, button=button, fields=fields, action=action,
                         back=back)

    def page(self, request: Request, viewer: Viewer | None, template: str,
             status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(
            base=base_of(request), viewer=viewer, version=self.version,
            path=request.url.path, query=request.query_params, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def problem(self, request: Request, problem: Problem) -> HTMLResponse:
        viewer = self.sessions.open(request.cookies.get(COOKIE), time.time())
        return self.page(request, viewer, "problem.html", status=problem.status,
                         problem=problem)


def form_limit(sessions: Sessions, method: str, path: str, cookie: str | None) -> int:
    """The largest request body the dashboard takes at ``path`` (below ``/ui``): the sign-in
    form from anyone, other forms from a signed-in session only, nothing else (pages are
    GETs). The API's ``BodyLimit`` enforces it before anything reads the body: a stranger's
    POST costs a small form at most."""
    if method != "POST":
        return 0
    if path == "/signin":
        return SIGN_IN_FORM_BYTES
    return MAX_FORM_BYTES if sessions.open(cookie, time.time()) is not None else 0


def _signed_in(request: Request) -> Viewer:
    ui: Ui = request.app.state.ui
    return ui.viewer(request)


Signed = Annotated[Viewer, Depends(_signed_in)]
"""A page's parameter: the signed-in viewer (else off to the sign-in page)."""


def base_of(request: Request) -> str:
    """Where the dashboard is mounted (``/ui``, under any root path of a proxy)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None  # "null": a sandboxed or privacy-sensitive context; refuse
    host = request.headers.get("host", "")
    return urllib.parse.urlsplit(origin).netloc == host


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body as a dict (the last value of a repeated
    field wins; :func:`read_form_lists` keeps them all)."""
    return {k: v[-1] for k, v in (await read_form_lists(request)).items()}


async def read_form_lists(request: Request) -> dict[str, list[str]]:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Problem(413, "Form too large", f"at most {MAX_FORM_BYTES} bytes")
    try:
        return urllib.parse.parse_qs(body.decode(), keep_blank_values=True,
                                     max_num_fields=2000)
    except (UnicodeDecodeError, ValueError):
        raise Problem(400, "Unreadable form", "the form could not be read") from None


def redirect(request: Request, to: str, **params: str) -> Response:
    """303 See Other to ``to`` under the dashboard (after a POST: reloading does not repeat
    it). htmx follows it in place."""
    url = base_of(request) + to
    if params:
        url += "?" + urllib.parse.urlencode(params)
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


def query(params: Mapping[str, str], *names: str) -> dict[str, str]:
    """The non-empty query parameters among ``names``."""
    return {n: params[n].strip() for n in names if params.get(n, "").strip()}


def utc_time(params: Mapping[str, str], name: str) -> datetime | None:
    """The form field ``name`` as a time (a ``datetime-local`` input's value is UTC), None when
    empty; ValueError naming the field when it is not one."""
    text = params.get(name)
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a date and time "
                         "(e.g. 2026-12-01T09:30)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def required_time(form: Mapping[str, str], name: str, missing: str) -> datetime:
    """:func:`utc_time`, required: a 422 problem page when the field is empty (``missing``
    says what to give) or not a time."""
    try:
        moment = utc_time(form, name)
    except ValueError as exc:
        raise Problem(422, "Not a time", str(exc)) from None
    if moment is None:
        raise Problem(422, "No time given", missing)
    return moment
