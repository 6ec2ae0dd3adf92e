"""What an operator does in the dashboard beyond the first look, in a real headless Chromium
against a real ``notifyq serve``: rotate a webhook secret and reload, pause an idle pool, chase
failing deliveries to a real receiver, read the runs on a phone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import Served
from tests.support import scalar
from tests.ui.test_browser import APP, LOOPBACK, _page, _shot, _sign_in
from tests.vault import keys_env

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log", args=["--app", APP],
                env={**keys_env(1, active=1), **LOOPBACK}) as server:
        yield server


def _secrets(sql: Conn, endpoint_id: str) -> int:
    return int(scalar(sql, "SELECT count(*) FROM notifyq.webhook_secret WHERE endpoint_id = %s",
                      (endpoint_id,)))


def test_a_rotated_secret_is_shown_once_and_a_reload_does_not_rotate_again(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook"}).json()
    page = _page(browser, served)
    _sign_in(page)
    page.goto(f"/ui/webhooks/endpoints/{endpoint['id']}")
    page.get_by_role("button", name="Rotate secret").click()
    page.wait_for_url(f"**/ui/webhooks/endpoints/{endpoint['id']}?done=rotate")
    shown = page.locator("#new-secret").inner_text()
    assert shown.startswith("whsec_")
    assert shown != endpoint["secret"]
    assert _secrets(sql, endpoint["id"]) == 2
    _shot(page, screenshots, "webhook-secret-rotated")
    page.reload()
    assert page.locator("p.notice", has_text="Secret rotated").is_visible()
    assert page.locator("#new-secret").count() == 0
    assert shown not in page.content()
    assert page.locator("#secret-gone").is_visible()
    assert _secrets(sql, endpoint["id"]) == 2  # the reload rotated nothing
