"""The key keeper (every node that runs for long: a worker, ``serve``): runs the key check every
``key_check_interval_s`` and at once when the listener hears ``k:<version>`` (a promotion or a
retirement) or reconnects (it may have missed one).

Other processes check before an encrypt or decrypt once the interval has passed; the keeper is
what keeps a worker's ``key_holder`` row live while it has nothing to encrypt, so ``notifyq keys
promote`` counts it, and what makes a worker follow a promotion within milliseconds instead of
within the interval.
"""

from __future__ import annotations

import logging

import anyio
import psycopg

from notifyq._errors import ConfigError
from notifyq._runtime import Runtime

log = logging.getLogger("notifyq.keys")

KEY_PAYLOAD = "k:"


class KeyKeeper:
    """Example::

        keeper = KeyKeeper(runtime)
        notifier.subscribe(keeper.notified)
        notifier.on_connect(keeper.wake)
        tg.start_soon(keeper.run)
    """

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._wake = anyio.Event()
        self._failing: str | None = None
        self.checks = 0
        """Checks run (a test signal)."""

    def notified(self, payload: str) -> None:
        if payload.startswith(KEY_PAYLOAD):
            self._rt.expire_key_check()
            self.wake()

    def wake(self) -> None:
        self._wake.set()

    async def run_once(self) -> None:
        try:
            await self._rt.checked_keyring(force=True)
        except ConfigError as exc:
            # A key replaced under a known version: encrypt and decrypt refuse with the same
            # message until it is fixed (a worker's first check refused to start with it).
            log.error("key check failed: %s", exc)  # noqa: TRY400 - the message is the news
        except psycopg.Error as exc:
            # The database is away, or not migrated yet (serve answers 503 meanwhile): said
            # once, then checked again every interval.
            reason = type(exc).__name__
            if reason != self._failing:
                log.warning("key check could not run (%s); retrying every %g s", reason,
                            self._rt.settings.key_check_interval_s)
            self._failing = reason
        else:
            self._failing = None
        self.checks += 1

    async def run(self) -> None:
        """Until cancelled: a check per interval, or sooner when woken."""
        interval = self._rt.settings.key_check_interval_s
        while True:
            with anyio.move_on_after(interval):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.run_once()
