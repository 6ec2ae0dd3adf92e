"""The customer portal over real HTTP against a real ``notifyq serve``: sign-in by a minted link
(valid, expired, reused, tampered) and by a token limited to tenants, one tenant's endpoints and
messages with nothing of another's (every portal route, with another tenant's ids), CSRF and
cross-site refusals, read-only links, sign-out; and the event-type catalog on the dashboard."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import ADMIN, READER, Served
from tests.support import scalar
from tests.ui.dashboard import Dashboard
from tests.ui.portal import Customer, code_of, mint
from tests.vault import keys_env
from tests.webhooks.test_api_cli import _cli

Conn = psycopg.Connection[Any]
TENANT_A = "tenant-a-admin-token-0123456789"
TENANT_A_READ = "tenant-a-read-token-0123456789"
TENANT_AB = "tenant-ab-admin-token-0123456789"
TOKENS = [
    {"name": "tenant-a", "token": TENANT_A, "scopes": ["admin"], "tenants": ["a"]},
    {"name": "tenant-a-read", "token": TENANT_A_READ, "scopes": ["read"], "tenants": ["a"]},
    {"name": "tenant-ab", "token": TENANT_AB, "scopes": ["admin"], "tenants": ["a", "b"]},
]
URL = "https://example.com/hook"  # never called: the server runs no worker


@pytest.fixture
def served(dsn: str, logs: Path) -> Iterator[Served]:
    env = {"NOTIFYQ_API__TOKENS": json.dumps(TOKENS), **keys_env(1, active=1)}
    with Served(dsn, logs / "serve.log", env=env, args=["--no-worker"]) as server:
        yield server


def _link(served: Served, tenant: str, **fields: Any) -> str:
    answer = mint(served, tenant, **fields)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["url"])


def _endpoint(served: Served, tenant: str | None, **fields: Any) -> dict[str, Any]:
    with served.client() as http:
        answer = http.post("/v1/webhooks/endpoints", json={
            "url": URL, **({"tenant_id": tenant} if tenant else {}), **fields})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _send(served: Served, endpoint: dict[str, Any] | None, event_type: str = "order.paid",
          ) -> str:
    with served.client() as http:
        answer = http.post("/v1/webhooks/messages", json={
            "event_type": event_type, "payload": {"n": 1},
            **({"endpoint_id": endpoint["id"]} if endpoint else {})})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_a_minted_link_signs_its_tenant_in_once_and_leaves_no_secret_behind(
        served: Served, sql: Conn) -> None:
    mine, theirs = _endpoint(served, "a"), _endpoint(served, "b")
    answer = mint(served, "a", ttl_s=600)
    assert answer.status_code == 201, answer.text
    link = answer.json()
    assert link["url"].startswith(f"{served.url}/portal/link#")
    assert (link["tenant_id"], link["read_only"]) == ("a", False)
    code = code_of(link["url"])
    assert len(code) >= 40
    with Customer(served) as customer:
        page = customer.get("/portal/link")
        assert page.status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        assert page.headers["cache-control"] == "no-store"
        signed = customer.open_link(link["url"])
        assert signed.status_code == 303, signed.text
        assert signed.headers["location"] == "/portal/"
        cookie = signed.headers["set-cookie"]
        assert re.search(r"nq_portal=[^;]+; HttpOnly; Max-Age=7200; Path=/portal/; "
                         r"SameSite=strict", cookie, re.IGNORECASE), cookie
        home = customer.get("/portal/")
        assert home.status_code == 200
        assert mine["id"] in home.text
        assert theirs["id"] not in home.text
        session = customer.http.cookies["nq_portal"]
        for path in ("/portal/", f"/portal/endpoints/{mine['id']}", "/portal/messages"):
            text = customer.get(path).text
            assert code not in text
            assert session not in text
    assert scalar(sql, "SELECT used_at IS NOT NULL FROM notifyq.portal_link") is True
    # The database holds digests only: neither the code nor the cookie in clear.
    for table in ("portal_link", "portal_session"):
        dump = str(sql.execute(f"SELECT * FROM notifyq.{table}").fetchall())
        assert code not in dump
        assert session not in dump
    with Customer(served) as again:  # the same link, a second time: refused
        reused = again.open_link(link["url"])
        assert reused.status_code == 403
        assert "used already" in reused.text
        assert again.get("/portal/").status_code == 303  # off to sign in
    assert code not in served.log()


def test_an_expired_or_tampered_link_signs_nobody_in(served: Served, sql: Conn) -> None:
    expired = _link(served, "a", ttl_s=60)
    sql.execute("UPDATE notifyq.portal_link SET expires_at = now() - interval '1 second'")
    fresh = _link(served, "a")
    code = code_of(fresh)
    flipped = code[:-1] + ("A" if code[-1] != "A" else "B")
    for bad in (code_of(expired), flipped, code[:-4], code + "x", "", "x" * 300):
        with Customer(served) as customer:
            answer = customer.redeem(bad)
            assert answer.status_code == 403, (bad, answer.text)
            assert "nq_portal=" not in answer.headers.get("set-cookie", "")
            assert customer.get("/portal/").status_code == 303
    with Customer(served) as customer:  # tampering spent nothing: the real code still works
        assert customer.redeem(code).status_code == 303


def test_minting_needs_an_admin_token_and_a_tenant_token_mints_only_for_its_tenants(
        served: Served) -> None:
    assert mint(served, "a", token=READER).status_code == 403
    assert mint(served, "a", token="").status_code == 401
    no_tenant = mint(served, None)
    assert no_tenant.status_code == 422, no_tenant.text
    assert no_tenant.json()["field"] == "tenant_id"
    for ttl in (1, 86_401):
        assert mint(served, "a", ttl_s=ttl).status_code == 422
    assert mint(served, "b", token=TENANT_A).status_code == 403
    own = mint(served, None, token=TENANT_A)  # its only tenant
    assert own.status_code == 201, own.text
    assert own.json()["tenant_id"] == "a"
    assert mint(served, None, token=TENANT_AB).status_code == 422  # which of its two?
    assert mint(served, "b", token=TENANT_AB).json()["tenant_id"] == "b"


def test_a_tenant_token_signs_in_to_its_tenant_and_a_token_of_every_tenant_is_sent_away(
        served: Served) -> None:
    mine, theirs = _endpoint(served, "a"), _endpoint(served, "b")
    with Customer(served) as customer:
        refused = customer.sign_in(ADMIN)
        assert refused.status_code == 403
        assert "not limited to tenants" in refused.text
        assert ADMIN not in refused.text
    with Customer(served) as customer:
        assert customer.sign_in(TENANT_AB).status_code == 403  # several: name one
        assert customer.sign_in(TENANT_AB, "c").status_code == 403
        assert customer.sign_in(TENANT_AB, "b").status_code == 303
        page = customer.get("/portal/").text
        assert theirs["id"] in page
        assert mine["id"] not in page
    with Customer(served) as customer:
        assert customer.sign_in("not-a-token-of-this-server-at-all").status_code == 401
        assert customer.sign_in(TENANT_A).status_code == 303
        assert mine["id"] in customer.get("/portal/").text


def _endpoint_routes(endpoint: str) -> list[tuple[str, str, dict[str, str]]]:
    """Every portal route about an endpoint, for ``endpoint``."""
    since = {"since": "2026-01-01T00:00"}
    return [("GET", f"/portal/endpoints/{endpoint}", {}),
            ("GET", f"/portal/endpoints/{endpoint}?cursor=msg_0", {}),
            *[("POST", f"/portal/endpoints/{endpoint}/{action}", form) for action, form in (
                ("disable", {"confirm": "yes"}), ("disable", {}), ("enable", {}),
                ("rotate", {}), ("event-types", {"all_types": "yes"}), ("recover", since),
                ("replay", since), ("replay", {**since, "confirm": "yes"}), ("nope", {}))]]


def _message_routes(message: str, endpoint: str) -> list[tuple[str, str, dict[str, str]]]:
    """Every portal route about a message, for ``message`` (resent to ``endpoint``)."""
    return [("GET", f"/portal/messages/{message}", {}),
            ("POST", f"/portal/messages/{message}/resend", {"endpoint_id": endpoint})]


def _state(sql: Conn) -> list[Any]:
    return sql.execute("SELECT id, disabled_at, event_types, (SELECT count(*) FROM "
                       "notifyq.webhook_secret s WHERE s.endpoint_id = e.id), (SELECT count(*) "
                       "FROM notifyq.job_run) FROM notifyq.webhook_endpoint e ORDER BY id"
                       ).fetchall()


def test_a_tenant_meets_404_on_every_route_with_another_tenants_ids_and_changes_nothing(
        served: Served, sql: Conn) -> None:
    mine, nobodys = _endpoint(served, "a"), _endpoint(served, None)
    theirs = _endpoint(served, "b", url="https://example.com/theirs")
    mine_sent = _send(served, mine)
    their_sent, nobodys_sent = _send(served, theirs), _send(served, nobodys)
    before = _state(sql)
    requests = [*_endpoint_routes(theirs["id"]), *_endpoint_routes(nobodys["id"]),
                *_message_routes(their_sent, mine["id"]),
                *_message_routes(nobodys_sent, mine["id"]),
                # its own message, resent to another tenant's endpoint
                ("POST", f"/portal/messages/{mine_sent}/resend", {"endpoint_id": theirs["id"]})]
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        for method, path, form in requests:
            answer = (customer.get(path) if method == "GET" else customer.post(path, form))
            assert answer.status_code == 404, (method, path, answer.status_code)
            assert theirs["url"] not in answer.text
            assert "No such" in answer.text or "Nothing to resend" in answer.text, path
        listed = customer.get("/portal/messages").text
        assert mine_sent in listed
        assert their_sent not in listed
        assert nobodys_sent not in listed
        home = customer.get("/portal/").text
        assert theirs["id"] not in home
        assert nobodys["id"] not in home
        assert customer.get("/portal/endpoints/01900000-0000-7000-8000-000000000000"
                            ).status_code == 404
        assert customer.get("/portal/endpoints/not-a-uuid").status_code == 422
        assert customer.get(f"/portal/messages/{mine_sent}").status_code == 200
    assert _state(sql) == before


def test_a_message_sent_by_event_type_shows_only_this_tenants_deliveries(
        served: Served) -> None:
    mine, theirs = _endpoint(served, "a"), _endpoint(served, "b")
    fanned = _send(served, None)  # both endpoints subscribe to every type
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        assert fanned in customer.get("/portal/messages").text
        page = customer.get(f"/portal/messages/{fanned}")
        assert page.status_code == 200
        assert mine["id"] in page.text
        assert theirs["id"] not in page.text
        assert customer.post(f"/portal/messages/{fanned}/resend",
                             {"endpoint_id": theirs["id"]}).status_code == 404
        resent = customer.post(f"/portal/messages/{fanned}/resend",
                               {"endpoint_id": mine["id"]})
        assert resent.status_code == 303, resent.text


def test_posts_without_the_csrf_token_or_from_another_site_are_refused(
        served: Served, sql: Conn) -> None:
    mine = _endpoint(served, "a")
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        path = f"/portal/endpoints/{mine['id']}/disable"
        missing = customer.post(path, {"confirm": "yes"}, csrf=False)
        assert missing.status_code == 403
        wrong = customer.http.post(path, data={"confirm": "yes", "csrf": "x" * 64})
        assert wrong.status_code == 403
        cross = customer.post(path, {"confirm": "yes"},
                              headers={"Origin": "https://evil.example"})
        assert cross.status_code == 403
        added = customer.post("/portal/endpoints", {"url": URL}, csrf=False)
        assert added.status_code == 403
        assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_endpoint") == 1
        assert scalar(sql, "SELECT disabled_at FROM notifyq.webhook_endpoint") is None
        assert customer.post(path, {"confirm": "yes"}).status_code == 303  # with it: done
    assert scalar(sql, "SELECT disabled_reason FROM notifyq.webhook_endpoint") == (
        "disabled in the customer portal")
    with Customer(served) as victim:  # login CSRF: a link posted without the page's value
        forced = victim.http.post("/portal/link", data={"code": code_of(_link(served, "a"))})
        assert forced.status_code == 403
        victim.get("/portal/link")  # its own page's value is set, but another one is sent
        for pre in ("x" * 24, "\u00e9t\u00e9"):
            wrong = victim.http.post("/portal/link", data={"pre": pre, "code": "c"})
            assert wrong.status_code == 403, wrong.text


def test_a_customer_adds_an_endpoint_with_event_types_and_sees_its_secret_once(
        served: Served, sql: Conn) -> None:
    with served.client() as http:
        for name in ("invoice.paid", "invoice.voided"):
            assert http.put(f"/v1/webhooks/event-types/{name}", json={
                "description": f"{name} happened"}).status_code == 200
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        form = customer.get("/portal/endpoints/new").text
        assert "invoice.paid happened" in form
        unknown = customer.post("/portal/endpoints", {"url": URL, "all_types": "no",
                                                      "event_type": "nope.nope"})
        assert unknown.status_code == 422
        none = customer.post("/portal/endpoints", {"url": URL, "all_types": "no"})
        assert none.status_code == 422
        assert "at least one event type" in none.text
        bad_url = customer.post("/portal/endpoints", {"url": "ftp://x"})
        assert bad_url.status_code == 422
        added = customer.post("/portal/endpoints", {"url": URL, "all_types": "no",
                                                    "event_type": "invoice.paid"})
        assert added.status_code == 303, added.text
        page = customer.get(added.headers["location"]).text
        secret = re.search(r'id="new-secret">(whsec_[^<]+)<', page)
        assert secret is not None, page
        again = customer.get(added.headers["location"]).text
        assert secret[1] not in again
        assert 'id="secret-gone"' in again
    row = sql.execute("SELECT tenant_id, event_types FROM notifyq.webhook_endpoint").fetchone()
    assert row == ("a", ["invoice.paid"])


def test_a_read_only_link_shows_the_endpoints_and_refuses_every_change(
        served: Served, sql: Conn) -> None:
    mine = _endpoint(served, "a")
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a", read_only=True)).status_code == 303
        page = customer.get(f"/portal/endpoints/{mine['id']}").text
        assert "Rotate secret" not in page
        assert "read-only" in page
        assert customer.post(f"/portal/endpoints/{mine['id']}/rotate").status_code == 403
        assert customer.post("/portal/endpoints", {"url": URL}).status_code == 403
    assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_secret") == 1
    with Customer(served) as reader:  # a read token limited to the tenant: read-only too
        assert reader.sign_in(TENANT_A_READ).status_code == 303
        assert reader.post(f"/portal/endpoints/{mine['id']}/rotate").status_code == 403


def test_signing_out_ends_the_session_for_good(served: Served, sql: Conn) -> None:
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        cookie = customer.http.cookies["nq_portal"]
        assert customer.post("/portal/signout").status_code == 303
        assert scalar(sql, "SELECT count(*) FROM notifyq.portal_session") == 0
    with Customer(served) as replayed:
        replayed.http.cookies.set("nq_portal", cookie, path="/portal/")
        assert replayed.get("/portal/").status_code == 303


def test_the_dashboard_shows_the_event_type_catalog_with_descriptions_and_schemas(
        served: Served) -> None:
    with served.client() as http:
        http.put("/v1/webhooks/event-types/invoice.paid", json={
            "description": "an invoice was paid",
            "schema": {"type": "object", "required": ["invoice_id"]}})
    with Dashboard(served) as dashboard:
        assert dashboard.sign_in(ADMIN).status_code == 303
        assert 'href="/ui/webhooks/event-types"' in dashboard.get("/ui/webhooks").text
        page = dashboard.get("/ui/webhooks/event-types")
        assert page.status_code == 200
        assert "invoice.paid" in page.text
        assert "an invoice was paid" in page.text
        assert "&#34;invoice_id&#34;" in page.text or "&quot;invoice_id&quot;" in page.text
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        assert "an invoice was paid" in customer.get("/portal/event-types").text


def test_a_link_minted_on_the_command_line_opens_the_portal_once(served: Served,
                                                                  dsn: str) -> None:
    mine = _endpoint(served, "a")
    printed = _cli(dsn, "portal-link", "a", "--ttl-s", "120", "--url", served.url)
    assert printed.returncode == 0, printed.stderr
    url = printed.stdout.strip()
    assert url.startswith(f"{served.url}/portal/link#")
    assert "portal link for tenant 'a'" in printed.stderr
    with Customer(served) as customer:
        assert customer.open_link(url).status_code == 303
        assert mine["id"] in customer.get("/portal/").text
    with Customer(served) as customer:
        assert customer.open_link(url).status_code == 403
    as_json = _cli(dsn, "portal-link", "a", "--read-only", "--json")
    assert as_json.returncode == 0, as_json.stderr
    link = json.loads(as_json.stdout)
    assert (link["tenant_id"], link["read_only"]) == ("a", True)
    assert link["url"].startswith("http://127.0.0.1:8080/portal/link#")
    refused = _cli(dsn, "portal-link", "a", "--ttl-s", "5")
    assert refused.returncode != 0
    assert "ttl_s" in refused.stderr


def test_a_customer_changes_event_types_disables_enables_and_replays_what_was_missed(
        served: Served, sql: Conn) -> None:
    mine = _endpoint(served, "a")
    path = f"/portal/endpoints/{mine['id']}"
    since = sql.execute("SELECT to_char(now() at time zone 'UTC' - interval '1 hour', "
                        "'YYYY-MM-DD\"T\"HH24:MI')").fetchone()
    assert since is not None
    with Customer(served) as customer:
        assert customer.open_link(_link(served, "a")).status_code == 303
        typed = customer.post(f"{path}/event-types", {"all_types": "no",
                                                      "event_type": "order.paid, order.sent"})
        assert typed.status_code == 303, typed.text
        assert "Event types saved" in customer.get(typed.headers["location"]).text
        assert scalar(sql, "SELECT event_types FROM notifyq.webhook_endpoint") == [
            "order.paid", "order.sent"]
        asked = customer.post(f"{path}/disable")
        assert asked.status_code == 200
        assert "pending deliveries are canceled" in asked.text
        assert scalar(sql, "SELECT disabled_at FROM notifyq.webhook_endpoint") is None
        assert customer.post(f"{path}/disable", {"confirm": "yes"}).status_code == 303
        missed = _send(served, None)  # order.paid by event type, while it is disabled
        assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_delivery") == 0
        assert customer.post(f"{path}/enable").status_code == 303
        counted = customer.post(f"{path}/replay", {"since": since[0]})
        assert counted.status_code == 200, counted.text
        assert "It never got 1 message(s)" in counted.text
        assert scalar(sql, "SELECT count(*) FROM notifyq.webhook_delivery") == 0
        replayed = customer.post(f"{path}/replay", {"since": since[0], "confirm": "yes"})
        assert replayed.status_code == 303, replayed.text
        assert "changed=1" in replayed.headers["location"]
        assert scalar(sql, "SELECT message_id FROM notifyq.webhook_delivery") == missed
        recovered = customer.post(f"{path}/recover", {"since": since[0]})
        assert "changed=0" in recovered.headers["location"]  # nothing failed
        assert customer.post(f"{path}/recover", {"since": "yesterday"}).status_code == 422
        assert missed in customer.get(path).text


def test_a_stranger_posts_at_most_a_sign_in_form_and_a_forged_cookie_signs_nothing_in(
        served: Served) -> None:
    big = {"url": URL, "description": "x" * 10_000}
    with Customer(served) as stranger:
        assert stranger.post("/portal/endpoints", big, csrf=False).status_code == 413
        assert stranger.post("/portal/link", {"code": "x" * 5000}, csrf=False
                             ).status_code == 413
        stranger.http.cookies.set("nq_portal", "forged-" + "x" * 40, path="/portal/")
        answer = stranger.post("/portal/endpoints", big, csrf=False)
        assert answer.status_code == 401  # read, then refused: no such session
        assert "Signed out" in answer.text
        assert stranger.get("/portal/").status_code == 303
