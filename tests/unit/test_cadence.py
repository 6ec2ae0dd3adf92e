"""Cron schedules in a time zone: parsing, declaration errors, daylight saving time, and which
ticks a scheduler pass picks (catch-up, pause) — the pure part, with times given, not read."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from notifyq import App, ConfigError, JobContext
from notifyq._cadence import Cron, Every
from notifyq._maintenance.scheduler import CATCH_UP_MAX, due_ticks

BERLIN = ZoneInfo("Europe/Berlin")
# 2026 in Europe/Berlin: clocks go 02:00 -> 03:00 on 29 March, 03:00 -> 02:00 on 25 October.
SPRING = datetime(2026, 3, 28, 12, tzinfo=UTC)
AUTUMN = datetime(2026, 10, 24, 12, tzinfo=UTC)


def _ticks(cron: Cron, start: datetime, n: int) -> list[datetime]:
    out = [cron.after(start)]
    while len(out) < n:
        out.append(cron.after(out[-1]))
    return out


def _local(ticks: list[datetime]) -> list[str]:
    return [t.astimezone(BERLIN).strftime("%m-%d %H:%M%z") for t in ticks]


def test_weekday_names_and_the_time_zone_give_the_ticks() -> None:
    cron = Cron("0 9 * * MON-FRI", "Europe/Berlin")
    friday_noon = datetime(2026, 11, 27, 11, tzinfo=UTC)
    assert _local(_ticks(cron, friday_noon, 2)) == ["11-30 09:00+0100", "12-01 09:00+0100"]
    assert cron.latest(friday_noon) == datetime(2026, 11, 27, 8, tzinfo=UTC)
    assert cron.before(datetime(2026, 11, 30, 8, tzinfo=UTC)) == cron.latest(friday_noon)


def test_a_time_in_the_repeated_hour_runs_once_at_its_first_occurrence() -> None:
    cron = Cron("30 2 * * *", "Europe/Berlin")
    ticks = _ticks(cron, AUTUMN, 3)
    assert _local(ticks) == ["10-25 02:30+0200", "10-26 02:30+0100", "10-27 02:30+0100"]
    assert ticks[1] - ticks[0] == timedelta(hours=25)


def test_an_hourly_expression_runs_once_per_wall_clock_hour_on_the_long_night() -> None:
    cron = Cron("0 * * * *", "Europe/Berlin")
    ticks = _ticks(cron, datetime(2026, 10, 24, 22, 30, tzinfo=UTC), 4)
    assert _local(ticks) == ["10-25 01:00+0200", "10-25 02:00+0200", "10-25 03:00+0100",
                             "10-25 04:00+0100"]


def test_a_time_in_the_skipped_hour_runs_when_the_clock_jumps() -> None:
    cron = Cron("30 2 * * *", "Europe/Berlin")
    ticks = _ticks(cron, SPRING, 3)
    assert _local(ticks) == ["03-29 03:00+0200", "03-30 02:30+0200", "03-31 02:30+0200"]
    assert ticks[0] == datetime(2026, 3, 29, 1, tzinfo=UTC)  # the jump itself


def test_the_hour_after_the_skipped_one_is_not_merged_into_it() -> None:
    cron = Cron("30 2,3 * * *", "Europe/Berlin")
    assert _local(_ticks(cron, SPRING, 3)) == [
        "03-29 03:00+0200", "03-29 03:30+0200", "03-30 02:30+0200"]


def test_latest_and_after_agree_across_both_changes() -> None:
    cron = Cron("*/20 1-3 * * *", "Europe/Berlin")
    for start in (SPRING, AUTUMN):
        ticks = _ticks(cron, start, 12)
        assert ticks == sorted(set(ticks))  # strictly increasing, no duplicates
        for earlier, tick in itertools.pairwise(ticks):
            assert cron.latest(tick) == tick
            assert cron.latest(tick - timedelta(seconds=1)) == earlier
            assert cron.before(tick) == earlier


@pytest.mark.parametrize(("expression", "tz", "message"), [
    ("61 * * * *", "UTC", "invalid cron expression '61 \\* \\* \\* \\*'"),
    ("0 9 * * FOO", "UTC", "invalid cron expression"),
    ("* * * *", "UTC", "needs 5 fields"),
    ("* * * * * *", "UTC", "needs 5 fields"),
    ("0 9 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    ("0 9 * * *", "../etc/passwd", "unknown time zone"),
    ("0 0 30 2 *", "UTC", "never matches"),
])
def test_bad_expressions_and_time_zones_fail_at_declaration(expression: str, tz: str,
                                                           message: str) -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")
    with pytest.raises(ConfigError, match=message):
        app.periodic("a.b", cron=expression, tz=tz)


def test_periodic_declaration_errors_name_the_problem() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")
    with pytest.raises(ConfigError, match="exactly one of every= and cron="):
        app.periodic("a.b")
    with pytest.raises(ConfigError, match="exactly one of every= and cron="):
        app.periodic("a.b", every=timedelta(seconds=1), cron="* * * * *")
    with pytest.raises(ConfigError, match="tz= applies to cron= schedules only"):
        app.periodic("a.b", every=timedelta(seconds=1), tz="UTC")
    with pytest.raises(ConfigError, match="invalid schedule name"):
        app.periodic("a.b", cron="* * * * *", name="")
    with pytest.raises(ConfigError, match="catch_up must be True or False"):
        app.periodic("a.b", cron="* * * * *", catch_up="yes")  # type: ignore[arg-type]


def test_cron_schedules_are_named_and_a_name_is_declared_once() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")

    @app.periodic(cron="0 9 * * MON-FRI", tz="Europe/Berlin")
    @app.periodic(cron="0 9 * * SAT", name="digest.weekend", catch_up=True)
    @app.handler("digest.send")
    async def digest(ctx: JobContext) -> None: ...

    [weekend, weekdays] = app._registry.periodic
    assert weekdays.name == "digest.send@cron(0 9 * * MON-FRI, Europe/Berlin)"
    assert (weekend.name, weekend.cadence, weekend.catch_up) == (
        "digest.weekend", Cron("0 9 * * SAT", "UTC"), True)
    with pytest.raises(ConfigError, match="declared twice"):
        app.periodic(cron="0 9 * * SAT", name="digest.weekend")(digest)


# -- which ticks a pass enqueues --------------------------------------------------------------

MINUTELY = Cron("* * * * *", "UTC")
T = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_without_catch_up_only_the_current_tick_within_a_minute_is_due() -> None:
    assert due_ticks(MINUTELY, T + timedelta(seconds=5), last=None, resumed=None,
                     catch_up=False) == [T]
    assert due_ticks(MINUTELY, T + timedelta(seconds=5), last=T, resumed=None,
                     catch_up=False) == []
    daily = Cron("0 9 * * *", "UTC")
    # A worker starting at noon does not run the 09:00 tick: it was missed, not late.
    assert due_ticks(daily, T, last=None, resumed=None, catch_up=False) == []
    assert due_ticks(daily, T, last=T - timedelta(days=1, hours=3), resumed=None,
                     catch_up=False) == []


def test_an_interval_schedule_runs_its_current_tick_as_before() -> None:
    hourly = Every(timedelta(hours=1))
    assert due_ticks(hourly, T + timedelta(minutes=59), last=None, resumed=None,
                     catch_up=False) == [T]


def test_catch_up_enqueues_every_missed_tick_since_the_last_oldest_first() -> None:
    ticks = due_ticks(MINUTELY, T + timedelta(seconds=30), last=T - timedelta(minutes=5),
                      resumed=None, catch_up=True)
    assert ticks == [T - timedelta(minutes=n) for n in (4, 3, 2, 1, 0)]
    daily = Cron("0 9 * * *", "UTC")
    assert due_ticks(daily, T, last=T - timedelta(days=2, hours=3), resumed=None,
                     catch_up=True) == [T - timedelta(days=1, hours=3), T - timedelta(hours=3)]


def test_catch_up_never_reaches_before_the_last_resume_and_is_bounded() -> None:
    resumed = T - timedelta(minutes=2, seconds=30)
    assert due_ticks(MINUTELY, T, last=T - timedelta(hours=1), resumed=resumed,
                     catch_up=True) == [T - timedelta(minutes=2), T - timedelta(minutes=1), T]
    # Ticks that fell due while paused are skipped without catch-up too.
    assert due_ticks(MINUTELY, T + timedelta(seconds=10), last=None,
                     resumed=T + timedelta(seconds=5), catch_up=False) == []
    many = due_ticks(MINUTELY, T, last=T - timedelta(days=30), resumed=None, catch_up=True)
    assert len(many) == CATCH_UP_MAX
    assert many[-1] == T
