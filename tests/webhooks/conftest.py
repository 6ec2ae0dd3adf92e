"""Fixtures of the webhook tests: an App with a keyring and the loopback allowlist, a receiver
on 127.0.0.1, and Standard Webhooks verification of what it received."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from notifyq import App
from notifyq._settings import Settings
from tests import vault
from tests.conftest import fast_settings
from tests.receiver import Received, Receiver

LOOPBACK = ["127.0.0.0/8", "::1/128"]


def webhook_settings(dsn: str, **webhooks: Any) -> Settings:
    """Keys, the loopback allowlist and a short retry schedule (tests only)."""
    return fast_settings(
        dsn, keys=f"1:{vault.b64(vault.KEY1)}", active_key_version=1,
        webhooks={"allowed_networks": LOOPBACK, "retry_schedule_s": [0, 0.1, 0.1],
                  "timeout_s": 2.0, "connect_timeout_s": 1.0, "throttled_min_s": 60.0,
                  **webhooks})


@pytest.fixture
async def wapp(dsn: str) -> AsyncIterator[App]:
    application = App(settings=webhook_settings(dsn))
    async with application:
        yield application


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    try:
        yield server
    finally:
        server.stop()


def verify(secret: str, request: Received) -> Any:
    """Standard Webhooks verification of a received request against its raw body."""
    return Webhook(secret).verify(request.body, request.headers)
