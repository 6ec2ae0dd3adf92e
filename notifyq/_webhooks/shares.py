"""Each endpoint's adaptive share of the delivery slots.

A delivery run's concurrency key is its endpoint (``webhook:<id>``); the keyed claim lets at
most the key's limit run at once, across workers, and reads that limit from
``key_concurrency`` (migration 0021). :class:`Shares` keeps it moving, additive increase and
multiplicative decrease, from each batch of recorded attempts:

- an attempt that says the endpoint is overloaded (a timeout, a connect error, a 429, a 502,
  503 or 504, an answer slower than ``webhooks.endpoint_slow_s``) halves its share, once per
  such attempt, down to 1;
- otherwise a batch with a fast success grows it by one, up to
  ``webhooks.endpoint_concurrency_max``;
- an endpoint starts at ``webhooks.endpoint_concurrency``.

The receiver's other answers (a 500, a 404) say nothing about its load and change nothing; nor
do manual resends. A pinned key (an ordered endpoint's 1, migration 0029) is never resized:
the statement leaves it alone. The statement goes out only when a share may change: this
process remembers for ``REMEMBER_S`` which endpoints it last saw at the top or the bottom
(another worker may have moved them since), so a fast endpoint at its ceiling costs nothing
per batch. Growing, an endpoint's share is written at most every ``GROW_EVERY_S`` by a
process: the fast batches in between are added up and written at once, each still one step
(overloads go out at once). At 20 endpoints the statement had followed about two record
batches in three while the shares climbed from 5 to 100 (bench/RESULTS.md, 2026-12-07).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from notifyq._settings import WebhookSettings

REMEMBER_S = 10.0
GROW_EVERY_S = 0.25
KEY_PREFIX = "webhook:"


class Shares:
    def __init__(self, settings: WebhookSettings, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._settled: dict[UUID, tuple[int, float]] = {}
        """Endpoint -> (its share, when seen) for endpoints at 1 or at the ceiling."""
        self._growing: dict[UUID, tuple[int, float]] = {}
        """Endpoint -> (fast batches not yet written, when its share was last grown)."""

    def overloaded(self, attempt: dict[str, Any]) -> bool:
        code = attempt["status_code"]
        return bool(attempt["counted"]) and (
            attempt["error_kind"] in ("timeout", "connect") or code == 429
            or (code is not None and 502 <= code <= 504)
            or attempt["duration_ms"] >= self._settings.endpoint_slow_s * 1000)

    def changes(self, attempts: Sequence[dict[str, Any]]) -> dict[UUID, int] | None:
        """The endpoints whose share may change after these attempts, with how many of
        theirs were overloaded (0: grow, by :meth:`params`' steps); None when none may."""
        slow_ms = self._settings.endpoint_slow_s * 1000
        overloaded: dict[UUID, int] = {}
        fast: set[UUID] = set()
        for attempt in attempts:
            endpoint = attempt["endpoint_id"]
            if self.overloaded(attempt):
                overloaded[endpoint] = overloaded.get(endpoint, 0) + 1
            elif attempt["succeeded"] and attempt["duration_ms"] < slow_ms:
                fast.add(endpoint)
        now = self._clock()
        top = self._settings.endpoint_concurrency_max
        changing = {e: n for e, n in overloaded.items() if self._known(e, now) != 1}
        for endpoint in overloaded:
            self._growing.pop(endpoint, None)
        changing.update({e: 0 for e in fast - overloaded.keys()
                         if self._known(e, now) != top and self._grow_now(e, now)})
        return changing or None

    def _grow_now(self, endpoint: UUID, now: float) -> bool:
        """One more fast batch: whether the share is written now, or the step waits."""
        steps, grown_at = self._growing.get(endpoint, (0, -GROW_EVERY_S))
        if len(self._growing) > 100_000:
            self._growing.clear()
        if now - grown_at >= GROW_EVERY_S:
            return True
        self._growing[endpoint] = (steps + 1, grown_at)
        return False

    def params(self, changing: dict[UUID, int], now: Any) -> dict[str, Any]:
        """``key_concurrency_resize``'s parameters: a growing endpoint grows by this batch's
        step and those that waited since its last write."""
        keys = sorted(changing)
        return {"keys": [f"{KEY_PREFIX}{e}" for e in keys],
                "overloaded": [changing[e] for e in keys],
                "grow": [0 if changing[e] else 1 + self._growing.get(e, (0, 0.0))[0]
                         for e in keys],
                "share_start": self._settings.endpoint_concurrency,
                "share_max": self._settings.endpoint_concurrency_max, "now": now}

    def learned(self, changing: dict[UUID, int], rows: Sequence[dict[str, Any]]) -> None:
        """After the statement: what it wrote (a key it left alone was already at its bound)."""
        now = self._clock()
        written = {UUID(r["key"].removeprefix(KEY_PREFIX)): r["concurrency_limit"]
                   for r in rows}
        top = self._settings.endpoint_concurrency_max
        if len(self._settled) > 100_000:
            self._settled.clear()
        for endpoint, overloaded in changing.items():
            if not overloaded:
                self._growing[endpoint] = (0, now)
            share = written.get(endpoint, 1 if overloaded else top)
            if share in (1, top):
                self._settled[endpoint] = (share, now)
            else:
                self._settled.pop(endpoint, None)

    def _known(self, endpoint: UUID, now: float) -> int | None:
        seen = self._settled.get(endpoint)
        if seen is None or now - seen[1] > REMEMBER_S:
            return None
        return seen[0]
