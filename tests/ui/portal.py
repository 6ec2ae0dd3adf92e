"""A customer of the portal of a served process, as a browser would be (its cookies, the sign-in
page's hidden fields, the link's code posted from its fragment), with httpx."""

from __future__ import annotations

from typing import Any

import httpx

from tests.integration.serving import ADMIN, Served
from tests.ui.dashboard import hidden


def mint(served: Served, tenant: str | None, *, token: str = ADMIN,
         **fields: Any) -> httpx.Response:
    """``POST /v1/portal/links`` for ``tenant`` (None: not given)."""
    with served.client(token) as http:
        return http.post("/v1/portal/links", json={
            **({"tenant_id": tenant} if tenant is not None else {}), **fields})


def code_of(url: str) -> str:
    """The code of a link: its fragment."""
    return url.split("#", 1)[1]


class Customer:
    """An httpx client of ``served``'s portal with its own cookie jar."""

    def __init__(self, served: Served) -> None:
        self.http = httpx.Client(base_url=served.url, timeout=10, follow_redirects=False)
        self.csrf = ""

    def open_link(self, url: str) -> httpx.Response:
        """What the link page's script does: post the fragment's code with the page's value."""
        return self.redeem(code_of(url))

    def redeem(self, code: str) -> httpx.Response:
        page = self.http.get("/portal/link")
        answer = self.http.post("/portal/link", data={"pre": hidden(page.text, "pre"),
                                                      "code": code})
        self._signed_in(answer)
        return answer

    def sign_in(self, token: str, tenant: str = "") -> httpx.Response:
        page = self.http.get("/portal/signin")
        answer = self.http.post("/portal/signin", data={
            "pre": hidden(page.text, "pre"), "token": token, "tenant": tenant})
        self._signed_in(answer)
        return answer

    def _signed_in(self, answer: httpx.Response) -> None:
        if answer.status_code == 303:
            self.csrf = hidden(self.http.get("/portal/").text, "csrf")

    def post(self, path: str, data: dict[str, Any] | None = None, *,
             csrf: bool = True, **kwargs: Any) -> httpx.Response:
        body = {**(data or {}), **({"csrf": self.csrf} if csrf else {})}
        return self.http.post(path, data=body, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def __enter__(self) -> Customer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
