"""Injectable time.

Every component that needs "now" takes a :class:`Clock`; queries take ``now`` as a parameter
(``coalesce(%(now)s, now())``). The system clock passes ``None`` so the database decides, which
keeps lease arithmetic on one clock however skewed the workers' clocks are.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...

    def db_now(self) -> datetime | None:
        """The ``now`` to pass to queries: ``None`` lets the database use its own clock."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for measuring intervals."""
        ...


class SystemClock:
    """Wall time from this host; queries use the database's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def db_now(self) -> datetime | None:
        return None

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to, for tests.

    Example::

        clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
        clock.advance(timedelta(minutes=5))
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start")
        self._now = start
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def db_now(self) -> datetime | None:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, delta: timedelta) -> None:
        self._now += delta
        self._mono += delta.total_seconds()
