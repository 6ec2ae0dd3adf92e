"""How many runs a worker claims ahead of its handlers (``worker.prefetch``).

A worker holds up to ``concurrency + prefetch`` claimed runs: the ones beyond its busy handler
slots wait in its buffer, leased and heartbeated, so a slot that frees up starts its next run at
once instead of waiting for a claim's round trip. Set, ``worker.prefetch`` is that number.
Unset (the default) it follows the worker, by Little's law: enough runs to keep every slot busy
for ``ROUND_TRIPS`` round trips of the completer's statement at the rate the worker finishes
runs, at least 1 and at most ``MOST_PER_SLOT`` per slot up to ``MOST_AHEAD`` (a batch of about
a hundred runs already spreads the statement's fixed cost thin: 220k server instructions a run
at 100, 265k at 20; bench/statement_cost.py), or the concurrency where that is more.

Three round trips, because a busy worker holds each run for about that long: the statement
that claims it, the next one (in flight while the handlers run the batch: see
:mod:`~notifyq._dispatch.completer`), and the one that writes it back. With two, the batches
shrank to what the slots left free while the previous batch waited (no-op runs at concurrency
10: 14-18 runs a statement against 32-46).

- short runs are claimed in batches large enough for the statement's fixed cost: no-op runs at
  concurrency 10 finish ~8,000-12,000/s with 1.5-3 ms statements, 40-100 ahead (the cap is
  100 there; a prefetch of 10, the first default, drained 7.2-9.3k runs/s where 40 drained
  9.8-10.4k);
- long runs are not hoarded: 10 ms runs at 1,000/s with 2 ms statements get 6, one-second runs
  1, where the first fixed default (the concurrency) held 10 that another worker could have
  started.

The estimate is made when a producer is about to claim (:meth:`ClaimAhead.slots`), from the
runs finished since the last one (over at least ``WINDOW_S``, smoothed with a time constant of
``TAU_S``) and the statements' round trips as the completer reports them (smoothed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

ROUND_TRIPS = 3
MOST_PER_SLOT = 10
MOST_AHEAD = 100
WINDOW_S = 0.05
TAU_S = 0.5
ROUND_TRIP_SMOOTHING = 0.3


class ClaimAhead:
    """The worker's number of claim slots: its concurrency plus the runs it claims ahead."""

    def __init__(self, concurrency: int, prefetch: int | None, *,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.concurrency = concurrency
        self.adaptive = prefetch is None
        self.most = max(concurrency, min(MOST_PER_SLOT * concurrency, MOST_AHEAD))
        self.prefetch = concurrency if prefetch is None else prefetch
        """Until the first estimate, as many as the concurrency (the earlier fixed default)."""
        self.rate = 0.0
        """Runs finished per second, smoothed."""
        self.round_trip_s = 0.0
        """The completer's statement, send to answer, smoothed."""
        self._now = now
        self._since = now()
        self._finished = 0

    def finished(self) -> None:
        """A run of this worker finished (its write-back settled)."""
        self._finished += 1

    def statement(self, seconds: float) -> None:
        """A completer statement took ``seconds`` from send to answer."""
        a = ROUND_TRIP_SMOOTHING
        self.round_trip_s = seconds if not self.round_trip_s else (
            a * seconds + (1 - a) * self.round_trip_s)

    def slots(self) -> int:
        """Claim slots now: ``concurrency + prefetch``, re-estimated when adaptive."""
        if self.adaptive:
            now = self._now()
            elapsed = now - self._since
            if elapsed >= WINDOW_S:
                sample = self._finished / elapsed
                weight = 1 - math.exp(-elapsed / TAU_S)
                self.rate = sample if not self.rate else (
                    weight * sample + (1 - weight) * self.rate)
                self._since, self._finished = now, 0
                wanted = math.ceil(ROUND_TRIPS * self.rate * self.round_trip_s)
                self.prefetch = max(1, min(self.most, wanted))
        return self.concurrency + self.prefetch
