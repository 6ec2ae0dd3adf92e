"""``webhook.deliver``: one attempt of one message to one endpoint, then the next step.

Input ``{"message_id", "endpoint_id"}`` (scheduled) or with ``"trigger": "manual"`` (a resend).
Each execution:

1. loads message, endpoint, delivery and the valid secrets' ciphertexts in one query (batched
   with the loads of concurrent deliveries, see :class:`~notifyq._db.batcher.Batcher`);
2. signs the stored body per Standard Webhooks v1 with every valid secret, with a fresh
   ``webhook-timestamp``;
3. POSTs it through the process's :class:`~notifyq._webhooks.client.WebhookClient` (SSRF guard,
   deadline, capped body);
4. records the attempt, the delivery's state and the endpoint's failure streak in one statement
   (batched with the records of concurrent deliveries);
5. decides (:func:`~notifyq._webhooks.schedule.decide`): success returns; a retry raises
   ``Snooze`` with the webhook schedule's delay (the generic backoff never decides); a delivery
   that is over raises ``Permanent``. 410 Gone, or failing longer than
   ``webhooks.disable_after_s``, disables the endpoint and stops its pending deliveries.

What cannot be sent at all (a URL or header the transport refuses, no valid secret, secrets
this process cannot decrypt) is an attempt too, of error kind ``invalid``, and ends the
delivery: no retry could fix it.

**Circuit breaker.** ``webhooks.breaker_failures`` failed attempts in a row open the endpoint's
circuit for ``webhooks.breaker_cooldown_s`` (kept in the endpoint's row by step 4, so every
worker obeys it). While it is open the endpoint's pending deliveries are parked (their runs wait
until it ends) rather than each taking a slot to time out, and a scheduled delivery that finds
it open anyway waits too, without a request or an attempt. After the cooldown the first
delivery is the probe (the others wait one attempt's time more): its success closes the
circuit, its failure opens it again. Manual resends are not held.

**Ordered endpoints** (``webhook_endpoint.ordered``, migration 0029): their key's limit is
pinned to 1, and a scheduled delivery of one that snoozes (a retry, or held by the circuit)
first keeps its place at the head of the endpoint's line (``webhook_delivery_keep_place``: its
run's ``key_head`` flag, migration 0039, which the keyed claim sorts first), so the claim holds
the later deliveries back until it is over, without moving their run_at or counting an attempt
of theirs.

**429 with Retry-After.** The whole endpoint waits until then (``webhook_endpoint_hold``: the
keyed claim passes its key over, migration 0028; its pending deliveries are parked), and the
attempt counts neither toward the failure streak nor the breaker (recorded with ``succeeded``
NULL). An endpoint's ``rate_limit`` is kept by the claim alone.

A worker killed between the POST and step 4 leaves the run to the reaper; the retry sends the
same ``webhook-id`` again (receivers deduplicate on it), as Standard Webhooks expects.
"""

from __future__ import annotations

import hmac
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from notifyq._db.batcher import Batcher
from notifyq._db.pool import WarmConnection
from notifyq._errors import DecryptionFailed, Permanent, Snooze, WebhookNotFound
from notifyq._tracing import child_span, mark_error, webhook_attempt
from notifyq._webhooks.client import AttemptResult
from notifyq._webhooks.endpoints import RESERVED_HEADERS
from notifyq._webhooks.headers import unseal
from notifyq._webhooks.schedule import TOO_MANY_REQUESTS, Decision, decide, parse_retry_after
from notifyq._webhooks.shares import Shares
from notifyq._webhooks.signing import secret_key, signature_header, signer

if TYPE_CHECKING:
    from notifyq._context import JobContext
    from notifyq._crypto.keyring import Keyring
    from notifyq._db.pool import AsyncConn
    from notifyq._keys.columns import EncryptedColumn
    from notifyq._runtime import Runtime
    from notifyq._settings import WebhookSettings
    from notifyq._webhooks.client import WebhookClient
    from notifyq._webhooks.ssrf import Resolver

log = logging.getLogger("notifyq.webhooks")

USER_AGENT = "notifyq-webhooks/1"
_SIGNING_KEYS_KEPT = 4096
_RECORD_COLUMNS = {
    "message_id": "message_ids", "endpoint_id": "endpoint_ids", "run_id": "run_ids",
    "trigger": "triggers", "attempt": "attempts", "webhook_timestamp": "webhook_timestamps",
    "url": "urls", "status_code": "status_codes", "error_kind": "error_kinds",
    "error": "errors", "duration_ms": "durations_ms", "response_body": "response_bodies",
    "response_truncated": "response_truncated", "next_attempt_at": "next_attempt_ats",
    "delivery_status": "delivery_statuses", "counted": "counted", "succeeded": "succeeded"}
"""Each attempt's field -> the array parameter of ``webhook_attempt_record_many``."""
_SUCCEEDED_COLUMNS = {name: plural for name, plural in _RECORD_COLUMNS.items()
                      if name not in ("error_kind", "error", "next_attempt_at",
                                      "delivery_status", "succeeded")}
"""... and of ``webhook_attempt_record_succeeded``."""
_STATUS_AFTER = {"succeeded": "succeeded", "retry": "pending", "failed": "failed",
                 "gone": "failed"}
PROBE_MARGIN_S = 5.0
"""A half-open circuit's probe holds the others back one attempt's time (``timeout_s``) plus
this, for its load and record."""
_Streak = tuple[datetime | None, datetime | None]
"""After an attempt was recorded: since when its endpoint fails, until when its circuit is
open."""


class Deliverer:
    """The ``webhook.deliver`` handler (pool ``webhooks``), installed when webhooks are enabled.

    ``deliver(message_id, endpoint_id)`` is one attempt and what tests call directly; a
    ``resolver`` replaces DNS (tests), ``rng`` the jitter's randomness."""

    def __init__(self, runtime: Runtime, secret_column: EncryptedColumn,
                 header_column: EncryptedColumn, *, resolver: Resolver | None = None,
                 rng: random.Random | None = None) -> None:
        self._rt = runtime
        self._secret_column = secret_column
        self._header_column = header_column
        self._headers: dict[tuple[UUID, bytes], dict[str, str]] = {}
        self.resolver = resolver
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._client: WebhookClient | None = None
        self._signing_keys: dict[tuple[UUID, bytes], hmac.HMAC] = {}
        # Batching the two statements of every delivery with those of concurrent deliveries:
        # at 50 in flight to one endpoint, 586 -> 883 deliveries/s, the record's server time
        # 252 -> 125 us per attempt and the load's 89 -> 38 us (8,000 deliveries,
        # pg_stat_statements). At idle a statement still goes alone and at once.
        self._loads: Batcher[tuple[str, UUID], dict[str, Any] | None] = Batcher(
            self._load_many, split_on=(psycopg.DataError,))
        self._records: Batcher[dict[str, Any], _Streak] = Batcher(
            self._record_many, split_on=(psycopg.IntegrityError, psycopg.DataError,
                                         psycopg.errors.DeadlockDetected))
        # Successes, the common case, are recorded by a lighter statement of their own.
        self._successes: Batcher[dict[str, Any], _Streak] = Batcher(
            self._record_succeeded_many, split_on=(psycopg.IntegrityError, psycopg.DataError,
                                                   psycopg.errors.DeadlockDetected))
        self._prefetched: dict[tuple[str, UUID], Any] = {}
        # The loads and the records each on a connection of their own whose session plans
        # them once (webhook_delivery_session_plans); the pool's while one is in use or cannot
        # be opened. Not through a transaction pooler (``prepares`` False): a session setting
        # would stay on whichever server session ran it, for other clients.
        self._warm: dict[str, WarmConnection] = {}
        self._shares = Shares(runtime.settings.webhooks)
        self.observer: Callable[[str], None] | None = None
        """Called with each attempt's outcome (``2xx``..``5xx`` or the error kind)."""

    def client(self) -> WebhookClient:
        if self._client is None:
            from notifyq._webhooks.client import WebhookClient

            self._client = WebhookClient(self._rt.settings.webhooks, resolver=self.resolver)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
        warm, self._warm = self._warm, {}
        for conn in warm.values():
            await conn.close()

    @asynccontextmanager
    async def _connection(self, use: str) -> AsyncIterator[AsyncConn]:
        """The connection for the batched ``use`` (``load`` or ``record``)."""
        app = self._rt
        pool = await app.pool()
        if not app.prepares:
            async with pool.connection() as conn:
                yield conn
            return
        warm = self._warm.get(use)
        if warm is None:
            warm = self._warm[use] = WarmConnection(
                app.dsn(), application_name="notifyq-webhooks", configure=self._configure)
        async with warm.connection(pool) as conn:
            yield conn

    async def _configure(self, conn: AsyncConn) -> None:
        await conn.execute(self._rt.queries.webhook_delivery_session_plans)

    def prefetch(self, input: Any) -> None:
        """A claimed delivery: its load joins the next batch, with its claim's others."""
        key = _delivery_key(input)
        if key is not None and key not in self._prefetched:
            if len(self._prefetched) >= _SIGNING_KEYS_KEPT:  # never consumed: released runs
                self._prefetched.clear()
            self._prefetched[key] = self._loads.queue(key)

    async def handle(self, ctx: JobContext) -> dict[str, Any]:
        data = ctx.input if isinstance(ctx.input, dict) else {}
        message_id, endpoint_id = data.get("message_id"), data.get("endpoint_id")
        trigger = data.get("trigger", "scheduled")
        if not isinstance(message_id, str) or not isinstance(endpoint_id, str) or (
                trigger not in ("scheduled", "manual")):
            raise Permanent(ValueError("webhook.deliver input must be {message_id, "
                                       "endpoint_id[, trigger: scheduled|manual]}"))
        try:
            endpoint = UUID(endpoint_id)
        except ValueError:
            raise Permanent(ValueError(f"endpoint_id {endpoint_id!r} is not a UUID")) from None
        return await self.deliver(message_id, endpoint, trigger=trigger, run_id=ctx.run.id)

    async def deliver(self, message_id: str, endpoint_id: UUID, *, trigger: str = "scheduled",
                      run_id: UUID | None = None) -> dict[str, Any]:
        app = self._rt
        q = app.queries
        scheduled = trigger == "scheduled"
        now = app.clock.now()
        ticket = self._prefetched.pop((message_id, endpoint_id), None)
        row = await (self._loads.result(ticket) if ticket is not None
                     else self._loads.submit((message_id, endpoint_id)))
        if row is None:
            raise Permanent(WebhookNotFound(
                f"no delivery of message {message_id} to endpoint {endpoint_id}"))
        if run_id is not None and not await self._own_run(row, run_id, scheduled):
            raise Permanent(ValueError(
                f"run {run_id} is not notifyq's {trigger} delivery of message {message_id} to "
                f"endpoint {endpoint_id}: webhook.deliver runs are enqueued by webhooks' send, "
                "resend and recover only; refused"))
        skipped = self._skip_reason(row, scheduled)
        if skipped is not None:
            if scheduled:
                async with (await app.pool()).connection() as conn:
                    await conn.execute(q.webhook_delivery_skip, {
                        "message_id": message_id, "endpoint_id": endpoint_id,
                        "reason": skipped, "now": app.clock.db_now()})
            return {"skipped": skipped}
        try:
            return await self._attempt(row, trigger=trigger, run_id=run_id, now=now)
        except Snooze:
            if scheduled and run_id is not None and row["ordered"]:
                await self._keep_place(row["endpoint_id"], run_id)
            raise

    async def _attempt(self, row: dict[str, Any], *, trigger: str, run_id: UUID | None,
                       now: datetime) -> dict[str, Any]:
        app = self._rt
        scheduled = trigger == "scheduled"
        message_id, endpoint_id = row["message_id"], row["endpoint_id"]
        if scheduled and row["circuit_open_until"] is not None:
            await self._hold(row)
        keyring = await self._rt.checked_keyring()
        timestamp = int(now.timestamp())
        attempt = row["attempts"] + 1 if scheduled else row["attempts"]
        try:
            keys = self._keys(row, keyring)
            self._custom_headers(row, keyring)
        except DecryptionFailed as exc:
            # Retrying cannot make this process decrypt: say so in an attempt and stop, rather
            # than 100 silent retries (the message names the row and key version, never a key).
            keys, unreadable = [], f"cannot decrypt the endpoint's secrets here: {exc}"
        else:
            unreadable = f"endpoint {endpoint_id} has no valid signing secret: rotate its secret"
        if not keys:
            result = AttemptResult(0.0, error_kind="invalid", error=unreadable)
        else:
            with child_span("webhook attempt", {
                    "notifyq.webhook.endpoint_id": str(endpoint_id),
                    "notifyq.webhook.message_id": message_id, "notifyq.webhook.attempt": attempt,
                    "notifyq.webhook.trigger": trigger, "http.request.method": "POST"},
                    client=True) as span:
                result = await self._post(row, keyring, keys, timestamp)
                if span is not None:
                    _traced(span, result)
        outcome = (f"{result.status_code // 100}xx" if result.status_code is not None
                   else result.error_kind or "connect")
        webhook_attempt(outcome)
        if self.observer is not None:
            self.observer(outcome)
        decision = decide(result, attempt if scheduled else len(
            app.settings.webhooks.retry_schedule_s), app.settings.webhooks, now, self._rng)
        return await self._record(row, run_id=run_id, trigger=trigger, attempt=attempt,
                                  timestamp=timestamp, result=result, decision=decision)

    async def _keep_place(self, endpoint_id: UUID, run_id: UUID) -> None:
        """An ordered endpoint's delivery about to snooze stays the head of its line
        (webhook_delivery_keep_place): the endpoint's later messages wait for it, and are
        charged nothing for waiting."""
        app = self._rt
        async with (await app.pool()).connection() as conn:
            await conn.execute(app.queries.webhook_delivery_keep_place, {
                "run_id": run_id, "endpoint_id": endpoint_id, "now": app.clock.db_now()})

    async def _own_run(self, row: dict[str, Any], run_id: UUID, scheduled: bool) -> bool:
        """Whether ``run_id`` is a run notifyq enqueued for this delivery: a scheduled attempt
        is the delivery's own run (``send``, ``recover``); a manual one a ``resend`` of this
        message (its trigger_ref, and no tenant). The edges refuse built-in types
        (``BUILTIN_JOB_TYPES``); this holds against a run that got in another way."""
        if scheduled:
            return bool(row["run_id"] == run_id)
        app = self._rt
        async with (await app.pool()).connection() as conn:
            run = await (await conn.execute(app.queries.job_run_get, {"id": run_id})).fetchone()
        return run is not None and run["trigger_ref"] == row["message_id"] and (
            run["tenant_id"] is None)

    async def _post(self, row: dict[str, Any], keyring: Keyring, keys: list[hmac.HMAC],
                    timestamp: int) -> AttemptResult:
        message_id = row["message_id"]
        body = row["body"].encode()
        headers = {name: value for name, value in self._custom_headers(row, keyring).items()
                   if name.lower() not in RESERVED_HEADERS
                   and not name.lower().startswith("webhook-")}
        headers.update({"content-type": "application/json", "accept-encoding": "identity",
                        "user-agent": headers.get("user-agent", USER_AGENT),
                        "webhook-id": message_id, "webhook-timestamp": str(timestamp),
                        "webhook-signature": signature_header(keys, message_id, timestamp,
                                                              body)})
        return await self.client().post(row["url"], headers, body)

    async def _hold(self, row: dict[str, Any]) -> None:
        """Raises ``Snooze`` while the endpoint's circuit keeps this delivery back (open, or
        half-open with another delivery as the probe); returns when it may be sent."""
        app = self._rt
        probe_s = app.settings.webhooks.timeout_s + PROBE_MARGIN_S
        async with (await app.pool()).connection() as conn:
            state = await (await conn.execute(app.queries.webhook_endpoint_circuit_hold, {
                "endpoint_id": row["endpoint_id"], "probe_s": probe_s,
                "now": app.clock.db_now()})).fetchone()
        if state is None or state["open_until"] is None or state["probe"]:
            return
        wait = (state["open_until"] - app.clock.now()).total_seconds()
        if wait > 0:
            await self._park(row["endpoint_id"], state["open_until"])
        log.info("webhook %s to endpoint %s: circuit open; held %.1f s", row["message_id"],
                 row["endpoint_id"], wait if wait > 0 else probe_s)
        raise Snooze(wait if wait > 0 else probe_s)

    async def _hold_endpoint(self, endpoint_id: UUID, until: datetime) -> None:
        """The receiver answered 429 with Retry-After: no delivery to it starts before
        ``until``, on any worker (the claim passes its key over, migration 0028), and its
        pending ones wait until then (so the producers wake when it ends)."""
        app = self._rt
        async with (await app.pool()).connection() as conn:
            await conn.execute(app.queries.webhook_endpoint_hold, {
                "endpoint_id": endpoint_id, "until": until, "now": app.clock.db_now()})
        await self._park(endpoint_id, until)
        log.info("webhook endpoint %s answered 429: held until %s", endpoint_id,
                 until.isoformat())

    async def _park(self, endpoint_id: UUID, until: datetime) -> None:
        app = self._rt
        async with (await app.pool()).connection() as conn:
            await conn.execute(app.queries.webhook_delivery_park, {
                "endpoint_id": endpoint_id, "until": until, "now": app.clock.db_now()})

    async def _load_many(self, keys: list[tuple[str, UUID]]) -> list[dict[str, Any] | None]:
        app = self._rt
        async with self._connection("load") as conn:
            rows = await (await conn.execute(app.queries.webhook_delivery_load_many, {
                "message_ids": [m for m, _ in keys], "endpoint_ids": [e for _, e in keys],
                "now": app.clock.db_now()})).fetchall()
        found = {row["ord"]: row for row in rows}
        return [found.get(n) for n in range(1, len(keys) + 1)]

    async def _record_many(self, items: list[dict[str, Any]]) -> list[_Streak]:
        app = self._rt
        params: dict[str, Any] = {plural: [i[name] for i in items]
                                  for name, plural in _RECORD_COLUMNS.items()}
        params.update(now=app.clock.db_now(),
                      breaker_failures=app.settings.webhooks.breaker_failures,
                      breaker_cooldown_s=app.settings.webhooks.breaker_cooldown_s)
        changing = self._shares.changes(items)
        async with self._connection("record") as conn:
            rows = await (await conn.execute(app.queries.webhook_attempt_record_many,
                                             params)).fetchall()
            if changing is not None:
                await self._resize(conn, changing, params["now"])
        found = {row["ord"]: (row["failing_since"], row["circuit_open_until"]) for row in rows}
        return [found.get(n, (None, None)) for n in range(1, len(items) + 1)]

    async def _record_succeeded_many(self, items: list[dict[str, Any]]) -> list[_Streak]:
        app = self._rt
        params: dict[str, Any] = {plural: [i[name] for i in items]
                                  for name, plural in _SUCCEEDED_COLUMNS.items()}
        params["now"] = app.clock.db_now()
        changing = self._shares.changes(items)
        async with self._connection("record") as conn:
            await conn.execute(app.queries.webhook_attempt_record_succeeded, params)
            if changing is not None:
                await self._resize(conn, changing, params["now"])
        return [(None, None)] * len(items)

    async def _resize(self, conn: Any, changing: dict[UUID, int], now: Any) -> None:
        resized = await (await conn.execute(self._rt.queries.key_concurrency_resize,
                                            self._shares.params(changing, now))).fetchall()
        self._shares.learned(changing, resized)

    @staticmethod
    def _skip_reason(row: dict[str, Any], scheduled: bool) -> str | None:
        if row["disabled_at"] is not None:
            return f"endpoint disabled: {row['disabled_reason'] or 'no reason given'}"
        if row["payload_dropped_at"] is not None:
            return "the message's payload was dropped by its retention"
        if scheduled and row["status"] != "pending":
            return f"delivery already {row['status']}"
        return None

    def _keys(self, row: dict[str, Any], keyring: Keyring) -> list[hmac.HMAC]:
        column = self._secret_column
        cache = self._signing_keys
        keys = []
        for secret_id, stored in zip(row["secret_ids"], row["ciphertexts"], strict=True):
            # Decrypting (AES-GCM) and decoding the secret cost ~25 us per delivery; a secret
            # is immutable, so its key is kept by (id, ciphertext) (a re-encryption by a key
            # rotation changes the ciphertext, not the key).
            blob = bytes(stored)
            key = cache.get((secret_id, blob))
            if key is None:
                key = signer(secret_key(
                    keyring.decrypt(blob, column.context(secret_id)).decode()))
                if len(cache) >= _SIGNING_KEYS_KEPT:
                    cache.clear()
                cache[(secret_id, blob)] = key
            keys.append(key)
        return keys

    def _custom_headers(self, row: dict[str, Any], keyring: Keyring) -> dict[str, str]:
        """The endpoint's headers with their values decrypted (kept by (endpoint, ciphertext)
        like the signing keys); an endpoint written before 0014 still has them in clear."""
        blob = row["header_values"]
        if blob is None:
            return dict(row["headers"] or {})
        cache_key = (row["endpoint_id"], bytes(blob))
        found = self._headers.get(cache_key)
        if found is None:
            found = unseal(keyring, self._header_column, row["endpoint_id"], blob)
            if len(self._headers) >= _SIGNING_KEYS_KEPT:
                self._headers.clear()
            self._headers[cache_key] = found
        return found

    async def _record(self, row: dict[str, Any], *, run_id: UUID | None, trigger: str,
                      attempt: int, timestamp: int, result: AttemptResult,
                      decision: Decision) -> dict[str, Any]:
        app = self._rt
        settings = app.settings.webhooks
        scheduled = trigger == "scheduled"
        now = app.clock.now()
        status = _STATUS_AFTER[decision.kind] if scheduled or result.succeeded else None
        held = _held_until(result, settings, now)
        if not result.succeeded and held is None:
            decision = _after_circuit(decision, _expected_open(row, settings, now), now)
        next_at = None
        if decision.kind == "retry" and decision.delay_s is not None and scheduled:
            next_at = now + timedelta(seconds=decision.delay_s)
        outcome = (f"HTTP {result.status_code}" if result.status_code is not None
                   else f"{result.error_kind}: {result.error}")
        records = self._successes if result.succeeded else self._records
        failing_since, open_until = await records.submit({
            "message_id": row["message_id"], "endpoint_id": row["endpoint_id"],
            "run_id": run_id, "trigger": trigger, "attempt": attempt,
            "webhook_timestamp": timestamp, "url": row["url"],
            "status_code": result.status_code, "error_kind": result.error_kind,
            "error": None if result.succeeded else outcome[:1000].replace("\x00", "\ufffd"),
            "duration_ms": result.duration_ms,
            "response_body": result.body.decode(errors="replace").replace("\x00", "\ufffd"),
            "response_truncated": result.truncated, "next_attempt_at": next_at,
            "delivery_status": status, "counted": 1 if scheduled else 0,
            # A hold asked for is not a failure: neither the streak nor the breaker counts it.
            "succeeded": None if held is not None else result.succeeded})
        if held is not None:
            await self._hold_endpoint(row["endpoint_id"], held)
        disable = None
        if decision.kind == "gone":
            disable = "the endpoint answered 410 Gone"
        elif not result.succeeded and held is None and failing_since is not None and (
                now - failing_since).total_seconds() >= settings.disable_after_s:
            disable = f"failing continuously since {failing_since.isoformat()}"
        if disable is not None:
            async with (await app.pool()).connection() as conn:
                await self._disable(conn, row["endpoint_id"], disable)
        elif not result.succeeded and open_until is not None and open_until > now:
            # Open (this failure opened it, or it is a failed probe): the endpoint's other
            # deliveries wait for the cooldown instead of each taking a slot to fail.
            await self._park(row["endpoint_id"], open_until)
            decision = _after_circuit(decision, open_until, now)
        return self._finish(row, result, decision, outcome=outcome, scheduled=scheduled,
                            disabled=disable)

    async def _disable(self, conn: Any, endpoint_id: UUID, reason: str) -> None:
        q = self._rt.queries
        now = self._rt.clock.db_now()
        async with conn.transaction():
            await conn.execute(q.webhook_endpoint_disable, {"id": endpoint_id,
                                                            "reason": reason, "now": now})
            await conn.execute(q.webhook_delivery_cancel_pending, {
                "endpoint_id": endpoint_id, "reason": f"endpoint disabled: {reason}",
                "now": now})
        log.warning("webhook endpoint %s disabled: %s", endpoint_id, reason)

    @staticmethod
    def _finish(row: dict[str, Any], result: AttemptResult, decision: Decision, *,
                outcome: str, scheduled: bool, disabled: str | None) -> dict[str, Any]:
        summary = {"message_id": row["message_id"], "endpoint_id": str(row["endpoint_id"]),
                   "status_code": result.status_code, "error_kind": result.error_kind,
                   "duration_ms": round(result.duration_ms, 3)}
        if result.succeeded or not scheduled:
            return summary
        where = f"webhook {row['message_id']} to endpoint {row['endpoint_id']}"
        if decision.kind == "retry" and disabled is None and decision.delay_s is not None:
            log.info("%s: %s; next attempt in %.1f s", where, outcome, decision.delay_s)
            raise Snooze(decision.delay_s)
        raise Permanent(RuntimeError(f"{where} failed: {outcome}"
                                     + (f"; endpoint disabled ({disabled})" if disabled else "")))


def _delivery_key(input: Any) -> tuple[str, UUID] | None:
    """(message id, endpoint id) of a scheduled delivery's input, or None."""
    if not isinstance(input, dict) or input.get("trigger", "scheduled") != "scheduled":
        return None
    message_id, endpoint_id = input.get("message_id"), input.get("endpoint_id")
    if not isinstance(message_id, str) or not isinstance(endpoint_id, str):
        return None
    try:
        return message_id, UUID(endpoint_id)
    except ValueError:
        return None


def _held_until(result: AttemptResult, settings: WebhookSettings,
                now: datetime) -> datetime | None:
    """Until when the whole endpoint waits: a 429 whose Retry-After asks for a time to come
    (capped at ``webhooks.retry_after_max_s``); None otherwise."""
    if result.status_code != TOO_MANY_REQUESTS:
        return None
    asked = parse_retry_after(result.retry_after, now)
    if not asked:
        return None
    return now + timedelta(seconds=min(asked, settings.retry_after_max_s))


def _expected_open(row: dict[str, Any], settings: WebhookSettings,
                   now: datetime) -> datetime | None:
    """Until when the endpoint's circuit will be open after one more failure, as far as the
    loaded row tells (the record statement decides; this is what the attempt's
    ``next_attempt_at`` shows)."""
    threshold = settings.breaker_failures
    if threshold and row["consecutive_failures"] + 1 >= threshold:
        return now + timedelta(seconds=settings.breaker_cooldown_s)
    opened: datetime | None = row["circuit_open_until"]
    return opened if opened is not None and opened > now else None


def _after_circuit(decision: Decision, open_until: datetime | None, now: datetime) -> Decision:
    """A retry is not due before the circuit may close."""
    if decision.kind != "retry" or decision.delay_s is None or open_until is None:
        return decision
    return Decision("retry", max(decision.delay_s, (open_until - now).total_seconds()))


def _traced(span: Any, result: AttemptResult) -> None:
    """A webhook attempt's span: the status code, or the error kind (no URL: it may carry a
    token)."""
    if result.status_code is not None:
        span.set_attribute("http.response.status_code", result.status_code)
    if not result.succeeded:
        mark_error(span, str(result.status_code) if result.status_code is not None
                   else result.error_kind or "connect")
