"""Every dashboard route over real HTTP against a real ``notifyq serve``: sign-in and the
session cookie, read versus admin sessions, CSRF and cross-site refusals, problem pages for
bad and unknown ids, and that each page shows what the API's functions return."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import notifyq
from tests.integration.serving import ADMIN, READER, Served
from tests.support import enqueue_sql, scalar, wait_until
from tests.ui.dashboard import Dashboard
from tests.vault import keys_env

Conn = psycopg.Connection[Any]
UNKNOWN = "01900000-0000-7000-8000-000000000000"
PAGES = ["/ui/", "/ui/overview/panels", "/ui/overview/series.json", "/ui/runs", "/ui/runs/rows",
         "/ui/webhooks", "/ui/webhooks/messages", "/ui/keys", "/ui/keys/panel",
         "/ui/schedules"]


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    env = {**keys_env(1, active=1), "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8"}
    with Served(dsn, logs / "serve.log", env=env) as server:
        yield server


@pytest.fixture
def admin(served: Served) -> Iterator[Dashboard]:
    with Dashboard(served) as dashboard:
        assert dashboard.sign_in(ADMIN).status_code == 303
        yield dashboard


@pytest.fixture
def reader(served: Served) -> Iterator[Dashboard]:
    with Dashboard(served) as dashboard:
        assert dashboard.sign_in(READER).status_code == 303
        yield dashboard


def _failed_run(served: Served, sql: Conn) -> str:
    with served.client() as http:
        run = http.post("/v1/jobs", json={"job_type": "svc.fail"}).json()
    wait_until(lambda: _status_is(sql, run["id"], "failed"), timeout=15)
    return str(run["id"])


def _later(sql: Conn, n: int) -> list[str]:
    """``n`` runs of a type no worker handles, due tomorrow: they stay pending."""
    rows = sql.execute("SELECT notifyq.enqueue('ui.later', '{}', run_at => now() + interval "
                       "'1 day', allow_unknown_type => true) FROM generate_series(1, %s)", (n,))
    return [str(r[0]) for r in rows.fetchall()]


def _status_is(sql: Conn, run_id: str, status: str) -> None:
    assert scalar(sql, "SELECT status FROM notifyq.job_run WHERE id = %s", (run_id,)) == status


def test_every_page_sends_a_stranger_to_the_sign_in_form(served: Served) -> None:
    with Dashboard(served) as stranger:
        for path in PAGES:
            answer = stranger.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/ui/signin?next="), path
        assert stranger.get("/ui").status_code == 308
        htmx = stranger.get("/ui/runs/rows", headers={"HX-Request": "true"})
        assert (htmx.status_code, htmx.headers["hx-redirect"]) == (401, "/ui/signin")


def test_signing_in_sets_a_strict_httponly_cookie_that_holds_no_token(served: Served) -> None:
    with Dashboard(served) as dashboard:
        answer = dashboard.sign_in(ADMIN)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/runs"
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert "Path=/ui/" in cookie
        assert "Secure" not in cookie  # plain http on loopback; https sets it
        assert ADMIN not in cookie
        page = dashboard.get("/ui/")
        assert page.status_code == 200
        assert ADMIN not in page.text
        assert READER not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'self'")


def test_a_wrong_token_or_a_stale_sign_in_form_is_refused(served: Served) -> None:
    with Dashboard(served) as dashboard:
        wrong = dashboard.sign_in("not-the-token-at-all-0000")
        assert wrong.status_code == 401
        assert "not valid" in wrong.text
        assert "set-cookie" not in wrong.headers or "nq_session" not in wrong.headers["set-cookie"]
        forged = dashboard.http.post("/ui/signin", data={"pre": "guess", "token": ADMIN})
        assert forged.status_code == 403


def test_a_forged_or_tampered_session_cookie_is_no_session(served: Served) -> None:
    with Dashboard(served) as dashboard:
        dashboard.sign_in(READER)
        real = dashboard.http.cookies["nq_session"]
        version, name, issued, nonce, mac = real.split(".")
        admin_name = "YWRtaW4"  # base64url of "admin"
        for forged in (f"{version}.{admin_name}.{issued}.{nonce}.{mac}",
                       f"{version}.{name}.{int(issued) + 1}.{nonce}.{mac}", "v1.x.y.z.w"):
            dashboard.http.cookies.set("nq_session", forged, path="/ui/")
            assert dashboard.get("/ui/runs").status_code == 303, forged


def test_sign_in_never_redirects_to_another_site(served: Served) -> None:
    with Dashboard(served) as dashboard:
        form = dashboard.get("/ui/signin?next=//evil.example/x")
        assert 'name="next" value="/ui/"' in form.text


def test_a_read_session_sees_every_page_but_no_action(served: Served, sql: Conn,
                                                      reader: Dashboard) -> None:
    run_id = _failed_run(served, sql)
    for path in [*PAGES, f"/ui/runs/{run_id}"]:
        answer = reader.get(path)
        assert answer.status_code == 200, (path, answer.text[:500])
    detail = reader.get(f"/ui/runs/{run_id}").text
    assert "/retry" not in detail
    refused = reader.post(f"/ui/runs/{run_id}/retry")
    assert refused.status_code == 403
    assert "read scope only" in refused.text
    _status_is(sql, run_id, "failed")


def test_an_action_without_the_sessions_csrf_token_is_refused(served: Served, sql: Conn,
                                                              admin: Dashboard) -> None:
    run_id = _failed_run(served, sql)
    assert admin.post(f"/ui/runs/{run_id}/retry", csrf=False).status_code == 403
    assert admin.post(f"/ui/runs/{run_id}/retry", {"csrf": "x" * 43},
                      csrf=False).status_code == 403
    cross = admin.post(f"/ui/runs/{run_id}/retry", headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert "another site" in cross.text
    _status_is(sql, run_id, "failed")
    same = admin.post(f"/ui/runs/{run_id}/retry", headers={"Origin": admin.http.base_url
                                                          .__str__().rstrip("/")})
    assert same.status_code == 303
    assert same.headers["location"] == f"/ui/runs/{run_id}?done=retry"


def test_htmx_requests_carry_the_csrf_token_in_a_header(served: Served, sql: Conn,
                                                        admin: Dashboard) -> None:
    run_id = _failed_run(served, sql)
    answer = admin.http.post(f"/ui/runs/{run_id}/retry",
                             headers={"X-CSRF-Token": admin.csrf, "HX-Request": "true"})
    assert answer.status_code == 303


def test_a_run_page_shows_the_run_and_its_actions_act(served: Served, sql: Conn,
                                                     admin: Dashboard) -> None:
    run_id = _failed_run(served, sql)
    page = admin.get(f"/ui/runs/{run_id}").text
    assert "svc.fail" in page
    assert "ValueError" in page
    assert "no" in page
    assert f'action="/ui/runs/{run_id}/retry"' in page
    assert admin.post(f"/ui/runs/{run_id}/retry").status_code == 303
    wait_until(lambda: _status_is(sql, run_id, "failed"), timeout=15)
    again = admin.post(f"/ui/runs/{run_id}/cancel")
    assert again.status_code == 409
    assert "cannot cancel" in again.text


def test_bad_and_unknown_ids_get_problem_pages(admin: Dashboard) -> None:
    cases = {f"/ui/runs/{UNKNOWN}": 404, "/ui/runs/not-a-uuid": 422,
             f"/ui/webhooks/endpoints/{UNKNOWN}": 404, "/ui/webhooks/endpoints/nope": 422,
             "/ui/webhooks/messages/msg_nope": 404, "/ui/webhooks/messages/bad!id": 422,
             "/ui/runs?status=nonsense": 422, "/ui/runs?q=zz": 422,
             "/ui/runs?from=yesterday": 422, "/ui/nowhere": 404}
    for path, status in cases.items():
        answer = admin.get(path)
        assert answer.status_code == status, (path, answer.text[:300])
        assert answer.headers["content-type"].startswith("text/html"), path
        assert "<h1>" in answer.text
    assert admin.post(f"/ui/runs/{UNKNOWN}/retry").status_code == 404
    assert admin.post("/ui/runs/nope/retry").status_code == 422


def test_the_runs_list_filters_pages_and_finds_a_run_by_id(served: Served, sql: Conn,
                                                         admin: Dashboard) -> None:
    ids = _later(sql, 60)
    sql.execute("UPDATE notifyq.job_run SET tags = ARRAY['blue'] WHERE job_type = 'ui.later'")
    first = admin.get("/ui/runs?type=ui.later&tag=blue")
    shown = re.findall(r'name="id" value="([0-9a-f-]{36})"', first.text)
    assert len(shown) == 50
    assert set(shown) <= set(ids)
    cursor = re.search(r"cursor=([0-9a-f-]{36})", first.text)
    assert cursor is not None
    rest = admin.get(f"/ui/runs?type=ui.later&tag=blue&cursor={cursor[1]}").text
    assert len(re.findall(r'name="id" value="', rest)) == 10
    assert len(re.findall(r'name="id" value="', admin.get("/ui/runs?tag=red").text)) == 0
    jump = admin.get(f"/ui/runs?q={ids[3]}")
    assert jump.headers["location"] == f"/ui/runs/{ids[3]}"
    prefix = admin.get(f"/ui/runs?q={ids[3][:13]}").text
    assert ids[3] in prefix


def test_bulk_cancel_by_filter_counts_then_cancels_after_confirmation(
        served: Served, sql: Conn, admin: Dashboard) -> None:
    _later(sql, 7)
    form = {"action": "cancel", "target": "filter", "type": "ui.later"}
    confirm = admin.post("/ui/runs/bulk", form)
    assert confirm.status_code == 200
    assert "Cancel 7 runs?" in confirm.text
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE status = 'pending'") == 7
    done = admin.post("/ui/runs/bulk", {**form, "confirm": "yes"})
    assert done.status_code == 303
    assert "changed=7" in done.headers["location"]
    assert scalar(sql, "SELECT count(*) FROM notifyq.job_run WHERE status = 'canceled'") == 7
    banner = admin.get(done.headers["location"]).text
    assert "Canceled: 7 runs" in banner


def test_bulk_retry_of_ticked_runs_retries_only_those(served: Served, sql: Conn,
                                                     admin: Dashboard) -> None:
    first, second = _failed_run(served, sql), _failed_run(served, sql)
    confirm = admin.post("/ui/runs/bulk", {"action": "retry", "id": [first]})
    assert "Retry 1 run?" in confirm.text
    done = admin.post("/ui/runs/bulk", {"action": "retry", "id": [first], "confirm": "yes"})
    assert "changed=1" in done.headers["location"]
    assert scalar(sql, "SELECT attempts FROM notifyq.job_run WHERE id = %s", (second,)) == 1
    wait_until(lambda: _attempts(sql, first, 2), timeout=15)
    assert admin.post("/ui/runs/bulk", {"action": "retry"}).status_code == 422
    assert admin.post("/ui/runs/bulk", {"action": "explode", "id": [first]}).status_code == 422


def _attempts(sql: Conn, run_id: str, n: int) -> None:
    assert scalar(sql, "SELECT attempts FROM notifyq.job_run WHERE id = %s", (run_id,)) == n


def test_the_overview_shows_pools_leader_and_the_live_workers(served: Served, sql: Conn,
                                                                  admin: Dashboard) -> None:
    _failed_run(served, sql)
    _later(sql, 3)
    panels = wait_until(lambda: _leading(admin.get("/ui/overview/panels").text), timeout=10)
    worker = re.search(r'<td class="mono">([^<]+)</td><td>default[^<]*</td><td class="num">'
                       r'<a [^>]+>\d+</a></td><td class="num">(\d+)</td>', panels)
    assert worker is not None, panels
    assert scalar(sql, "SELECT concurrency FROM notifyq.worker WHERE id = %s",
                  (worker[1],)) == int(worker[2])
    row = re.search(r"<th scope=\"row\"><a href=\"/ui/runs\?pool=default\">default</a></th>"
                    r"(.*?)</tr>", panels, re.S)
    assert row is not None
    numbers = re.findall(r">([0-9,]+|—)<", row[1])
    assert numbers[-1] == "1"  # failed in the last hour
    series = admin.get("/ui/overview/series.json").json()
    assert len(series["t"]) == 60
    assert sum(series["failed"]) * 60 == pytest.approx(1)


def _leading(html: str) -> str:
    assert "leading" in html
    return html


def test_a_signal_sent_from_a_run_page_is_delivered(served: Served, sql: Conn,
                                                   admin: Dashboard) -> None:
    run_id = str(uuid.uuid4())
    answer = admin.post(f"/ui/runs/{run_id}/signal", {"token": "ui-test", "payload": '{"a": 1}'})
    assert answer.status_code == 303
    assert "woken=0" in answer.headers["location"]
    assert scalar(sql, "SELECT payload FROM notifyq.job_signal WHERE token = 'ui-test'") == {
        "a": 1}
    bad = admin.post(f"/ui/runs/{run_id}/signal", {"token": "t", "payload": "{nope"})
    assert bad.status_code == 422


def test_webhook_pages_show_health_and_act(served: Served, sql: Conn, admin: Dashboard,
                                          reader: Dashboard) -> None:
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook", "description": "the ops receiver"}).json()
        message = http.post("/v1/webhooks/messages", json={
            "event_type": "invoice.paid", "payload": {"id": 1}}).json()
    assert endpoint["secret"] not in reader.get(f"/ui/webhooks/endpoints/{endpoint['id']}").text
    wait_until(lambda: _attempted(sql), timeout=20)
    listing = admin.get("/ui/webhooks").text
    assert "the ops receiver" in listing
    assert "0.0 %" in listing
    page = admin.get(f"/ui/webhooks/messages/{message['id']}").text
    assert "connect" in page
    assert "invoice.paid" in page
    resent = admin.post(f"/ui/webhooks/messages/{message['id']}/resend",
                        {"endpoint_id": endpoint["id"]})
    assert resent.status_code == 303
    asked = admin.post(f"/ui/webhooks/endpoints/{endpoint['id']}/disable")
    assert "pending deliveries are canceled" in asked.text
    disabled = admin.post(f"/ui/webhooks/endpoints/{endpoint['id']}/disable", {"confirm": "yes"})
    assert disabled.status_code == 303
    assert "disabled" in admin.get(disabled.headers["location"]).text

    def announced() -> None:  # the leader's announcer, within its interval (5 s)
        events = admin.get("/ui/webhooks").text.split('id="operator-events"')[1]
        assert "endpoint.disabled" in events
        assert "cause: operator" in events
    wait_until(announced, timeout=20)
    rotated = admin.post(f"/ui/webhooks/endpoints/{endpoint['id']}/rotate")
    assert rotated.status_code == 303
    assert reader.get(rotated.headers["location"]).text.count("whsec_") == 0  # not theirs
    shown = admin.get(rotated.headers["location"])
    secret = re.search(r'id="new-secret">(whsec_[^<]+)<', shown.text)
    assert secret is not None
    assert shown.headers["cache-control"] == "no-store"
    assert secret[1] not in admin.get(rotated.headers["location"]).text
    assert secret[1] not in (served.log_path.read_text())
    assert reader.post(f"/ui/webhooks/endpoints/{endpoint['id']}/enable").status_code == 403


def test_a_message_whose_payload_was_dropped_says_so_and_cannot_be_resent(
        served: Served, sql: Conn, admin: Dashboard) -> None:
    with served.client() as http:
        http.post("/v1/webhooks/endpoints", json={"url": "http://127.0.0.1:9/hook"})
        message = http.post("/v1/webhooks/messages", json={
            "event_type": "invoice.paid", "payload": {"secret_number": 4417}}).json()
    wait_until(lambda: _attempted(sql), timeout=20)
    sql.execute("UPDATE notifyq.webhook_message SET body = '', payload_dropped_at = now()")
    page = admin.get(f"/ui/webhooks/messages/{message['id']}").text
    assert 'id="payload-dropped"' in page
    assert "4417" not in page
    assert ">Resend</button>" not in page
    assert "connect" in page  # the attempts are still listed
    refused = admin.post(f"/ui/webhooks/messages/{message['id']}/resend")
    assert refused.status_code == 409
    assert "its payload was dropped" in refused.text


def _attempted(sql: Conn) -> None:
    assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_attempt") >= 1


def test_the_keys_page_shows_versions_and_retire_answers_with_the_guard(
        served: Served, admin: Dashboard) -> None:
    with served.client() as http:
        http.post("/v1/webhooks/endpoints", json={"url": "http://127.0.0.1:9/hook"})
    page = admin.get("/ui/keys").text
    assert "<strong>active</strong>" in page
    assert 'value="100.0"' in page  # every row on the active version
    refused = admin.post("/ui/keys/1/retire")
    assert refused.status_code == 409
    assert "active version" in refused.text
    assert admin.post("/ui/keys/nope/retire").status_code == 422


def test_promote_on_the_keys_page_asks_first_and_names_the_processes_without_the_version(
        dsn: str, sql: Conn, logs: Path) -> None:
    """The served process holds versions 1 and 2, 1 active; a second process (its key holder
    row, written here) holds only 1."""
    env = {**keys_env(1, 2, active=1), "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8"}
    with Served(dsn, logs / "serve.log", env=env) as served, Dashboard(served) as admin, \
            Dashboard(served) as reader:
        assert admin.sign_in(ADMIN).status_code == 303
        assert reader.sign_in(READER).status_code == 303
        wait_until(lambda: _holders(sql, 1))  # the served process, at its first key check
        page = admin.get("/ui/keys").text
        assert 'action="/ui/keys/2/promote"' in page
        assert 'action="/ui/keys/2/promote"' not in reader.get("/ui/keys").text
        sql.execute("INSERT INTO notifyq.key_holder (id, role, host, pid, versions, "
                    "check_values, encrypts_with, interval_s, started_at, checked_at, "
                    "expires_at) SELECT 'web:42:abc', 'app', 'web', 42, ARRAY[1], "
                    "ARRAY[check_value], 1, 10, now(), now(), now() + interval '1 hour' "
                    "FROM notifyq.key_version WHERE version = 1")

        asked = admin.post("/ui/keys/2/promote")
        assert asked.status_code == 200, asked.text
        assert "do not hold version 2" not in asked.text
        assert "1 live process does not hold version 2" in asked.text
        assert "app web:42:abc (holds 1)" in asked.text
        refused = admin.post("/ui/keys/2/promote", {"confirm": "yes"})
        assert refused.status_code == 409
        assert "Key version 2 stays inactive" in refused.text
        assert scalar(sql, "SELECT version FROM notifyq.key_active") == 1

        sql.execute("DELETE FROM notifyq.key_holder WHERE id = 'web:42:abc'")  # it stopped
        ready = admin.post("/ui/keys/2/promote")
        assert "Every live process holds version 2" in ready.text
        assert admin.post("/ui/keys/2/promote", {"confirm": "yes"},
                          csrf=False).status_code == 403
        assert reader.post("/ui/keys/2/promote", {"confirm": "yes"}).status_code == 403
        assert scalar(sql, "SELECT version FROM notifyq.key_active") == 1
        done = admin.post("/ui/keys/2/promote", {"confirm": "yes"})
        assert (done.status_code, done.headers["location"]) == (303, "/ui/keys?done=promote")
        assert scalar(sql, "SELECT version FROM notifyq.key_active") == 2
        assert scalar(sql, "SELECT promoted_by FROM notifyq.key_active") == (
            "dashboard (token admin)")
        assert "Key version promoted" in admin.get("/ui/keys?done=promote").text
        assert admin.post("/ui/keys/nope/promote").status_code == 422


def _holders(sql: Conn, n: int) -> None:
    assert scalar(sql, "SELECT count(*) FROM notifyq.key_holder") == n


def test_the_schedules_page_lists_ticks_with_their_next_tick(served: Served, sql: Conn,
                                                             admin: Dashboard) -> None:
    run_id = enqueue_sql(sql, "svc.echo")[0]
    sql.execute("INSERT INTO notifyq.periodic_schedule (name, job_type, every_ms, last_tick_at, "
                "last_run_id) VALUES ('report.build@60000ms', 'report.build', 60000, now(), %s)",
                (run_id,))
    sql.execute("INSERT INTO notifyq.periodic_schedule (name, job_type, cron, tz, paused_at) "
                "VALUES ('digest', 'mail.digest', '0 9 * * MON-FRI', 'Europe/Berlin', now())")
    page = admin.get("/ui/schedules").text
    assert "report.build" in page
    assert "registered by another process" in page
    assert "60.0 s" in page
    assert "0 9 * * MON-FRI" in page
    assert "Europe/Berlin" in page
    assert "paused" in page


def test_the_dashboards_data_comes_from_the_api_routes_too(served: Served, sql: Conn) -> None:
    _failed_run(served, sql)
    with served.client(READER) as http:
        pools = http.get("/v1/stats/pools").json()["items"]
        assert pools[0]["pool"] == "default"
        assert pools[0]["failed_last_hour"] == 1
        assert len(http.get("/v1/stats/series?minutes=5").json()["items"]) == 5
        workers = http.get("/v1/workers").json()
        assert ["default" in w["pools"] for w in workers["items"]] == [True]
        assert workers["items"][0]["version"] == notifyq.__version__
        assert [r["name"] for r in workers["leaders"]] == ["maintenance"]
        assert http.get("/v1/schedules").json() == {"items": []}
        assert http.get("/v1/webhooks/health").json() == {"items": []}
        assert http.get("/v1/webhooks/messages").json()["items"] == []
        assert http.post("/v1/jobs/bulk", json={"action": "retry", "filter": {}}
                         ).status_code == 403
    with served.client() as http:
        count = http.post("/v1/jobs/bulk", json={"action": "retry", "dry_run": True,
                                                 "filter": {"job_type": "svc.fail"}})
        assert count.json() == {"action": "retry", "dry_run": True, "matched": 1,
                                "changed": None, "requested": None, "remaining": None,
                                "batches": None}
        done = http.post("/v1/jobs/bulk", json={"action": "retry",
                                                "filter": {"status": "failed"}}).json()
        assert done["changed"] == 1
        assert http.post("/v1/jobs/bulk", json={"action": "retry"}).status_code == 422


def test_the_static_assets_are_served_from_the_package(served: Served) -> None:
    assets = ("vendor/htmx/htmx.min.js", "vendor/uplot/uPlot.iife.min.js",
              "vendor/uplot/uPlot.min.css", "app.css", "app.js", "charts.js")
    with served.client(None) as http:
        for asset in assets:
            answer = http.get(f"/ui/static/{asset}")
            assert answer.status_code == 200, asset
            assert len(answer.content) > 500


def test_the_overview_pauses_and_resumes_a_pool_for_admins_only(served: Served, sql: Conn,
                                                                admin: Dashboard) -> None:
    _later(sql, 2)
    panels = admin.get("/ui/overview/panels").text
    assert 'action="/ui/pools/default/pause"' in panels
    asked = admin.post("/ui/pools/default/pause")
    assert (asked.status_code, "Pause pool default?" in asked.text) == (200, True)
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 0  # asked first
    assert admin.post("/ui/pools/default/pause", {"confirm": "yes"}).status_code == 303
    assert scalar(sql, "SELECT reason FROM notifyq.pause WHERE kind = 'pool' "
                       "AND name = 'default'") == "paused from the dashboard"
    panels = admin.get("/ui/overview/panels").text
    assert ">paused</span>" in panels
    assert 'action="/ui/pools/default/resume"' in panels
    assert admin.post("/ui/pools/Bad Pool/pause").status_code == 422
    assert admin.post("/ui/pools/default/pause", csrf=False).status_code == 403

    with Dashboard(served) as reader:
        assert reader.sign_in(READER).status_code == 303
        seen = reader.get("/ui/overview/panels").text
        assert ">paused</span>" in seen
        assert "/pools/default/resume" not in seen
        assert reader.post("/ui/pools/default/resume").status_code == 403
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 1

    assert admin.post("/ui/pools/default/resume").status_code == 303
    assert scalar(sql, "SELECT count(*) FROM notifyq.pause") == 0
    assert 'action="/ui/pools/default/pause"' in admin.get("/ui/overview/panels").text


def test_the_footer_and_the_first_line_serve_logs_show_the_version(served: Served,
                                                                   admin: Dashboard) -> None:
    for path in ("/ui/", "/ui/runs", "/ui/keys"):
        page = admin.get(path)
        assert f'<span id="version">{notifyq.__version__}</span>' in page.text, path
    first_line = served.log_path.read_text().splitlines()[0]
    assert f"notifyq {notifyq.__version__} serve starting" in first_line


def test_an_endpoints_rate_limit_is_shown_and_set_on_its_page(served: Served,
                                                               admin: Dashboard,
                                                               reader: Dashboard) -> None:
    with served.client() as http:
        endpoint = http.post("/v1/webhooks/endpoints", json={
            "url": "http://127.0.0.1:9/hook", "rate_limit": 4}).json()
    path = f"/ui/webhooks/endpoints/{endpoint['id']}"
    assert "at most 4 deliveries per second" in admin.get(path).text
    saved = admin.post(f"{path}/rate", {"rate_limit": "12"})
    assert saved.status_code == 303
    page = admin.get(saved.headers["location"]).text
    assert "Rate limit saved" in page
    assert "at most 12 deliveries per second" in page
    assert admin.post(f"{path}/rate", {"rate_limit": "fast"}).status_code == 422
    assert admin.post(f"{path}/rate", {"rate_limit": "0"}).status_code == 409
    assert reader.post(f"{path}/rate", {"rate_limit": ""}).status_code == 403
    unlimited = admin.post(f"{path}/rate", {"rate_limit": ""})
    assert "unlimited" in admin.get(unlimited.headers["location"]).text
    with served.client() as http:
        assert http.get(f"/v1/webhooks/endpoints/{endpoint['id']}").json()["rate_limit"] is None
