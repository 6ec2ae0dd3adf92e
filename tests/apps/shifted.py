"""A bare App whose clock runs ``NOTIFYQ_TEST_CLOCK_SHIFT_S`` seconds ahead (its queries take
that time as ``now``): worker processes that live an hour from now, for the operator-event
tests. A clock is the one thing a test may fake."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from notifyq import App
from notifyq._clock import SystemClock


class ShiftedClock(SystemClock):
    def __init__(self, shift_s: float) -> None:
        self.shift = timedelta(seconds=shift_s)

    def now(self) -> datetime:
        return super().now() + self.shift

    def db_now(self) -> datetime | None:
        return self.now()


app = App(clock=ShiftedClock(float(os.environ.get("NOTIFYQ_TEST_CLOCK_SHIFT_S", "0"))))
