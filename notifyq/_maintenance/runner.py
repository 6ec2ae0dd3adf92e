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


async def every(interval_s: float | Callable[[], float],
                once: Callable[[], Awaitable[dict[str, Any]]], *,
                name: str, active: Callable[[], bool] = lambda: True,
                grace: StopGrace | None = None,
                woken: Callable[[], Awaitable[None]] | None = None) -> None:
    """Call ``once`` every ``interval_s``, jittered by ±10 %, while ``active()``; a callable
    instead is asked for each wait, and its answer is taken as it is (the elector's: see
    elector.py). A wait ends early when ``woken()`` returns: the leader-only runners are woken
    when this node becomes the leader, so that a new leader reaps at once."""
    grace = grace or StopGrace()
    if callable(interval_s):
        interval = interval_s
    else:
        def interval() -> float:
            return interval_s * random.uniform(0.9, 1.1)  # noqa: S311
    await _wait(interval() * random.uniform(0.0, 0.2), woken)  # noqa: S311 - stagger
    while True:
        if active():
            with grace.finishing():  # a stop waits for this round, not in the middle
                try:
                    counts = await once()
                    if any(counts.values()):
                        log.info("%s: %s", name, counts)
                except psycopg.Error as exc:
                    log.warning("%s failed (%s: %s); next try in about %.1f s", name,
                                type(exc).__name__, exc, interval())
        await _wait(interval(), woken)


async def _wait(seconds: float, woken: Callable[[], Awaitable[None]] | None) -> None:
    with anyio.move_on_after(seconds):
        if woken is None:
            await anyio.sleep_forever()
        else:
            await woken()
