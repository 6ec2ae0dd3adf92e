"""The announcer (leader-only): tells the operator what they must not learn from a customer.

Operator events (``operator_event`` rows, migration 0030) are recorded exactly once where they
are decided: an endpoint disabled or its circuit opened or closed by a trigger on the UPDATE
that flips it, a purge pass that deleted rows by the purger, and an endpoint failing for
``webhooks.failing_alert_after_s`` by this runner (once per failure streak, under a unique
key). Each pass then claims the events not emitted yet (``FOR UPDATE SKIP LOCKED``: a second
claimer, a leader that lost its lease, gets none of them) and, in that one transaction, sends
each to ``webhooks.operator_endpoint_id`` as an ordinary webhook message (``notifyq.<kind>``:
signed, retried, through the SSRF guard like any other). After the commit each is logged
(logger ``notifyq.operator``) and counted (:attr:`Announcer.observer`, the served
``notifyq_operator_events`` counter). A crash between the commit and the log loses the log line
of those events, never their webhook or their row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._settings import WebhookSettings

log = logging.getLogger("notifyq.operator")

EVENT_TYPE_PREFIX = "notifyq."
"""An event of kind ``endpoint.disabled`` is sent as a message of type
``notifyq.endpoint.disabled``."""
CLAIM_BATCH = 500
PRUNE_BATCH = 2000
_QUIET = {"endpoint.circuit_closed", "retention.purged"}
"""Logged at INFO; the others, which ask for someone to look, at WARNING."""


class Announcer:
    def __init__(self, db: AsyncConnectionPool[AsyncConn], queries: Queries, clock: Clock,
                 config: WebhookSettings) -> None:
        self._db = db
        self._q = queries
        self._clock = clock
        self.config = config
        self.observer: Callable[[str], None] | None = None
        """Called with each emitted event's kind (``notifyq serve`` counts them)."""

    async def run_once(self) -> dict[str, Any]:
        failing = await self._record_failing()
        emitted = sent = 0
        while True:
            events, delivered = await self._claim_and_send()
            for event in events:
                self._emit(event)
            emitted += len(events)
            sent += delivered
            if len(events) < CLAIM_BATCH:
                break
        return {"failing": failing, "emitted": emitted, "sent": sent,
                "pruned": await self._prune()}

    async def _record_failing(self) -> int:
        if not self.config.failing_alert_after_s:
            return 0
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.operator_event_record_failing, {
                "now": self._clock.db_now(), "after_s": self.config.failing_alert_after_s})
            return len(await cur.fetchall())

    async def _claim_and_send(self) -> tuple[list[dict[str, Any]], int]:
        """Claim a batch and send it to the operator's endpoint, in one transaction: the
        events come back emitted with their messages, or not at all."""
        target = self.config.operator_endpoint_id
        async with self._db.connection() as conn, conn.transaction():
            cur = await conn.execute(self._q.operator_event_claim, {
                "now": self._clock.db_now(), "limit": CLAIM_BATCH})
            events = await cur.fetchall()
            if not events or target is None:
                return events, 0
            cur = await conn.execute(self._q.webhook_message_send_many, {
                "event_types": [EVENT_TYPE_PREFIX + e["kind"] for e in events],
                "payloads": [json.dumps(payload(e), default=str) for e in events],
                "endpoint_ids": [target] * len(events),
                "idempotency_keys": [f"notifyq-operator-event-{e['id']}" for e in events]})
            sent = await cur.fetchall()
            await conn.execute(self._q.operator_event_sent, {
                "ids": [e["id"] for e in events], "message_ids": [s["message_id"] for s in sent]})
        delivered = sum(s["deliveries"] for s in sent)
        if delivered < len(events):
            log.warning("operator endpoint %s took %d of %d operator events: it does not "
                        "exist or is disabled (webhooks.operator_endpoint_id)", target,
                        delivered, len(events))
        return [{**e, "message_id": s["message_id"]} for e, s in zip(events, sent,
                                                                      strict=True)], delivered

    def _emit(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        about = (f"endpoint {event['endpoint_id']}" if event["endpoint_id"] is not None
                 else "retention")
        log.log(logging.INFO if kind in _QUIET else logging.WARNING,
                "operator event %s: %s %s", kind, about, _summary(event["detail"]),
                extra={"operator_event": kind, "event_id": event["id"],
                       "endpoint_id": None if event["endpoint_id"] is None
                       else str(event["endpoint_id"]),
                       "tenant_id": event["tenant_id"], "detail": event["detail"],
                       "message_id": event.get("message_id")})
        if self.observer is not None:
            self.observer(kind)

    async def _prune(self) -> int:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._q.operator_event_prune, {
                "now": self._clock.db_now(), "limit": PRUNE_BATCH,
                "retention_s": self.config.operator_events_retention_s})
            return cur.rowcount


def payload(event: dict[str, Any]) -> dict[str, Any]:
    """What the operator's endpoint receives for one event (no endpoint URL: it may carry a
    token)."""
    return {"id": event["id"], "type": EVENT_TYPE_PREFIX + event["kind"],
            "kind": event["kind"],
            "endpoint_id": None if event["endpoint_id"] is None else str(event["endpoint_id"]),
            "tenant_id": event["tenant_id"], "occurred_at": event["created_at"].isoformat(),
            "detail": event["detail"]}


def _summary(detail: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in sorted(detail.items())
                           if v is not None) + ")"
