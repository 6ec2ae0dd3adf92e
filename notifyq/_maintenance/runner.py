"""The loop every maintenance runner shares: staggered start, jittered interval, errors logged
and retried at the next tick (a runner never takes the worker down), and a round a stop lets
finish."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg

from notifyq._db.pool import StopGrace

log = logging.getLogger("notifyq.maintenance")


async def every(interval_s: float, once: Callable[[], Awaitable[dict[str, Any]]], *,
                name: str, active: Callable[[], bool] = lambda: True,
                grace: StopGrace | None = None) -> None:
    grace = grace or StopGrace()
    await anyio.sleep(interval_s * random.uniform(0.0, 0.2))  # noqa: S311 - stagger
    while True:
        if active():
            with grace.finishing():  # a stop waits for this round, not in the middle
                try:
                    counts = await once()
                    if any(counts.values()):
                        log.info("%s: %s", name, counts)
                except psycopg.Error as exc:
                    log.warning("%s failed (%s: %s); next try in %.1f s", name,
                                type(exc).__name__, exc, interval_s)
        await anyio.sleep(interval_s * random.uniform(0.9, 1.1))  # noqa: S311
