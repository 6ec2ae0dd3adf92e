"""The customer portal's named queries, run directly: links redeemed once, before they expire;
sessions found until they expire, deleted on sign-out; expired rows purged; a tenant's
messages and the endpoints of a tenant a message reached (the pages around them:
tests/ui/test_portal.py)."""

from __future__ import annotations

import hashlib
import threading
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from notifyq._db.queries import Queries
from tests.db.conftest import T0
from tests.db.test_webhook_queries import _send

Conn = psycopg.Connection[dict[str, Any]]


def _hash(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _link(db: Conn, q: Queries, code: str, *, ttl_s: float = 600, tenant: str = "acme") -> None:
    row = db.execute(q.portal_link_insert, {"code_hash": _hash(code), "tenant_id": tenant,
                                            "read_only": False, "ttl_s": ttl_s,
                                            "now": T0}).fetchone()
    assert row is not None
    assert (row["tenant_id"], row["expires_at"]) == (tenant, T0 + timedelta(seconds=ttl_s))


def _redeem(db: Conn, q: Queries, code: str, at: timedelta) -> list[dict[str, Any]]:
    return db.execute(q.portal_link_redeem, {"code_hash": _hash(code),
                                             "now": T0 + at}).fetchall()


def test_a_link_is_redeemed_once_before_it_expires(db: Conn, q: Queries) -> None:
    _link(db, q, "one")
    _link(db, q, "two", ttl_s=60)
    assert _redeem(db, q, "one", timedelta(seconds=599)) == [
        {"tenant_id": "acme", "read_only": False}]
    assert _redeem(db, q, "one", timedelta(seconds=600)) == []  # used
    assert _redeem(db, q, "two", timedelta(seconds=60)) == []  # expired at 60 s
    assert _redeem(db, q, "three", timedelta(0)) == []  # unknown


def test_two_concurrent_redeems_of_one_link_sign_in_one(db: Conn, db2: Conn,
                                                        q: Queries) -> None:
    _link(db, q, "race")
    won: list[int] = []
    with db2.transaction():
        assert len(_redeem(db2, q, "race", timedelta(0))) == 1  # holds the row lock
        other = threading.Thread(target=lambda: won.append(
            len(_redeem(db, q, "race", timedelta(0)))))
        other.start()
        other.join(0.3)
        assert other.is_alive()  # waits on the lock
    other.join(10)
    assert won == [0]  # then finds it used


def test_sessions_are_found_until_they_expire_and_deleted_on_sign_out(db: Conn,
                                                                      q: Queries) -> None:
    row = db.execute(q.portal_session_insert, {
        "cookie_hash": _hash("c"), "tenant_id": "acme", "read_only": True,
        "token_name": "acme-token", "session_s": 3600, "now": T0}).fetchone()
    assert row == {"tenant_id": "acme", "read_only": True, "token_name": "acme-token",
                   "expires_at": T0 + timedelta(hours=1)}

    def found(at: timedelta) -> list[dict[str, Any]]:
        return db.execute(q.portal_session_get, {"cookie_hash": _hash("c"),
                                                 "now": T0 + at}).fetchall()
    assert [r["tenant_id"] for r in found(timedelta(minutes=59))] == ["acme"]
    assert found(timedelta(hours=1)) == []
    assert db.execute(q.portal_session_delete, {"cookie_hash": _hash("c")}).fetchall() == [
        {"tenant_id": "acme"}]
    assert found(timedelta(0)) == []


def test_links_and_sessions_expired_a_day_ago_are_purged(db: Conn, q: Queries) -> None:
    _link(db, q, "old", ttl_s=60)
    db.execute(q.portal_session_insert, {"cookie_hash": _hash("s"), "tenant_id": "acme",
                                         "read_only": False, "token_name": None,
                                         "session_s": 60, "now": T0})
    day = T0 + timedelta(days=1)
    assert db.execute(q.portal_link_purge, {"now": day}).fetchone() == {"links": 0,
                                                                         "sessions": 0}
    assert db.execute(q.portal_link_purge, {"now": day + timedelta(minutes=2)}).fetchone() == {
        "links": 1, "sessions": 1}


def _tenant_endpoint(db: Conn, q: Queries, tenant: str | None) -> Any:
    row = db.execute(q.webhook_endpoint_insert, {
        "url": "https://hooks.example/x", "description": "", "event_types": None,
        "headers": Jsonb({}), "enabled": True, "now": T0, "tenant_id": tenant,
        "rate_limit": None}).fetchone()
    assert row is not None
    return row["id"]


def test_a_tenants_messages_are_those_with_a_delivery_to_its_endpoints(db: Conn,
                                                                        q: Queries) -> None:
    mine, also_mine = _tenant_endpoint(db, q, "a"), _tenant_endpoint(db, q, "a")
    theirs = _tenant_endpoint(db, q, "b")
    direct = _send(db, q, endpoint_id=mine)["message_id"]
    other = _send(db, q, endpoint_id=theirs)["message_id"]
    fanned = _send(db, q)["message_id"]  # reaches all three endpoints
    listed = db.execute(q.webhook_message_list_for_tenant, {
        "tenant_id": "a", "before": None, "limit": 10}).fetchall()
    assert [(r["id"], r["deliveries"]) for r in listed] == sorted(
        [(fanned, 2), (direct, 1)], reverse=True)
    assert other not in {r["id"] for r in listed}
    first = db.execute(q.webhook_message_list_for_tenant, {
        "tenant_id": "a", "before": None, "limit": 1}).fetchall()
    assert [r["id"] for r in first] == [max(direct, fanned)]
    rest = db.execute(q.webhook_message_list_for_tenant, {
        "tenant_id": "a", "before": first[0]["id"], "limit": 1}).fetchall()
    assert [r["id"] for r in rest] == [min(direct, fanned)]

    def reached(message: str, tenant: str) -> set[Any]:
        return {r["endpoint_id"] for r in db.execute(
            q.webhook_message_delivered_to_tenant, {"id": message, "tenant_id": tenant})}
    assert reached(fanned, "a") == {mine, also_mine}
    assert reached(direct, "a") == {mine}
    assert reached(other, "a") == set()
    assert reached(fanned, "b") == {theirs}
