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
per batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from notifyq._settings import WebhookSettings

REMEMBER_S = 10.0
KEY_PREFIX = "webhook:"


class Shares:
    def __init__(self, settings: WebhookSettings) -> None:
        self._settings = settings
        self._settled: dict[UUID, tuple[int, float]] = {}
        """Endpoint -> (its share, when seen) for endpoints at 1 or at the ceiling."""

    def overloaded(self, attempt: dict[str, Any]) -> bool:
        code = attempt["status_code"]
        return bool(attempt["counted"]) and (
            attempt["error_kind"] in ("timeout", "connect") or code == 429
            or (code is not None and 502 <= code <= 504)
            or attempt["duration_ms"] >= self._settings.endpoint_slow_s * 1000)

    def changes(self, attempts: Sequence[dict[str, Any]]) -> dict[UUID, int] | None:
        """The endpoints whose share may change after these attempts, with how many of
        theirs were overloaded (0: grow by one); None when none may."""
        slow_ms = self._settings.endpoint_slow_s * 1000
        overloaded: dict[UUID, int] = {}
        fast: set[UUID] = set()
        for attempt in attempts:
            endpoint = attempt["endpoint_id"]
            if self.overloaded(attempt):
                overloaded[endpoint] = overloaded.get(endpoint, 0) + 1
            elif attempt["succeeded"] and attempt["duration_ms"] < slow_ms:
                fast.add(endpoint)
        now = time.monotonic()
        top = self._settings.endpoint_concurrency_max
        changing = {e: n for e, n in overloaded.items() if self._known(e, now) != 1}
        changing.update({e: 0 for e in fast - overloaded.keys()
                         if self._known(e, now) != top})
        return changing or None

    def params(self, changing: dict[UUID, int], now: Any) -> dict[str, Any]:
        """``key_concurrency_resize``'s parameters."""
        keys = sorted(changing)
        return {"keys": [f"{KEY_PREFIX}{e}" for e in keys],
                "overloaded": [changing[e] for e in keys],
                "share_start": self._settings.endpoint_concurrency,
                "share_max": self._settings.endpoint_concurrency_max, "now": now}

    def learned(self, changing: dict[UUID, int], rows: Sequence[dict[str, Any]]) -> None:
        """After the statement: what it wrote (a key it left alone was already at its bound)."""
        now = time.monotonic()
        written = {UUID(r["key"].removeprefix(KEY_PREFIX)): r["concurrency_limit"]
                   for r in rows}
        top = self._settings.endpoint_concurrency_max
        if len(self._settled) > 100_000:
            self._settled.clear()
        for endpoint, overloaded in changing.items():
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
