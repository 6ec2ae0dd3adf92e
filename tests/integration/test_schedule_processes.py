"""Periodic schedules with real ``notifyq worker`` processes, the CLI and ``notifyq serve``:
exactly one run per tick across processes (catch-up included), pause and resume obeyed by every
process, and the schedules listed with their last and next tick. Counts are read in SQL."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from tests.integration.serving import READER, Served
from tests.integration.test_cli import fails, ok
from tests.support import Workers, scalar, wait_until

Conn = psycopg.Connection[Any]
APP = "tests.apps.schedules:app"
OFFICE = "sched.office@cron(*/15 9-17 * * MON-FRI, Europe/Berlin)"


def _runs(sql: Conn, name: str) -> int:
    return int(scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE trigger_ref = %s",
                      (name,)))


def _doubled_ticks(sql: Conn) -> list[Any]:
    """(schedule, run_at) pairs with more than one run: must be none."""
    return sql.execute("SELECT trigger_ref, run_at, count(*) FROM notifyq.job_run "
                       "WHERE trigger_source = 'schedule' GROUP BY 1, 2 HAVING count(*) > 1"
                       ).fetchall()


@pytest.mark.timeout(120)
def test_three_worker_processes_catch_up_each_missed_cron_tick_exactly_once(
        dsn: str, sql: Conn, logs: Path) -> None:
    # As if the cluster had been down for 30 minutes after the minutely schedule's last tick.
    sql.execute("INSERT INTO notifyq.periodic_schedule (name, job_type, cron, tz, catch_up, "
                "last_tick_at) VALUES ('minutely', 'sched.minutely', '* * * * *', 'UTC', true, "
                "date_trunc('minute', now()) - interval '30 minutes')")
    last = scalar(sql, "SELECT last_tick_at FROM notifyq.periodic_schedule")
    with Workers(dsn, logs, app=APP, concurrency=4) as workers:
        for _ in range(3):
            workers.start()
        wait_until(lambda: _at_least(_runs(sql, "minutely"), 30), timeout=60)
        wait_until(lambda: _at_least(_runs(sql, "fast"), 10), timeout=60)
        assert workers.stop_all() == [0, 0, 0]
    run_ats = [r[0] for r in sql.execute(
        "SELECT run_at FROM notifyq.job_run WHERE trigger_ref = 'minutely' ORDER BY run_at")]
    assert run_ats == [last + timedelta(minutes=n) for n in range(1, len(run_ats) + 1)]
    assert len(run_ats) in (30, 31)  # 31 if a minute turned during the test
    assert _doubled_ticks(sql) == []
    assert scalar(sql, "SELECT count(*) FROM notifyq.periodic_tick") == scalar(
        sql, "SELECT count(*) FROM notifyq.job_run")
    # Each process registered the same three schedules into the same three rows.
    assert scalar(sql, "SELECT count(*) FROM notifyq.periodic_schedule") == 3


def _at_least(value: int, n: int) -> None:
    assert value >= n, value


@pytest.mark.timeout(120)
def test_a_paused_schedule_ticks_in_no_worker_process_until_resumed(
        dsn: str, sql: Conn, logs: Path) -> None:
    with Workers(dsn, logs, app=APP, concurrency=4) as workers:
        for _ in range(3):
            workers.start()
        wait_until(lambda: _at_least(_runs(sql, "fast"), 3), timeout=60)
        assert ok(dsn, "schedules", "pause", "fast").startswith("paused fast (since ")
        at_pause = _runs(sql, "fast")
        time.sleep(1.5)  # the measurement window: 7 ticks of 200 ms that must not run
        assert _runs(sql, "fast") == at_pause
        listed = {s["name"]: s for s in json.loads(ok(dsn, "schedules", "list", "--json"))}
        assert listed["fast"]["paused"] is True
        assert listed["fast"]["next_tick_at"] is None
        assert ok(dsn, "schedules", "resume", "fast").startswith("resumed fast")
        wait_until(lambda: _at_least(_runs(sql, "fast"), at_pause + 3), timeout=30)
        assert workers.stop_all() == [0, 0, 0]
    resumed_at = scalar(sql, "SELECT resumed_at FROM notifyq.periodic_schedule "
                             "WHERE name = 'fast'")
    # No tick of the 1.4 s before the resume (all inside the pause) was enqueued.
    paused_window = sql.execute(
        "SELECT tick_at FROM notifyq.periodic_tick WHERE name = 'fast' "
        "AND tick_at >= %s - interval '1.4 s' AND tick_at < %s", (resumed_at, resumed_at)
    ).fetchall()
    assert paused_window == []
    assert _doubled_ticks(sql) == []


def test_the_cli_lists_schedules_and_names_an_unknown_one(dsn: str, sql: Conn) -> None:
    assert ok(dsn, "schedules", "list").startswith("no periodic schedules")
    sql.execute("INSERT INTO notifyq.periodic_schedule (name, job_type, cron, tz) "
                "VALUES (%s, 'sched.office', '*/15 9-17 * * MON-FRI', 'Europe/Berlin')",
                (OFFICE,))
    text = ok(dsn, "schedules", "list")
    assert "cron */15 9-17 * * MON-FRI Europe/Berlin" in text
    assert "active" in text
    [row] = json.loads(ok(dsn, "schedules", "list", "--json"))
    assert (row["name"], row["tz"], row["paused"]) == (OFFICE, "Europe/Berlin", False)
    assert row["next_tick_at"] is not None
    assert "no periodic schedule named 'nope'" in fails(dsn, "schedules", "pause", "nope")
    assert "no periodic schedule named 'nope'" in fails(dsn, "schedules", "resume", "nope")
    paused = json.loads(ok(dsn, "schedules", "pause", OFFICE, "--json"))
    assert paused["name"] == OFFICE
    assert "paused since" in ok(dsn, "schedules", "list")


@pytest.mark.timeout(120)
def test_the_api_lists_pauses_and_resumes_schedules_by_name(dsn: str, sql: Conn,
                                                            logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--app", APP]) as served, served.client() as http:
        items = {s["name"]: s for s in http.get("/v1/schedules").json()["items"]}
        assert set(items) == {"fast", "minutely", OFFICE}
        office = items[OFFICE]
        assert (office["cron"], office["tz"], office["every_s"], office["paused"]) == (
            "*/15 9-17 * * MON-FRI", "Europe/Berlin", None, False)
        assert office["next_tick_at"] is not None
        assert items["fast"]["every_s"] == 0.2

        path = f"/v1/schedules/{quote(OFFICE, safe='')}"
        paused = http.post(f"{path}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["name"] == OFFICE
        assert scalar(sql, "SELECT paused_at IS NOT NULL FROM notifyq.periodic_schedule "
                           "WHERE name = %s", (OFFICE,)) is True
        listed = {s["name"]: s for s in http.get("/v1/schedules").json()["items"]}
        assert (listed[OFFICE]["paused"], listed[OFFICE]["next_tick_at"]) == (True, None)
        resumed = http.post(f"{path}/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["resumed_at"] is not None

        missing = http.post("/v1/schedules/nope/pause")
        assert missing.status_code == 404
        assert "no periodic schedule named 'nope'" in missing.json()["detail"]
        with served.client(READER) as reader:
            assert reader.post(f"{path}/pause").status_code == 403
            assert reader.get("/v1/schedules").status_code == 200


@pytest.mark.timeout(120)
def test_a_schedule_is_triggered_now_over_http_and_from_the_cli(dsn: str, sql: Conn,
                                                                 logs: Path) -> None:
    with Served(dsn, logs / "serve.log", args=["--app", APP]) as served, served.client() as http:
        path = f"/v1/schedules/{quote(OFFICE, safe='')}"
        assert http.post(f"{path}/pause").status_code == 200  # a trigger is deliberate: it runs
        last_tick = scalar(sql, "SELECT last_tick_at FROM notifyq.periodic_schedule "
                                "WHERE name = %s", (OFFICE,))
        triggered = http.post(f"{path}/trigger")
        assert triggered.status_code == 201, triggered.text
        assert triggered.json()["name"] == OFFICE
        run = sql.execute("SELECT job_type, input, trigger_source, trigger_ref, "
                          "run_at <= now() FROM notifyq.job_run WHERE id = %s",
                          (triggered.json()["run_id"],)).fetchone()
        assert run == ("sched.office", {}, "schedule", OFFICE, True)
        assert scalar(sql, "SELECT last_tick_at FROM notifyq.periodic_schedule WHERE name = %s",
                      (OFFICE,)) == last_tick  # outside the cadence: no tick claimed

        from_cli = ok(dsn, "schedules", "trigger", OFFICE).strip()
        assert scalar(sql, "SELECT trigger_ref FROM notifyq.job_run WHERE id = %s",
                      (from_cli,)) == OFFICE
        assert "no periodic schedule named 'nope'" in fails(dsn, "schedules", "trigger", "nope")
        assert http.post("/v1/schedules/nope/trigger").status_code == 404
        # A row an older notifyq registered has no input: refused, nothing enqueued.
        sql.execute("INSERT INTO notifyq.periodic_schedule (name, job_type, every_ms) "
                    "VALUES ('legacy', 'sched.fast', 60000)")
        before = scalar(sql, "SELECT count(*) FROM notifyq.job_run")
        legacy = http.post("/v1/schedules/legacy/trigger")
        assert legacy.status_code == 409
        assert "registered by an older notifyq" in legacy.json()["detail"]
        assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE trigger_ref = "
                           "'legacy'") == 0
        assert scalar(sql, "SELECT count(*) FROM notifyq.job_run") >= before
        with served.client(READER) as reader:
            assert reader.post(f"{path}/trigger").status_code == 403
