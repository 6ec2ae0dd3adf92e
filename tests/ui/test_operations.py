"""The dashboard in a real headless Chromium against a real ``notifyq serve``: what the overview
counts and what its links list, the workers' running runs, durable runs' waits, and the
operator's actions (replay, delete, reschedule, pause a job type, schedules)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from tests.integration.serving import ADMIN, READER, Served
from tests.support import scalar, spawn_worker, stop, wait_until
from tests.ui.dashboard import Dashboard
from tests.ui.test_browser import LIVE_S, _page, _shot, _sign_in, served

Conn = psycopg.Connection[Any]
WORKER_APP = "tests.apps.operations:app"
__all__ = ["served"]  # the fixture, shared with test_browser

pytestmark = pytest.mark.timeout(180)

# Runs of a pool no worker serves, in every state the overview counts (and some it does not).
PARKED = """
INSERT INTO notifyq.job_run (job_type, input, pool, status, run_at, leased_by,
                             lease_expires_at, finished_at)
SELECT 'ui.flaky', '{}', 'parked', s.status, now() + s.run_in, s.leased_by,
       now() + interval '1 hour', now() + s.finished_in
FROM (VALUES ('pending', interval '-1 minute', NULL, NULL::interval),
             ('pending', interval '-2 hours', NULL, NULL),
             ('pending', interval '-1 second', NULL, NULL),
             ('pending', interval '1 hour', NULL, NULL),
             ('pending', interval '2 days', NULL, NULL),
             ('running', interval '-1 minute', 'elsewhere', NULL),
             ('running', interval '-1 minute', 'elsewhere', NULL),
             ('waiting', interval '900 years', NULL, NULL),
             ('failed', interval '-1 hour', NULL, interval '-10 minutes'),
             ('failed', interval '-1 hour', NULL, interval '-20 minutes'),
             ('timed_out', interval '-1 hour', NULL, interval '-5 minutes'),
             ('failed', interval '-3 hours', NULL, interval '-2 hours'),
             ('timed_out', interval '-3 hours', NULL, interval '-90 minutes'),
             ('canceled', interval '-1 hour', NULL, interval '-1 minute'),
             ('completed', interval '-1 hour', NULL, interval '-1 minute'))
     AS s(status, run_in, leased_by, finished_in)
"""
COUNTED = {  # each overview column: the runs it counts, in SQL
    "Runnable": "status = 'pending' AND run_at <= now()",
    "Scheduled": "status = 'pending' AND run_at > now()",
    "Running": "status = 'running'",
    "Waiting": "status = 'waiting'",
    "Failed (1 h)": "status IN ('failed', 'timed_out') "
                    "AND finished_at >= now() - interval '1 hour'",
}


def _listed(page: Any) -> int:
    return int(page.locator("tbody#rows tr:has(a[href*='/ui/runs/'])").count())


def test_every_overview_number_links_to_exactly_the_runs_it_counts(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    sql.execute(PARKED)
    page = _page(browser, served)
    _sign_in(page)
    headers = page.locator("#panels table").first.locator("thead th").all_inner_texts()
    for column, where in COUNTED.items():
        page.goto("/ui/")
        cell = page.locator("#panels tr", has=page.locator("th", has_text="parked")).locator(
            "th, td").nth(headers.index(column))
        shown = int(cell.inner_text())
        assert shown == scalar(sql, f"SELECT count(*) FROM notifyq.job_run "
                                    f"WHERE pool = 'parked' AND {where}"), column
        cell.get_by_role("link").click()
        page.wait_for_url("**/ui/runs?**")
        assert _listed(page) == shown, (column, page.url)
    _shot(page, screenshots, "runs-failed-last-hour")


def test_the_workers_running_column_counts_the_runs_a_worker_holds_now(
        browser: Any, served: Served, dsn: str, sql: Conn, tmp_path: Path) -> None:
    # Heartbeats every 5 minutes: the registry's snapshot of what runs is that old (before, the
    # column showed it), while the runs below start and finish within a second or two.
    slow_beat = {"NOTIFYQ_WORKER__LEASE_S": "900",
                 "NOTIFYQ_WORKER__HEARTBEAT_INTERVAL_S": "300"}
    worker = spawn_worker(dsn, WORKER_APP, concurrency=5,
                          extra_env=slow_beat)
    try:
        page = _page(browser, served)
        _sign_in(page)
        row = page.locator("#panels tr", has=page.locator("td", has_text="gated"))
        row.wait_for(timeout=LIVE_S)  # registered
        gate = tmp_path / "open"
        with served.client() as http:
            for _ in range(3):
                http.post("/v1/jobs", json={"job_type": "ui.gate", "input": {"gate": str(gate)}})
        wait_until(lambda: _running(sql, 3), timeout=10)
        running = row.locator("td.num").first
        running.get_by_text("3", exact=True).wait_for(timeout=5_000)  # the next refresh
        running.get_by_role("link").click()
        page.wait_for_url("**/ui/runs?**")
        assert _listed(page) == 3
        page.goto("/ui/")
        gate.touch()
        wait_until(lambda: _running(sql, 0), timeout=10)
        running.get_by_text("0", exact=True).wait_for(timeout=5_000)
    finally:
        stop(worker)


def _running(sql: Conn, n: int) -> None:
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE status = 'running' "
                       "AND pool = 'gated'") == n


def test_durable_waits_show_what_they_wait_for_and_charts_read_utc(
        browser: Any, served: Served, dsn: str, sql: Conn) -> None:
    worker = spawn_worker(dsn, WORKER_APP, concurrency=5)
    try:
        wait_until(lambda: _registered(sql), timeout=30)
        with served.client() as http:
            nap = http.post("/v1/jobs", json={"job_type": "ui.nap"}).json()["id"]
            approval = http.post("/v1/jobs", json={"job_type": "ui.approval"}).json()["id"]
        wait_until(lambda: _waiting(sql, nap, approval), timeout=30)
    finally:
        stop(worker)
    until = scalar(sql, "SELECT run_at FROM notifyq.job_run WHERE id = %s", (nap,))
    page = _page(browser, served)
    _sign_in(page)
    page.goto(f"/ui/runs/{nap}")
    sleep = page.locator(".timeline li", has_text="sleep:1")
    assert sleep.locator(".badge").inner_text() == "sleeping"
    assert "until in 5" in sleep.inner_text()  # 59 or 58 min
    assert f"({until:%Y-%m-%d %H:%M:%S} UTC)" in sleep.inner_text()
    assert page.locator("#attempts").inner_text().startswith("in attempt 1 of 3")
    page.goto(f"/ui/runs/{approval}")
    signal = page.locator(".timeline li", has_text="signal:")
    assert signal.locator(".badge").inner_text() == "waiting"
    assert f"for signal approve:{approval} since" in signal.inner_text()
    # The charts' times are UTC whatever the browser's time zone (UTC+14 here).
    far_east = browser.new_context(base_url=served.url, timezone_id="Pacific/Kiritimati",
                                   viewport={"width": 1280, "height": 900}).new_page()
    _sign_in(far_east)
    chart = far_east.locator(".chart").first
    chart.locator("canvas").wait_for(timeout=LIVE_S)
    box = chart.locator(".u-over").bounding_box()
    far_east.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    shown = chart.locator(".u-legend .u-series").first.locator(".u-value").inner_text()
    minute = datetime.strptime(shown, "%Y-%m-%d %H:%M UTC").replace(tzinfo=UTC)
    assert abs(datetime.now(UTC) - minute) < timedelta(minutes=5), shown


def _registered(sql: Conn) -> None:
    assert scalar(sql, "SELECT count(*) FROM notifyq.worker WHERE 'gated' = ANY (pools)") == 1


def _waiting(sql: Conn, *ids: str) -> None:
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE status = 'waiting' "
                       "AND id = ANY (%s::uuid[])", (list(ids),)) == len(ids)


def test_an_admin_replays_deletes_reschedules_pauses_a_type_and_a_schedule(
        browser: Any, served: Served, dsn: str, sql: Conn, screenshots: Path) -> None:
    worker = spawn_worker(dsn, WORKER_APP, concurrency=5)
    try:
        wait_until(lambda: _registered(sql), timeout=30)
        with served.client() as http:
            run = http.post("/v1/jobs", json={"job_type": "ui.steps"}).json()["id"]
            later = http.post("/v1/jobs", json={"job_type": "ui.flaky", "pool": "parked",
                                                "run_at": "2099-01-01T00:00:00Z"}).json()["id"]
        wait_until(lambda: _status(sql, run, "completed", attempts=1), timeout=30)
        page = _page(browser, served)
        _sign_in(page)
        page.goto(f"/ui/runs/{run}")
        _shot(page, screenshots, "run-actions")
        page.get_by_label("Replay from").select_option("second")
        page.get_by_role("button", name="Replay…").click()
        assert page.locator("h1").inner_text() == "Replay this run from step second?"
        page.get_by_role("button", name="Replay from second").click()
        page.locator("p.notice", has_text="Replaying from the step").wait_for()
        wait_until(lambda: _status(sql, run, "completed", attempts=2), timeout=30)

        page.get_by_role("button", name="Pause type ui.steps…").click()
        page.get_by_role("button", name="Pause ui.steps").click()
        page.locator("#type-paused", has_text="paused since").wait_for()
        assert scalar(sql, "SELECT name FROM notifyq.pause WHERE kind = 'type'") == "ui.steps"
        page.get_by_role("button", name="Resume type ui.steps").click()
        page.locator("p.notice", has_text="Job type resumed").wait_for()
        assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 0

        page.get_by_role("button", name="Delete…").click()
        _shot(page, screenshots, "run-delete-confirm")
        page.get_by_role("button", name="Delete the run").click()
        page.locator("p.notice", has_text="Deleted: 1 run").wait_for()
        assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE id = %s", (run,)) == 0
    finally:
        stop(worker)
    page.goto(f"/ui/runs/{later}")
    page.get_by_label("Run at (UTC)").fill("2030-01-02T03:04:05")
    page.get_by_role("button", name="Reschedule").click()
    page.locator("p.notice", has_text="Rescheduled").wait_for()
    assert scalar(sql, "SELECT run_at FROM notifyq.job_run WHERE id = %s", (later,)) == (
        datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))

    page.goto("/ui/schedules")
    report = page.locator("tr", has_text="ui.report")
    report.get_by_role("button", name="Pause").click()
    report.get_by_text("paused since").wait_for()
    report.get_by_role("button", name="Resume").click()
    page.locator("p.notice", has_text="Schedule resumed").wait_for()
    assert "active" in report.inner_text()
    triggered = ("SELECT count(*) FROM notifyq.job_run WHERE job_type = 'ui.report' "
                 "AND trigger_source = 'schedule'")  # its ticks and its triggers
    runs = scalar(sql, triggered)
    report.get_by_role("button", name="Trigger now").click()
    page.locator("p.notice", has_text="Schedule triggered").wait_for()
    assert scalar(sql, triggered) == runs + 1


def test_a_read_only_session_sees_no_run_or_schedule_actions_and_cannot_post_them(
        browser: Any, served: Served, sql: Conn) -> None:
    sql.execute(PARKED)
    done = scalar(sql, "SELECT id FROM notifyq.job_run WHERE status = 'completed'")
    pending = scalar(sql, "SELECT id FROM notifyq.job_run WHERE status = 'pending' LIMIT 1")
    page = _page(browser, served)
    _sign_in(page, READER)
    for run in (done, pending):
        page.goto(f"/ui/runs/{run}")
        assert page.locator("main form").count() == 0, run
    page.goto("/ui/schedules")
    assert "ui.report" in page.locator("table").inner_text()
    assert page.locator("main form").count() == 0
    with Dashboard(served) as reader:
        reader.sign_in(READER)
        for path in (f"/ui/runs/{done}/delete", f"/ui/runs/{done}/replay",
                     f"/ui/runs/{pending}/reschedule", f"/ui/runs/{done}/pause_type",
                     "/ui/schedules/ui.report/pause", "/ui/schedules/ui.report/trigger"):
            answer = reader.post(path, {"confirm": "yes", "from_step": "x",
                                        "run_at": "2030-01-01T00:00"})
            assert answer.status_code == 403, (path, answer.status_code)
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE id = %s", (done,)) == 1
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 0
    assert scalar(sql, "SELECT count(*) FROM notifyq.periodic_schedule WHERE paused_at "
                       "IS NOT NULL") == 0


def _status(sql: Conn, run: str, status: str, *, attempts: int) -> None:
    row = sql.execute("SELECT status, attempts FROM notifyq.job_run WHERE id = %s",
                      (run,)).fetchone()
    assert row == (status, attempts), row


def test_run_actions_refuse_what_the_run_cannot_do_with_a_problem_page(
        served: Served, sql: Conn) -> None:
    sql.execute(PARKED)
    done = scalar(sql, "SELECT id FROM notifyq.job_run WHERE status = 'completed'")
    # Of the pool no worker serves: the served app's own schedule may have a pending tick that
    # its worker completes meanwhile (then deletable, and the refusal below would not come).
    pending = scalar(sql, "SELECT id FROM notifyq.job_run WHERE status = 'pending' "
                          "AND pool = 'parked' LIMIT 1")
    with Dashboard(served) as admin:
        admin.sign_in(ADMIN)
        refused = {
            (f"/ui/runs/{pending}/delete", "yes"): 409,  # cancel it first
            (f"/ui/runs/{done}/replay", "yes"): 409,  # it recorded no steps
            (f"/ui/runs/{done}/reschedule", ""): 409,  # only pending runs
            (f"/ui/runs/{uuid4()}/delete", "yes"): 404,
        }
        for (path, confirm), status in refused.items():
            answer = admin.post(path, {"confirm": confirm, "from_step": "x",
                                       "run_at": "2030-01-01T00:00"})
            assert answer.status_code == status, (path, answer.text[:500])
        bad_time = admin.post(f"/ui/runs/{pending}/reschedule", {"run_at": "tomorrow"})
        assert bad_time.status_code == 422
        assert "is not a date and time" in bad_time.text
        asked = admin.post(f"/ui/runs/{done}/delete")  # not confirmed: the question only
        assert "Delete this run?" in asked.text
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE id IN (%s, %s)",
                  (done, pending)) == 2
