"""Fixtures of the webhook tests: an App with a keyring and the loopback allowlist, a receiver
on 127.0.0.1, and Standard Webhooks verification of what it received."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from notifyq import App
from notifyq._settings import Settings
from notifyq._webhooks.deliver import Deliverer
from tests import vault
from tests.conftest import fast_settings
from tests.receiver import Received

LOOPBACK = ["127.0.0.0/8", "::1/128"]


def webhook_settings(dsn: str, **webhooks: Any) -> Settings:
    """Keys, the loopback allowlist and a short retry schedule (tests only); the circuit
    breaker is off unless a test is about it (most tests fail an endpoint on purpose)."""
    return fast_settings(
        dsn, keys=f"1:{vault.b64(vault.KEY1)}", active_key_version=1,
        webhooks={"allowed_networks": LOOPBACK, "retry_schedule_s": [0, 0.1, 0.1],
                  "timeout_s": 2.0, "connect_timeout_s": 1.0, "throttled_min_s": 60.0,
                  "breaker_failures": 0, **webhooks})


@pytest.fixture
async def wapp(dsn: str) -> AsyncIterator[App]:
    application = App(settings=webhook_settings(dsn))
    async with application:
        yield application


def verify(secret: str | None, request: Received) -> Any:
    """Standard Webhooks verification of a received request against its raw body, with an
    endpoint's ``secret`` (None: the endpoint was not just created or rotated)."""
    if secret is None:
        raise AssertionError("no secret: an endpoint shows it only when created or rotated")
    return Webhook(secret).verify(request.body, request.headers)


def deliverer(app: App) -> Deliverer:
    """The App's webhook deliverer, installed when webhooks are enabled (a keyring)."""
    if app._deliverer is None:
        raise AssertionError("webhooks are not enabled on this App: no deliverer")
    return app._deliverer
