"""How many runs a worker claims ahead of its handlers (``worker.prefetch``).

A worker holds up to ``concurrency + prefetch`` claimed runs: the ones beyond its busy handler
slots wait in its buffer, leased and heartbeated, so a slot that frees up starts its next run at
once instead of waiting for a claim's round trip. Set, ``worker.prefetch`` is that number.
Unset (the default) it follows the worker, by Little's law: enough runs to keep every slot busy
for ``ROUND_TRIPS`` round trips of the completer's statement at the rate the handlers could
finish runs (the concurrency over the handlers' mean duration), at least 1 and at most
``MOST_PER_SLOT`` per slot up to ``MOST_AHEAD``, or the concurrency where that is more.

Three round trips, because a busy worker holds each run for about that long: the statement
that claims it, the next one (in flight while the handlers run the batch: see
:mod:`~notifyq._dispatch.completer`), and the one that writes it back. With two, the batches
shrank to what the slots left free while the previous batch waited (no-op runs at concurrency
10: 14-18 runs a statement against 32-46).

The rate is the handlers' own (concurrency / mean duration), not the rate runs are seen to
finish, which it was until 2026-12-04: a worker held back by its claim-ahead finishes runs only
as fast as it claims them, so that estimate sized the window from its own shortfall and settled
below the cap (no-op runs at concurrency 10 on 2 cores: 17-18k runs/s where a fixed prefetch of
100 drained 21-23k; three round trips made six drained 21-22k, eight 28k: the window grew with
the factor, not with the need). From the handlers' duration:

- short runs are claimed in batches large enough for the statement's fixed cost: a no-op
  handler could finish hundreds of thousands a second, so the window is the cap, 20 a slot up
  to 200 (10 a slot up to 100 before). Drain of 20,000 no-op runs, the estimate and the cap
  before and after, alternated (runs/s): concurrency 10, one completer lane, 15.6-17.5k ->
  23.9-24.9k; with two lanes 22.1-30.9k; concurrency 50 21.1-22.4k -> 26.8-30.4k;
- long runs are not hoarded: 10 ms handlers at concurrency 10 with 2 ms statements get 6,
  one-second handlers 1, where the first fixed default (the concurrency) held 10 that another
  worker could have started.

The estimate is made when a producer is about to claim (:meth:`ClaimAhead.slots`), from the
runs finished since the last one (over at least ``WINDOW_S``: the concurrency over their mean
handler duration, or 0 when none finished, so a worker whose runs stop finishing claims less
within three seconds; smoothed with a time constant of ``TAU_S``) and the statements' round
trips as the completer reports them (smoothed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

ROUND_TRIPS = 3
MOST_PER_SLOT = 20
MOST_AHEAD = 200
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
        """Runs the handlers could finish per second (concurrency / their mean duration),
        smoothed; 0 while none finish."""
        self.round_trip_s = 0.0
        """The completer's statement, send to answer, smoothed."""
        self._now = now
        self._since: float | None = None
        """The start of the estimate's window: the first claim's time at first, so a worker
        slow to reach its first claim (a loaded machine) does not start from an empty window."""
        self._finished = 0
        self._busy_s = 0.0

    def finished(self, handler_s: float) -> None:
        """A run of this worker finished (its write-back settled); its handler took
        ``handler_s`` seconds."""
        self._finished += 1
        self._busy_s += handler_s

    def statement(self, seconds: float) -> None:
        """A completer statement took ``seconds`` from send to answer."""
        a = ROUND_TRIP_SMOOTHING
        self.round_trip_s = seconds if not self.round_trip_s else (
            a * seconds + (1 - a) * self.round_trip_s)

    def slots(self) -> int:
        """Claim slots now: ``concurrency + prefetch``, re-estimated when adaptive."""
        if self.adaptive:
            now = self._now()
            if self._since is None:
                self._since = now
            elapsed = now - self._since
            if elapsed >= WINDOW_S:
                sample = self._sample()
                weight = 1 - math.exp(-elapsed / TAU_S)
                self.rate = sample if not self.rate else (
                    weight * sample + (1 - weight) * self.rate)
                self._since, self._finished, self._busy_s = now, 0, 0.0
                wanted = math.ceil(ROUND_TRIPS * self.rate * self.round_trip_s)
                self.prefetch = max(1, min(self.most, wanted))
        return self.concurrency + self.prefetch

    def _sample(self) -> float:
        """The window's rate: the concurrency over its runs' mean handler duration, at most
        what fills the cap (faster says nothing more, and would only make a worker whose
        handlers slow down take longer to claim less); 0 when none finished."""
        if not self._finished:
            return 0.0
        most = self.most / (ROUND_TRIPS * self.round_trip_s) if self.round_trip_s else math.inf
        # At least a microsecond a run: a handler that returns at once is that fast.
        busy_s = max(self._busy_s, self._finished * 1e-6)
        return min(most, self.concurrency * self._finished / busy_s)
