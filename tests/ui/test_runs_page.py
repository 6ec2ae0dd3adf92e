"""The Runs page in a real headless Chromium against a real ``notifyq serve``: short ids that
tell the runs of a burst apart and find them again, the copy button, the state tabs with their
counts, the per-job-type view."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import ADMIN, Served
from tests.ui.dashboard import Dashboard
from tests.ui.test_browser import APP, LOOPBACK, _page, _shot, _sign_in
from tests.vault import keys_env

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    with Served(dsn, logs / "serve.log", args=["--app", APP],
                env={**keys_env(1, active=1), **LOOPBACK}) as server:
        yield server


def _burst(served: Served, n: int, **fields: Any) -> list[str]:
    """``n`` runs enqueued in one batch (ids made in one millisecond), due tomorrow."""
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    jobs = [{"job_type": "ui.child", "run_at": tomorrow, **fields} for _ in range(n)]
    with served.client() as http:
        answer = http.post("/v1/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 201, answer.text
    return [r["id"] for r in answer.json()["items"]]


def _listed(page: Any) -> list[str]:
    return [str(href).rsplit("/", 1)[-1]
            for href in page.locator("tbody#rows a.mono").evaluate_all(
                "links => links.map(a => a.getAttribute('href'))")]


def test_runs_of_a_burst_show_distinct_short_ids_that_find_them_and_copy_whole(
        browser: Any, served: Served, screenshots: Path) -> None:
    ids = _burst(served, 60)
    assert len({i[:13] for i in ids}) == 1  # the same time prefix: one millisecond
    page = _page(browser, served)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    _sign_in(page)
    page.goto("/ui/runs")
    shown = page.locator("tbody#rows a.mono").all_inner_texts()
    assert len(shown) == 50
    assert len(set(shown)) == 50, shown  # the newest 50 of the burst, each told apart
    picked = ids[17]
    short = page.locator(f'tbody#rows a[href="/ui/runs/{picked}"]').inner_text()
    page.get_by_label("Run id").fill(short)  # pasted as shown
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/ui/runs\?"))
    assert _listed(page) == [picked]
    page.get_by_label("Run id").fill(f"{picked[:8]}…{picked[-4:]}")  # as lists showed it before
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"/ui/runs\?"))
    assert _listed(page) == [picked]
    page.goto(f"/ui/runs/{short}")  # a run's address with the short id
    page.wait_for_url(f"**/ui/runs/{picked}")
    page.get_by_role("button", name=f"Copy id {picked}").click()
    page.locator("button.copy[data-copied]").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == picked
    _shot(page, screenshots, "run-copied")


def test_without_a_clipboard_the_copy_button_shows_the_whole_id_selected(
        browser: Any, served: Served) -> None:
    [run] = _burst(served, 1)
    page = _page(browser, served)
    page.add_init_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    _sign_in(page)
    page.goto("/ui/runs")
    page.get_by_role("button", name=f"Copy id {run}").click()
    field = page.get_by_label("Id to copy")
    assert field.input_value() == run
    assert page.evaluate("window.getSelection().toString() || "
                         "document.activeElement.value.substring("
                         "document.activeElement.selectionStart, "
                         "document.activeElement.selectionEnd)") == run


# Runs of pool "idle" (no worker serves it) in every state, made by SQL: what each tab counts.
SEED = """
SELECT notifyq.enqueue('seed.' || (g % 3), jsonb_build_object('g', g), pool => 'idle',
                       tags => ARRAY['t' || (g % 2)], tenant_id => 'acme',
                       run_at => now() + interval '1 day', allow_unknown_type => true)
FROM generate_series(1, 45) g
"""
STATES = """
UPDATE notifyq.job_run r SET
    status = (ARRAY['pending', 'pending', 'pending', 'running', 'waiting', 'failed', 'timed_out',
                    'completed', 'canceled'])[1 + made.g % 9],
    run_at = CASE WHEN made.g % 9 = 0 THEN now() - interval '1 min'
                  WHEN made.g % 9 = 4 THEN now() + interval '1 hour' ELSE r.run_at END,
    attempts = CASE WHEN made.g % 9 IN (0, 1) THEN 0 ELSE 1 END,
    error = CASE WHEN made.g % 9 IN (2, 5, 6) THEN jsonb_build_object('message', 'boom ' || made.g)
            END,
    lease_expires_at = CASE WHEN made.g % 9 = 3 THEN now() + interval '1 day' END,
    claimed_at = CASE WHEN made.g % 9 = 3 THEN now() END,
    wait_kind = CASE WHEN made.g % 9 = 4 THEN 'sleep' END,
    finished_at = CASE WHEN made.g % 9 >= 5 THEN now() - interval '1 min' END
FROM (SELECT id, (input->>'g')::int AS g FROM notifyq.job_run WHERE pool = 'idle') made
WHERE r.id = made.id
"""
# The states by definition, in SQL of their own (not the dashboard's query).
STATE_SQL = {
    "pending": "status = 'pending' AND run_at <= now()",
    "scheduled": "status = 'pending' AND run_at > now() AND attempts = 0",
    "retrying": "status = 'pending' AND run_at > now() AND attempts > 0",
    "running": "status = 'running'", "waiting": "status = 'waiting'",
    "failed": "status = 'failed'", "timed_out": "status = 'timed_out'",
    "completed": "status = 'completed'", "canceled": "status = 'canceled'",
}


def _seeded(sql: Conn) -> None:
    sql.execute(SEED)
    sql.execute(STATES)
    sql.execute("INSERT INTO notifyq.job_run (job_type, input, status, pool, priority, run_at, "
                "attempts, max_attempts) SELECT 'seed.0', '{}', 'pending', 'idle', 0, "
                "now() - interval '1 min', 0, 3")  # one more runnable, of no tenant


def _ids(sql: Conn, where: str) -> set[str]:
    rows = sql.execute(f"SELECT id::text FROM notifyq.job_run WHERE {where}")
    return {r[0] for r in rows.fetchall()}


def _tab_count(page: Any, state: str) -> int:
    return int(page.locator(f'nav.states a[data-state="{state}"] .count').inner_text()
               .replace(",", ""))


def test_state_tabs_count_what_sql_counts_and_list_exactly_those_runs(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    _seeded(sql)
    page = _page(browser, served)
    _sign_in(page)
    page.goto("/ui/runs?pool=idle")
    every = _ids(sql, "pool = 'idle'")
    assert _tab_count(page, "all") == len(every)  # the counts come after the list
    page.screenshot(path=str(screenshots / "runs-desktop.png"))  # docs/img/dashboard-runs.png
    assert page.locator('nav.states a[aria-current="page"]').get_attribute("data-state") == "all"
    assert page.locator("#matching").inner_text() == f"{len(every)} matching"
    for state, where in STATE_SQL.items():
        expected = _ids(sql, f"pool = 'idle' AND {where}")
        assert expected, state  # the seed has runs in every state
        assert _tab_count(page, state) == len(expected), state
    page.locator('nav.states a[data-state="retrying"]').click()
    page.wait_for_url(re.compile(r"status=retrying"))
    retrying = _ids(sql, f"pool = 'idle' AND {STATE_SQL['retrying']}")
    assert set(_listed(page)) == retrying
    assert page.locator("#matching").inner_text() == f"{len(retrying)} matching"
    assert page.get_by_label("Status").input_value() == "retrying"
    assert page.locator('nav.states a[aria-current="page"]').inner_text().startswith("retrying")
    row = page.locator("tbody#rows tr").first
    assert row.locator(".badge").inner_text() == "retrying"
    assert row.locator("td.last-error").inner_text().startswith("boom ")
    assert row.locator("td.next time").inner_text() == "in 23 h"  # its backoff
    assert "acme" in row.inner_text()
    assert row.locator(".tag").inner_text() in ("t0", "t1")
    _shot(page, screenshots, "runs-retrying")


def test_the_tabs_are_a_partition_and_tell_when_a_count_stops_at_its_cap(
        served: Served, sql: Conn, browser: Any) -> None:
    sql.execute("SELECT notifyq.enqueue('seed.many', '{}', pool => 'idle', "
                "allow_unknown_type => true) FROM generate_series(1, 10001)")
    page = _page(browser, served)
    _sign_in(page)
    page.goto("/ui/runs?pool=idle&status=pending")
    assert page.locator('nav.states a[data-state="pending"] .count').inner_text() == "10,000+"
    assert page.locator("#matching").inner_text().startswith("10,000 or more matching")


def test_the_counts_come_after_the_list_and_one_that_reads_too_long_is_not_known(
        served: Served, sql: Conn, dsn: str) -> None:
    _seeded(sql)
    with Dashboard(served) as dashboard:
        assert dashboard.sign_in(ADMIN).status_code == 303
        page = dashboard.get("/ui/runs?pool=idle")
        assert page.status_code == 200
        assert 'class="count' not in page.text  # the list does not wait for the counts
        assert 'hx-get="/ui/runs/counts?pool=idle"' in page.text
        counted = dashboard.get("/ui/runs/counts?pool=idle")
        assert re.search(r'data-state="all">all <span class="count">(\d+)</span>',
                         counted.text)
        assert "matching" in counted.text
        assert "Not counted" not in counted.text
        # Every run locked away: each count is stopped within its budget, not waited for.
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE notifyq.job_run IN ACCESS EXCLUSIVE MODE")
            stopped = dashboard.get("/ui/runs/counts?pool=idle")
    assert stopped.status_code == 200, stopped.text
    assert stopped.text.count('class="count unknown"') == len(STATE_SQL) + 1  # and "all"
    assert "Not counted" in stopped.text


def test_select_all_ticks_every_run_of_the_page_for_a_bulk_action(
        browser: Any, served: Served, sql: Conn) -> None:
    _seeded(sql)
    page = _page(browser, served)
    _sign_in(page)
    page.goto("/ui/runs?pool=idle&status=scheduled")
    boxes = page.locator('tbody#rows input[name="id"]')
    page.get_by_label("select every run on this page").check()
    ticked = boxes.count()
    assert ticked == len(_ids(sql, f"pool = 'idle' AND {STATE_SQL['scheduled']}"))
    assert all(boxes.nth(i).is_checked() for i in range(ticked))
    page.get_by_role("button", name="Cancel…").click()
    assert f"Cancel {ticked} runs?" in page.locator("main").inner_text()
    page.get_by_role("button", name=re.compile("^Cancel")).last.click()
    page.locator("p.notice").wait_for()
    assert _ids(sql, f"pool = 'idle' AND {STATE_SQL['scheduled']}") == set()


def test_known_job_types_and_pools_are_offered_as_choices(
        browser: Any, served: Served, sql: Conn) -> None:
    page = _page(browser, served)
    _sign_in(page)
    page.goto("/ui/runs")
    types = page.locator("#known-types option").evaluate_all("o => o.map(x => x.value)")
    pools = page.locator("#known-pools option").evaluate_all("o => o.map(x => x.value)")
    known = sql.execute("SELECT type, pool FROM notifyq.job ORDER BY type").fetchall()
    assert types == [t for t, _ in known]
    assert "ui.parent" in types
    assert pools == sorted({p for _, p in known})
    assert page.get_by_label("Type").get_attribute("list") == "known-types"
    assert page.get_by_label("Pool").get_attribute("list") == "known-pools"


def test_the_job_types_page_counts_what_sql_counts(
        browser: Any, served: Served, sql: Conn, screenshots: Path) -> None:
    _seeded(sql)
    page = _page(browser, served)
    _sign_in(page)
    page.get_by_role("navigation").get_by_role("link", name="Job types").click()
    page.wait_for_url(re.compile(r"/ui/types$"))
    for job_type in ("seed.0", "seed.1", "seed.2"):
        row = page.locator(f'#types tr[data-type="{job_type}"]')
        for state, where in STATE_SQL.items():
            if state in ("pending", "scheduled", "retrying", "running", "waiting"):
                n = len(_ids(sql, f"job_type = '{job_type}' AND {where}"))
                assert row.locator(f'td[data-state="{state}"]').inner_text() == str(n), state
        hour = "finished_at >= now() - interval '1 hour'"
        done = len(_ids(sql, f"job_type = '{job_type}' AND status = 'completed' AND {hour}"))
        failed = len(_ids(sql, f"job_type = '{job_type}' AND status IN ('failed', 'timed_out') "
                                f"AND {hour}"))
        assert row.locator('td[data-state="completed_last_hour"]').inner_text() == str(done)
        assert row.locator('td[data-state="failed_last_hour"]').inner_text() == str(failed)
        assert row.locator('td[data-state="per_minute"]').inner_text() == f"{done / 60:.1f}/min"
        assert row.locator('td[data-state="failure_rate"]').inner_text() == (
            f"{failed / (done + failed) * 100:.1f} %")
    assert page.locator('#types tr[data-type="ui.parent"]').count() == 1  # registered, idle
    _shot(page, screenshots, "job-types")
    page.locator('#types tr[data-type="seed.1"] td[data-state="retrying"] a').click()
    page.wait_for_url(re.compile(r"/ui/runs\?"))
    assert set(_listed(page)) == _ids(
        sql, f"job_type = 'seed.1' AND {STATE_SQL['retrying']}")
