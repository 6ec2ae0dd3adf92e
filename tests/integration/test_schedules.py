"""Periodic schedules on a real database with an injected clock: two schedulers (two nodes)
walked minute by minute through both daylight-saving nights, catch-up after downtime, and
pause/resume. Every count is read in SQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifyq import App, ManualClock, ScheduleNotFound
from notifyq._cadence import Cadence, Cron, Every
from notifyq._maintenance.scheduler import Scheduler
from notifyq._registry import PeriodicSpec
from tests.integration.inproc import fetch, scalar

pytestmark = pytest.mark.anyio


async def _nodes(app: App, clock: ManualClock, specs: list[PeriodicSpec],
                 n: int = 2) -> list[Scheduler]:
    db = await app.pool()
    return [Scheduler(db, app._runtime.queries, clock, specs) for _ in range(n)]


async def _walk(nodes: list[Scheduler], clock: ManualClock, until: datetime,
                step: timedelta = timedelta(minutes=1)) -> int:
    """Every node runs a pass at each step until ``until``; the runs they enqueued."""
    enqueued = 0
    while clock.now() <= until:
        for node in nodes:
            enqueued += (await node.run_once())["enqueued"]
        clock.advance(step)
    return enqueued


async def _runs(app: App, name: str) -> list[dict[str, Any]]:
    """Per run_at of schedule ``name``: how many runs (each must be 1)."""
    return await fetch(app, "SELECT run_at, count(*)::int AS n FROM notifyq.job_run "
                            "WHERE trigger_ref = %s GROUP BY run_at ORDER BY run_at", name)


def _spec(name: str, cadence: Cadence, *, catch_up: bool = False) -> PeriodicSpec:
    return PeriodicSpec("sched.job", cadence, {}, catch_up, name)


def _berlin(ticks: list[dict[str, Any]]) -> list[str]:
    berlin = Cron("* * * * *", "Europe/Berlin").zone
    return [t["run_at"].astimezone(berlin).strftime("%H:%M%z") for t in ticks]


async def test_the_repeated_hour_runs_a_daily_tick_once_and_hourly_ones_once_per_hour(
        app: App) -> None:
    # 25 October 2026, Berlin: 03:00 CEST becomes 02:00 CET (01:00 UTC).
    clock = ManualClock(datetime(2026, 10, 24, 22, 30, tzinfo=UTC))
    specs = [_spec("nightly", Cron("30 2 * * *", "Europe/Berlin")),
             _spec("hourly", Cron("0 * * * *", "Europe/Berlin"))]
    enqueued = await _walk(await _nodes(app, clock, specs), clock,
                           datetime(2026, 10, 25, 4, 30, tzinfo=UTC))
    nightly, hourly = await _runs(app, "nightly"), await _runs(app, "hourly")
    assert _berlin(nightly) == ["02:30+0200"]
    assert _berlin(hourly) == ["01:00+0200", "02:00+0200", "03:00+0100", "04:00+0100",
                               "05:00+0100"]
    assert {r["n"] for r in nightly + hourly} == {1}
    assert enqueued == 6 == await scalar(app, "SELECT count(*) FROM notifyq.job_run")


async def test_the_skipped_hour_runs_its_tick_when_the_clock_jumps(app: App) -> None:
    # 29 March 2026, Berlin: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 never happens.
    clock = ManualClock(datetime(2026, 3, 28, 23, 30, tzinfo=UTC))
    specs = [_spec("nightly", Cron("30 2 * * *", "Europe/Berlin")),
             _spec("hourly", Cron("0 * * * *", "Europe/Berlin"))]
    await _walk(await _nodes(app, clock, specs), clock, datetime(2026, 3, 29, 3, 30, tzinfo=UTC))
    nightly, hourly = await _runs(app, "nightly"), await _runs(app, "hourly")
    assert _berlin(nightly) == ["03:00+0200"]
    assert nightly[0]["run_at"] == datetime(2026, 3, 29, 1, tzinfo=UTC)
    # 02:00 does not exist: it runs at the jump, which is 03:00, so 03:00 runs once.
    assert _berlin(hourly) == ["01:00+0100", "03:00+0200", "04:00+0200", "05:00+0200"]
    assert {r["n"] for r in nightly + hourly} == {1}


async def test_a_node_that_wakes_late_in_the_skipped_hour_still_runs_the_tick(app: App) -> None:
    clock = ManualClock(datetime(2026, 3, 29, 0, 59, tzinfo=UTC))
    [node] = await _nodes(app, clock, [_spec("nightly", Cron("30 2 * * *", "Europe/Berlin"))],
                          n=1)
    assert (await node.run_once())["enqueued"] == 0
    clock.advance(timedelta(minutes=1, seconds=20))  # 01:00:20 UTC, 20 s after the jump
    assert (await node.run_once())["enqueued"] == 1
    assert _berlin(await _runs(app, "nightly")) == ["03:00+0200"]


async def test_catch_up_enqueues_the_ticks_missed_during_downtime_once(app: App) -> None:
    start = datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
    clock = ManualClock(start)
    specs = [_spec("caught", Cron("*/10 * * * *", "UTC"), catch_up=True),
             _spec("skipped", Cron("*/10 * * * *", "UTC"))]
    nodes = await _nodes(app, clock, specs, n=3)
    assert (await nodes[0].run_once())["enqueued"] == 2  # the 12:00 tick of each
    clock.advance(timedelta(hours=1))  # every node down until 13:00:05
    assert sum([(await node.run_once())["enqueued"] for node in nodes]) == 6 + 1
    caught = await _runs(app, "caught")
    assert [r["run_at"] for r in caught] == [
        datetime(2030, 1, 1, 12, m, tzinfo=UTC) for m in (0, 10, 20, 30, 40, 50)
    ] + [datetime(2030, 1, 1, 13, tzinfo=UTC)]
    assert {r["n"] for r in caught} == {1}
    # Without catch-up the missed ticks are gone; the current one (5 s old) runs.
    assert [r["run_at"] for r in await _runs(app, "skipped")] == [
        datetime(2030, 1, 1, 12, tzinfo=UTC), datetime(2030, 1, 1, 13, tzinfo=UTC)]
    # Catch-up runs are runnable at once (run_at in the past) and say which tick they are.
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run WHERE trigger_source = "
                             "'schedule' AND run_at <= %s", clock.now()) == 9


async def test_without_catch_up_a_cron_tick_seen_over_a_minute_late_is_missed(app: App) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 8, 0, tzinfo=UTC))
    [node] = await _nodes(app, clock, [_spec("daily", Cron("0 9 * * *", "UTC"))], n=1)
    assert (await node.run_once())["enqueued"] == 0  # a fresh schedule does not fire
    clock.advance(timedelta(hours=1, seconds=59))
    assert (await node.run_once())["enqueued"] == 1  # 59 s late is late, not missed
    clock.advance(timedelta(days=1, seconds=2))  # 09:01:01 the next day
    assert (await node.run_once())["enqueued"] == 0
    assert len(await _runs(app, "daily")) == 1


async def test_a_paused_schedule_ticks_on_no_node_and_resumes_without_the_paused_ticks(
        app: App) -> None:
    start = datetime(2030, 1, 1, 12, 0, 1, tzinfo=UTC)
    clock = ManualClock(start)
    specs = [_spec("every", Every(timedelta(minutes=1)), catch_up=True),
             _spec("cron", Cron("* * * * *", "Europe/Berlin"), catch_up=True)]
    nodes = await _nodes(app, clock, specs, n=3)
    await _walk(nodes, clock, start + timedelta(minutes=2))  # 12:00, 12:01, 12:02
    control = App(settings=app.settings, clock=clock)
    async with control:
        for name in ("every", "cron"):
            paused = await control.pause_schedule(name)
            assert paused["paused_at"] == clock.now()
        listed = {s["name"]: s for s in await control.schedules()}
        assert listed["cron"]["paused"] is True
        assert listed["cron"]["next_tick_at"] is None
        assert await _walk(nodes, clock, start + timedelta(minutes=10)) == 0
        for name in ("every", "cron"):
            await control.resume_schedule(name)
        clock.advance(timedelta(seconds=30))  # 12:11:31, resumed at 12:11:01
        await _walk(nodes, clock, start + timedelta(minutes=13, seconds=30))
        with pytest.raises(ScheduleNotFound, match="no periodic schedule named 'nope'"):
            await control.pause_schedule("nope")
        with pytest.raises(ScheduleNotFound):
            await control.resume_schedule("nope")
    for name in ("every", "cron"):
        runs = await _runs(app, name)
        assert [r["run_at"].minute for r in runs] == [0, 1, 2, 12, 13]  # not 3..11
        assert {r["n"] for r in runs} == {1}
