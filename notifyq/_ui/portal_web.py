"""What the customer portal's pages share: the signed-in customer (:class:`Customer`, from the
session in the database), the CSRF and Origin checks of its forms, and rendering with the
dashboard's templates and security headers under the portal's layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from notifyq._app import App
from notifyq._http.auth import Authenticator
from notifyq._ui.session import Viewer, same_csrf
from notifyq._ui.web import (
    MAX_FORM_BYTES,
    SIGN_IN_FORM_BYTES,
    Problem,
    SignInNeeded,
    Ui,
    read_form,
    same_origin,
)
from notifyq._webhooks.portal import Portal, PortalSession
from notifyq._webhooks.service import Webhooks

COOKIE = "nq_portal"
PRE_COOKIE = "nq_portal_signin"
"""A random value set with a sign-in form and sent back with it (a login CSRF guard)."""
LAYOUT = "portal_base.html"


@dataclass(frozen=True, slots=True)
class Customer(Viewer):
    """A signed-in customer: the dashboard's viewer (name, scopes, CSRF token) of one tenant."""

    tenant_id: str = ""


def portal_form_limit(method: str, path: str, cookie: str | None) -> int:
    """The largest request body the portal takes at ``path`` (below ``/portal``): a sign-in
    form from anyone, other forms only with a session cookie (checked for real behind, where
    the database is read; a forged cookie buys a small form at most). Pages are GETs."""
    if method != "POST":
        return 0
    if path in ("/signin", "/link"):
        return SIGN_IN_FORM_BYTES
    return MAX_FORM_BYTES if cookie else 0


@dataclass
class PortalUi:
    """The portal's shared parts: rendering (the dashboard's :class:`Ui`), sessions, tokens."""

    ui: Ui
    app: App
    auth: Authenticator

    def hooks(self) -> Webhooks:
        if self.app._webhooks is None:
            raise Problem(409, "Webhooks are not enabled here", "this server has no keyring: "
                          "the customer portal needs webhooks enabled")
        return self.app._webhooks

    @property
    def portal(self) -> Portal:
        return self.hooks().portal

    async def viewer(self, request: Request) -> Customer:
        """The signed-in customer, else :class:`SignInNeeded`. A session made with an API
        token ends when that token is removed or no longer has the tenant."""
        session = await self.portal.open(request.cookies.get(COOKIE))
        if session is None or not self._token_still_allows(session):
            raise SignInNeeded
        return _customer(session)

    def _token_still_allows(self, session: PortalSession) -> bool:
        if session.token_name is None:
            return True
        token = self.auth.named(session.token_name)
        return (token is not None and token.tenants is not None
                and session.tenant_id in token.tenants
                and ("admin" in token.scopes or session.read_only))

    async def form(self, request: Request) -> tuple[Customer, dict[str, str]]:
        """The POSTed form of a customer who may change things, after the Origin and CSRF
        checks (403 otherwise)."""
        viewer = await self.viewer(request)
        if not viewer.admin:
            raise Problem(403, "Read-only session", "this sign-in lets you look, not change: "
                          "ask for a link that lets you manage your endpoints")
        if not same_origin(request):
            raise Problem(403, "Cross-site request refused",
                          "this request came from another site; use the portal itself")
        form = await read_form(request)
        if not same_csrf(viewer.csrf, request.headers.get("x-csrf-token") or form.get("csrf")):
            raise Problem(403, "The form has expired",
                          "the form's security token does not match this session: reload the "
                          "page and try again")
        return viewer, form

    def page(self, request: Request, viewer: Customer | None, template: str,
             status: int = 200, **context: Any) -> HTMLResponse:
        return self.ui.page(request, viewer, template, status=status, layout=LAYOUT,
                            **context)

    def confirm(self, request: Request, viewer: Customer, *, question: str,
                consequence: str, button: str, action: str, back: str,
                form: dict[str, str] | None = None) -> HTMLResponse:
        fields = {k: v for k, v in (form or {}).items() if k not in ("csrf", "confirm")}
        return self.page(request, viewer, "confirm.html", question=question,
                         consequence=consequence, button=button, fields=fields, action=action,
                         back=back)


def _customer(session: PortalSession) -> Customer:
    scopes = frozenset({"read"} if session.read_only else {"read", "admin"})
    return Customer(session.tenant_id, scopes, session.csrf,
                    int(session.expires_at.timestamp()), session.tenant_id)
