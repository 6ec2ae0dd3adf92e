"""When a periodic schedule ticks: ``Every`` (a fixed interval) or ``Cron`` (an expression read in
a time zone). Both give ticks as UTC instants, which is what the cluster agrees on: the
``periodic_tick`` primary key and the schedule's ``last_tick_at`` are instants, never wall times.

A cron expression matches wall-clock times; daylight saving time makes some of them ambiguous
or missing. The rule: **each matching wall-clock time runs once**.

- A time in the repeated hour (autumn; 02:30 in Europe/Berlin happens twice) runs at its first
  occurrence only, so a daily ``30 2 * * *`` does not run twice that night. Hourly expressions
  follow the same rule: the repeated hour's ``0 * * * *`` runs once, not twice.
- A time in the skipped hour (spring; 02:30 never happens) runs at the instant the clock jumps
  (03:00 local), so it is late, not lost.

Parsing is croniter's (5 fields, names such as ``MON-FRI`` and ``@daily`` accepted), on naive
wall-clock times where it is pure calendar arithmetic; the mapping to instants is ours.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from notifyq._errors import ConfigError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ALIASES = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}


@dataclass(frozen=True, slots=True)
class Every:
    """Ticks at multiples of ``every`` since the Unix epoch, so all nodes agree on them."""

    every: timedelta

    def latest(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        # Integer division is exact; float seconds * 1e6 gives 1000999 µs for 1001 ms.
        step = self.every // timedelta(microseconds=1)
        micros = (now - EPOCH) // timedelta(microseconds=1)
        return EPOCH + timedelta(microseconds=micros - micros % step)

    def before(self, tick: datetime) -> datetime:
        """The tick before the tick ``tick``."""
        return self.latest(tick - timedelta(microseconds=1))

    def after(self, now: datetime) -> datetime:
        """The first tick strictly after ``now``."""
        return self.latest(now) + self.every

    @property
    def grace(self) -> timedelta:
        """How late a tick may still be enqueued without catch-up: an interval schedule runs its
        current interval's tick (a worker starting mid-interval runs it at once)."""
        return self.every


@dataclass(frozen=True, slots=True)
class Cron:
    """Ticks at the wall-clock times ``expression`` matches in ``tz`` (an IANA name)."""

    expression: str
    tz: str

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if not (len(fields) == 5 or (len(fields) == 1 and fields[0].lower() in _ALIASES)):
            raise ConfigError(
                f"invalid cron expression {self.expression!r}: it needs 5 fields (minute hour "
                "day-of-month month day-of-week) or one of " + ", ".join(sorted(_ALIASES)))
        if not croniter.is_valid(self.expression):
            raise ConfigError(f"invalid cron expression {self.expression!r}: a field is out of "
                              "range or not understood (e.g. '0 9 * * MON-FRI')")
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"unknown time zone {self.tz!r}: use an IANA name such as "
                              "'Europe/Berlin' or 'UTC'") from None
        try:
            self.after(datetime.now(UTC))
        except CroniterError:
            raise ConfigError(f"cron expression {self.expression!r} never matches "
                              "(e.g. 30 February)") from None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    @property
    def grace(self) -> timedelta:
        """How late a tick may still be enqueued without catch-up; a later one was missed."""
        return timedelta(minutes=1)

    def after(self, now: datetime) -> datetime:
        """The first tick strictly after ``now``."""
        # now's own wall time maps to now or (in a repeated hour's second pass) before it, so
        # walking forward from it meets every later tick.
        wall = now.astimezone(self.zone).replace(tzinfo=None)
        return next(t for t in self._walk(wall, forward=True) if t > now)

    def latest(self, now: datetime) -> datetime:
        """The last tick at or before ``now``."""
        local = now.astimezone(self.zone)
        wall = local.replace(tzinfo=None)
        if local.fold:
            # The repeated hour's second pass: the walls of the next hour-or-so still map to
            # their first occurrence, before now, so the walk back starts past them.
            first, second = local.replace(fold=0).utcoffset(), local.utcoffset()
            wall += (first or timedelta(0)) - (second or timedelta(0))
        return next(t for t in self._walk(wall + timedelta(seconds=1), forward=False)
                    if t <= now)

    def before(self, tick: datetime) -> datetime:
        """The tick before the tick ``tick``."""
        return self.latest(tick - timedelta(microseconds=1))

    def _walk(self, wall: datetime, *, forward: bool) -> Iterator[datetime]:
        """Instants of the matching wall times after (or before) the naive wall time ``wall``,
        in order: the mapping from wall time to instant never goes backwards."""
        it = croniter(self.expression, wall)
        while True:
            matched = it.get_next(datetime) if forward else it.get_prev(datetime)
            yield self.instant(matched)

    def instant(self, wall: datetime) -> datetime:
        """The UTC instant a matching wall time runs at: its first occurrence when the hour
        repeats; the moment the clock jumps when the hour is skipped."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if first.astimezone(self.zone).replace(tzinfo=None) == wall:
            return first
        # Skipped: fold=1 reads the wall time with the offset after the jump, which lands
        # before the jump; fold=0 lands after it. The jump lies between; find it to the second.
        after_jump = first.astimezone(self.zone).utcoffset()
        lo = int(wall.replace(tzinfo=self.zone, fold=1).timestamp())
        hi = int(first.timestamp())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, self.zone).utcoffset() == after_jump:
                hi = mid
            else:
                lo = mid
        return datetime.fromtimestamp(hi, UTC)

Cadence = Every | Cron
