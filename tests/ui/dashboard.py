"""Signing in to the dashboard of a served process, as a browser would (its cookies, the
sign-in form's hidden fields), with httpx."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.integration.serving import Served

_HIDDEN = re.compile(r'name="(pre|csrf)" value="([^"]+)"')


def hidden(html: str, name: str) -> str:
    found: dict[str, str] = dict(_HIDDEN.findall(html))
    assert name in found, html[:2000]
    return found[name]


class Dashboard:
    """An httpx client of ``served`` with its own cookie jar; :meth:`sign_in` first."""

    def __init__(self, served: Served) -> None:
        self.http = httpx.Client(base_url=served.url, timeout=10, follow_redirects=False)
        self.csrf = ""

    def sign_in(self, token: str) -> httpx.Response:
        form = self.http.get("/ui/signin")
        answer = self.http.post("/ui/signin", data={
            "pre": hidden(form.text, "pre"), "token": token, "next": "/ui/runs"})
        if answer.status_code == 303:
            self.csrf = hidden(self.http.get("/ui/runs").text, "csrf")
        return answer

    def post(self, path: str, data: dict[str, Any] | None = None, *,
             csrf: bool = True, **kwargs: Any) -> httpx.Response:
        body = {**(data or {}), **({"csrf": self.csrf} if csrf else {})}
        return self.http.post(path, data=body, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
