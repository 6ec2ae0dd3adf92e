"""``app.webhooks``: endpoints, sending, attempts, resend and recovery.

Example::

    endpoint = await app.webhooks.create_endpoint("https://example.com/hooks",
                                                  event_types=["invoice.paid"])
    print(endpoint.secret)        # shown once: give it to the receiver
    sent = await app.webhooks.send("invoice.paid", {"id": 42}, idempotency_key="inv-42")

Every method takes an optional ``conn``: with it, the statement runs on the caller's connection
(in its transaction); without, on a pooled connection.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import BaseRowFactory, args_row, dict_row
from psycopg.types.json import Jsonb

from notifyq._crypto.keyring import Keyring
from notifyq._enqueue.refusals import translate_db_error, translated_errors
from notifyq._enqueue.validate import input_encoder, jsonb_problem
from notifyq._errors import (
    ConfigError,
    InvalidEndpoint,
    InvalidEnqueue,
    InvalidTransition,
    WebhookNotFound,
)
from notifyq._keys.columns import EncryptedColumn, EncryptedColumns
from notifyq._run import Run
from notifyq._runtime import Runtime
from notifyq._settings import WebhookSettings
from notifyq._webhooks import endpoints as checks
from notifyq._webhooks import headers as sealed
from notifyq._webhooks.catalog import MAX_SCHEMA_BYTES, Catalog, EventType, check_schema
from notifyq._webhooks.endpoints import Endpoint
from notifyq._webhooks.fanout import COPY_MIN_MESSAGES, Outgoing, copy_messages
from notifyq._webhooks.portal import Portal
from notifyq._webhooks.rows import (
    Attempt,
    Message,
    Recovered,
    Resent,
    attempt_row,
    delivery_row,
    message_row,
    recovered_row,
    resent_row,
)
from notifyq._webhooks.signing import generate_secret, secret_key

AnyConn = psycopg.AsyncConnection[Any]
T = TypeVar("T")

DELIVER = "webhook.deliver"
POOL = "webhooks"
ENDPOINT_KEY = "webhook:{endpoint_id}"
"""The concurrency key of a delivery run: one per endpoint (``webhooks.endpoint_concurrency``)."""
SECRET_TABLE = "webhook_secret"  # noqa: S105 - a table name
ENDPOINT_TABLE = "webhook_endpoint"
ATTEMPTS_LISTED = 1000
HEALTH_WINDOW_S = 86_400.0


@dataclass(frozen=True, slots=True)
class SentMessage:
    """``id`` is the ``webhook-id``; ``created`` is False when ``idempotency_key`` matched an
    earlier message (nothing new was enqueued); ``deliveries`` counts its endpoints."""

    id: str
    created: bool
    deliveries: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "deliveries": self.deliveries}


@dataclass(frozen=True, slots=True)
class WebhookMessage:
    """One message of :meth:`Webhooks.send_many`: what :meth:`Webhooks.send` takes.

    Example::

        await app.webhooks.send_many([
            WebhookMessage("invoice.paid", {"id": 42}, idempotency_key="inv-42"),
            WebhookMessage("invoice.paid", {"id": 43}, endpoint_id=endpoint.id),
        ])
    """

    event_type: str
    payload: dict[str, Any] | list[Any]
    endpoint_id: UUID | str | None = None
    idempotency_key: str | None = None
    payload_retention_s: float | None = None


@dataclass(frozen=True, slots=True)
class Replayed:
    """What :meth:`Webhooks.replay_missing` sent (or, in a dry run, would send): ``count``
    messages, ``more`` when another call would find more, ``items`` each message's new run."""

    count: int
    more: bool
    items: list[Recovered]

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "more": self.more, "items": [
            {"message_id": r["message_id"], "run_id": str(r["run_id"])} for r in self.items]}


OPERATOR_EVENT_KINDS = ("endpoint.disabled", "endpoint.circuit_opened", "endpoint.circuit_closed",
                        "endpoint.failing", "retention.purged")
"""What :meth:`Webhooks.operator_events` lists (notifyq/_maintenance/announcer.py emits them)."""

MAX_REPLAY = 100_000
"""The most messages one replay_missing call sends."""

SEND_MANY_CHUNK = 1000
"""Messages per statement of send_many (one transaction for all of them), when a batch goes by
the statement rather than by COPY (``fanout.COPY_MIN_MESSAGES``)."""


class Webhooks:
    def __init__(self, runtime: Runtime, columns: EncryptedColumns) -> None:
        self._rt = runtime
        self.secret_column: EncryptedColumn = columns.register(
            f"{runtime.settings.schema_name}.{SECRET_TABLE}", pk="id", column="ciphertext",
            builtin=True)
        self.header_column: EncryptedColumn = columns.register(
            f"{runtime.settings.schema_name}.{ENDPOINT_TABLE}", pk="id", column=sealed.COLUMN,
            builtin=True)
        self._catalog = Catalog(self.event_types)
        self.portal = Portal(runtime)
        """The customer portal's one-time sign-in links and sessions (``portal.mint``)."""

    @property
    def settings(self) -> WebhookSettings:
        return self._rt.settings.webhooks

    def _conn(self, conn: AnyConn | None) -> AbstractAsyncContextManager[AnyConn]:
        return self._rt.connection(conn)

    async def _one(self, conn: AnyConn, query: str,
                   params: dict[str, Any]) -> dict[str, Any] | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchone()

    async def _all(self, conn: AnyConn, query: LiteralString, params: dict[str, Any],
                   row_factory: BaseRowFactory[T]) -> list[T]:
        async with conn.cursor(row_factory=row_factory) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()

    def _now(self) -> datetime | None:
        return self._rt.clock.db_now()

    # -- endpoints --------------------------------------------------------------------------

    async def create_endpoint(self, url: str, *, description: str = "",
                              event_types: list[str] | None = None,
                              headers: dict[str, str] | None = None, secret: str | None = None,
                              enabled: bool = True, tenant_id: str | None = None,
                              rate_limit: int | None = None, ordered: bool = False,
                              conn: AnyConn | None = None) -> Endpoint:
        """Create an endpoint; the returned one carries ``secret`` (generated unless given),
        the only time it is shown. ``event_types`` None subscribes to every type. ``tenant_id``
        is the tenant it belongs to, for good (tokens limited to other tenants never see it).
        ``rate_limit``: at most this many deliveries per second, across all workers (None:
        unlimited). ``ordered``: one delivery at a time, in send order (see
        :meth:`update_endpoint`)."""
        url = checks.check_url(url, self.settings)
        rate_limit = checks.check_rate_limit(rate_limit)
        headers = checks.check_headers(headers)
        event_types = checks.check_event_types(event_types)
        await self._catalog.check_subscription(
            event_types, allow_unknown=self.settings.allow_unknown_event_types)
        secret = self._secret(secret)
        async with self._conn(conn) as c, c.transaction():
            keyring = await self._keyring()
            row = await self._one(c, self._rt.queries.webhook_endpoint_insert, {
                "url": url, "description": description or "", "event_types": event_types,
                "headers": Jsonb({}), "enabled": enabled, "now": self._now(),
                "tenant_id": tenant_id, "rate_limit": rate_limit})
            assert row is not None  # noqa: S101 - INSERT ... RETURNING
            if ordered:
                row = await self._order(c, row["id"], ordered=True)
            if headers:
                row = await self._seal_headers(c, keyring, row["id"],
                                               sealed.keep_masked(headers, {}))
            await self._store_secret(c, keyring, row["id"], secret)
        return Endpoint.from_row({**row, "valid_secrets": 1}, secret)

    async def _seal_headers(self, conn: AnyConn, keyring: Keyring, endpoint_id: UUID,
                            headers: dict[str, str]) -> dict[str, Any]:
        row = await self._one(conn, self._rt.queries.webhook_endpoint_seal_headers, {
            "id": endpoint_id, "headers": Jsonb(sealed.masked(headers)),
            "header_values": sealed.seal(keyring, self.header_column, endpoint_id, headers)})
        if row is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        return row

    async def _stored_headers(self, conn: AnyConn, keyring: Keyring,
                              endpoint_id: UUID) -> dict[str, str]:
        row = await self._one(conn, self._rt.queries.webhook_endpoint_header_values,
                              {"id": endpoint_id})
        if row is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        if row["header_values"] is None:  # written before 0014: still in clear
            return dict(row["headers"] or {})
        return sealed.unseal(keyring, self.header_column, endpoint_id, row["header_values"])

    async def seal_clear_headers(self, *, batch: int = 500) -> int:
        """Encrypt the header values of endpoints written before migration 0014 (a worker
        with webhooks enabled does this at its start). Returns how many it sealed."""
        q = self._rt.queries
        done = 0
        async with self._conn(None) as c:
            keyring = await self._keyring()
            while True:
                async with c.transaction():
                    rows = await self._all(c, q.webhook_endpoint_list_unsealed,
                                           {"limit": batch}, dict_row)
                    for row in rows:
                        await self._seal_headers(c, keyring, row["id"], dict(row["headers"]))
                done += len(rows)
                if len(rows) < batch:
                    return done

    def _secret(self, secret: str | None) -> str:
        if secret is None:
            return generate_secret()
        try:
            secret_key(secret)
        except ValueError as exc:
            raise InvalidEndpoint(f"secret: {exc}") from None
        return secret

    async def _keyring(self) -> Keyring:
        """The keyring, checked against the database when its check is due (on a connection
        of its own: what the check records does not depend on the caller's transaction)."""
        if not self._rt.has_keyring:
            raise ConfigError("webhook secrets are stored encrypted: configure a keyring "
                              "(NOTIFYQ_KEYS and NOTIFYQ_ACTIVE_KEY_VERSION)")
        return await self._rt.checked_keyring()

    async def _store_secret(self, conn: AnyConn, keyring: Any, endpoint_id: UUID,
                            secret: str) -> None:
        secret_id = uuid.uuid4()
        blob = keyring.encrypt(secret.encode(), self.secret_column.context(secret_id))
        await conn.execute(self._rt.queries.webhook_secret_insert, {
            "id": secret_id, "endpoint_id": endpoint_id, "ciphertext": blob,
            "now": self._now()})

    async def get_endpoint(self, endpoint_id: UUID | str, *,
                           conn: AnyConn | None = None) -> Endpoint:
        async with self._conn(conn) as c:
            row = await self._one(c, self._rt.queries.webhook_endpoint_get,
                                  {"id": _uuid(endpoint_id), "now": self._now()})
        if row is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        return Endpoint.from_row(row)

    async def list_endpoints(self, *, enabled: bool | None = None, limit: int = 100,
                             after: UUID | None = None, tenant_ids: list[str] | None = None,
                             conn: AnyConn | None = None) -> list[Endpoint]:
        """Oldest first; only those of ``tenant_ids`` unless None."""
        async with self._conn(conn) as c:
            rows = await self._all(c, self._rt.queries.webhook_endpoint_list, {
                "after": after, "enabled": enabled, "limit": limit, "now": self._now(),
                "tenant_ids": tenant_ids}, dict_row)
        return [Endpoint.from_row(r) for r in rows]

    async def update_endpoint(self, endpoint_id: UUID | str, *, url: str | None = None,
                              description: str | None = None,
                              event_types: list[str] | object | None = ...,
                              headers: dict[str, str] | None = None,
                              rate_limit: int | object | None = ...,
                              ordered: bool | None = None,
                              conn: AnyConn | None = None) -> Endpoint:
        """Change what is given (``event_types=None`` means every type, ``rate_limit=None``
        unlimited; leave either out to keep it).

        ``ordered=True``: from the next claim on, at most one delivery to the endpoint is in
        flight, and its pending deliveries go in send order, each only after the one before
        succeeded or was given up (a failing one holds the rest back while it is retried;
        :meth:`give_up` lets them go). Deliveries already in flight finish as they are.
        ``ordered=False`` lets its share adapt again and releases a delivery held at the
        head."""
        set_types = event_types is not ...
        set_rate = rate_limit is not ...
        rate = checks.check_rate_limit(rate_limit) if set_rate else None  # type: ignore[arg-type]
        types = checks.check_event_types(event_types) if isinstance(event_types, list) else None
        await self._catalog.check_subscription(
            types, allow_unknown=self.settings.allow_unknown_event_types)
        endpoint = _uuid(endpoint_id)
        params = {"id": endpoint, "now": self._now(),
                  "url": checks.check_url(url, self.settings) if url is not None else None,
                  "description": description, "set_event_types": set_types,
                  "event_types": types, "headers": None, "set_rate_limit": set_rate,
                  "rate_limit": rate}
        given = checks.check_headers(headers) if headers is not None else None
        async with self._conn(conn) as c, c.transaction():
            updated = await self._write(self._rt.queries.webhook_endpoint_update, params, c)
            if ordered is not None:
                row = await self._order(c, endpoint, ordered=bool(ordered))
                updated = Endpoint.from_row({**row, "valid_secrets": updated.valid_secrets})
            if given is None:
                return updated
            keyring = await self._keyring()
            stored = await self._stored_headers(c, keyring, endpoint)
            row = await self._seal_headers(c, keyring, endpoint,
                                           sealed.keep_masked(given, stored))
        return Endpoint.from_row({**row, "valid_secrets": updated.valid_secrets})

    async def _order(self, conn: AnyConn, endpoint_id: UUID, *,
                     ordered: bool) -> dict[str, Any]:
        """Marks the endpoint (un)ordered. An ordered endpoint's key is pinned to one delivery
        at a time (the adaptive share leaves it alone); an unordered one's pin goes and a
        delivery held at its head is released."""
        q = self._rt.queries
        row = await self._one(conn, q.webhook_endpoint_set_ordered, {
            "id": endpoint_id, "ordered": ordered, "now": self._now()})
        if row is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")
        key = ENDPOINT_KEY.format(endpoint_id=endpoint_id)
        if ordered:
            await conn.execute(q.key_concurrency_pin, {"key": key, "limit": 1,
                                                       "now": self._now()})
        else:
            await conn.execute(q.key_concurrency_unpin, {"key": key})
            await conn.execute(q.webhook_delivery_release_places, {"key": key,
                                                                   "now": self._now()})
        return row

    async def disable_endpoint(self, endpoint_id: UUID | str, reason: str = "disabled by hand",
                               *, conn: AnyConn | None = None) -> Endpoint:
        """Disable the endpoint: its pending deliveries stop (their runs are canceled)."""
        q = self._rt.queries
        async with self._conn(conn) as c, c.transaction():
            endpoint = await self._write(q.webhook_endpoint_disable, {
                "id": _uuid(endpoint_id), "reason": reason, "now": self._now()}, c)
            await c.execute(q.webhook_delivery_cancel_pending, {
                "endpoint_id": endpoint.id, "reason": f"endpoint disabled: {reason}",
                "now": self._now()})
        return endpoint

    async def enable_endpoint(self, endpoint_id: UUID | str, *,
                              conn: AnyConn | None = None) -> Endpoint:
        return await self._write(self._rt.queries.webhook_endpoint_enable,
                                 {"id": _uuid(endpoint_id), "now": self._now()}, conn)

    async def delete_endpoint(self, endpoint_id: UUID | str, *,
                              conn: AnyConn | None = None) -> None:
        """Delete the endpoint with its secrets, deliveries and attempts (pending deliveries
        are canceled first)."""
        q = self._rt.queries
        async with self._conn(conn) as c, c.transaction():
            await c.execute(q.webhook_delivery_cancel_pending, {
                "endpoint_id": _uuid(endpoint_id), "reason": "endpoint deleted",
                "now": self._now()})
            row = await self._one(c, q.webhook_endpoint_delete, {"id": _uuid(endpoint_id)})
        if row is None:
            raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")

    async def rotate_secret(self, endpoint_id: UUID | str, *, secret: str | None = None,
                            grace_s: float | None = None,
                            conn: AnyConn | None = None) -> Endpoint:
        """A new signing secret (returned once, in ``.secret``); the previous ones keep
        signing for ``grace_s`` (default ``webhooks.secret_grace_s``), both signatures sent."""
        secret = self._secret(secret)
        grace = self.settings.secret_grace_s if grace_s is None else grace_s
        if grace < 0:
            raise InvalidEndpoint(f"grace_s must not be negative, got {grace}")
        endpoint = await self.get_endpoint(endpoint_id, conn=conn)
        async with self._conn(conn) as c, c.transaction():
            keyring = await self._keyring()
            expires = await self._one(c, self._rt.queries.webhook_secret_expiry,
                                      {"now": self._now(), "grace_s": grace})
            assert expires is not None  # noqa: S101 - a SELECT of one row
            await c.execute(self._rt.queries.webhook_secret_expire, {
                "endpoint_id": endpoint.id, "expires_at": expires["expires_at"]})
            await self._store_secret(c, keyring, endpoint.id, secret)
        fresh = await self.get_endpoint(endpoint.id, conn=conn)
        return Endpoint.from_row(_row_of(fresh), secret)

    async def _write(self, query: str, params: dict[str, Any],
                     conn: AnyConn | None) -> Endpoint:
        async with self._conn(conn) as c:
            row = await self._one(c, query, params)
        if row is None:
            raise WebhookNotFound(f"no webhook endpoint {params['id']}")
        return Endpoint.from_row(row)

    # -- messages ---------------------------------------------------------------------------

    async def send(self, event_type: str, payload: dict[str, Any] | list[Any], *,
                   endpoint_id: UUID | str | None = None, idempotency_key: str | None = None,
                   payload_retention_s: float | None = None,
                   conn: AnyConn | None = None) -> SentMessage:
        """Send ``payload`` (the exact JSON body, as PostgreSQL's jsonb prints it) to
        ``endpoint_id``, or to every enabled endpoint subscribed to ``event_type``: one
        ``webhook.deliver`` run each. With ``conn``, inside the caller's transaction.
        ``payload_retention_s``: drop this message's payload that long after it is sent
        instead of after ``webhooks.payload_retention_s``."""
        _check_retention(payload_retention_s)
        await self._catalog.check_messages(
            [(event_type, payload)], allow_unknown=self.settings.allow_unknown_event_types,
            numbered=False)
        params = {"event_type": event_type, "payload": _payload_text(payload),
                  "endpoint_id": _uuid(endpoint_id) if endpoint_id is not None else None,
                  "idempotency_key": idempotency_key}
        # Alone, on the enqueuer's warm connection, like App.enqueue (a pooled checkout cost a
        # single send about 0.1 ms).
        with translated_errors():
            async with (self._rt.warm_connection() if conn is None
                        else self._conn(conn)) as c, self._atomic_if(c, payload_retention_s):
                # (message_id, created, deliveries): SentMessage's fields in order
                (sent,) = await self._all(c, self._rt.queries.webhook_message_send, params,
                                          args_row(SentMessage))
                await self._retain(c, [sent], payload_retention_s)
        return sent

    def _atomic_if(self, conn: AnyConn,
                   retention_s: float | None) -> AbstractAsyncContextManager[Any]:
        """A send with a retention of its own is two statements: one transaction."""
        return nullcontext() if retention_s is None else self._atomic(conn)

    async def _retain(self, conn: AnyConn, sent: Sequence[SentMessage],
                      retention_s: float | None) -> None:
        ids = [s.id for s in sent if s.created]
        if retention_s is not None and ids:
            await conn.execute(self._rt.queries.webhook_message_retain_until,
                               {"ids": ids, "retention_s": retention_s})

    async def send_many(self, messages: Sequence[WebhookMessage | tuple[str, Any]], *,
                        conn: AnyConn | None = None) -> list[SentMessage]:
        """:meth:`send` for many messages at once, all or nothing: messages, their runs and
        deliveries are written set-based (by COPY from 300 messages on, else one statement
        per 1,000 messages; one transaction), and the workers are woken once. Each item is a
        :class:`WebhookMessage` or an ``(event_type, payload)`` pair; the answer is in the
        same order. A message that :meth:`send` would refuse refuses the batch, naming its
        position (from 1)."""
        items = [m if isinstance(m, WebhookMessage) else WebhookMessage(*m) for m in messages]
        for m in items:
            _check_retention(m.payload_retention_s)
        encode = input_encoder()
        texts = [_payload_text(m.payload, where=f"message {n}: ", encode=encode)
                 for n, m in enumerate(items, 1)]
        await self._catalog.check_messages(
            [(m.event_type, m.payload) for m in items],
            allow_unknown=self.settings.allow_unknown_event_types, numbered=True)
        batch = Outgoing(
            [m.event_type for m in items], [m.payload for m in items], texts,
            [_uuid(m.endpoint_id) if m.endpoint_id is not None else None for m in items],
            [m.idempotency_key for m in items])
        with translated_errors():
            async with self._conn(conn) as c, self._atomic(c):
                sent = await self._send_copied(c, batch)
                if sent is None:
                    sent = []
                    for start in range(0, len(items), SEND_MANY_CHUNK):
                        sent += await self._send_chunk(c, batch, start)
                for retention in {m.payload_retention_s for m in items} - {None}:
                    await self._retain(c, [s for s, m in zip(sent, items, strict=True)
                                           if m.payload_retention_s == retention], retention)
        return sent

    @staticmethod
    def _atomic(conn: AnyConn) -> AbstractAsyncContextManager[Any]:
        """The caller's open transaction holds every statement; else one of our own."""
        return conn.transaction() if conn.autocommit else nullcontext()

    async def _send_copied(self, conn: AnyConn, batch: Outgoing) -> list[SentMessage] | None:
        """A batch of COPY_MIN_MESSAGES or more by COPY (notifyq/_webhooks/fanout.py); None
        when the statement must send it."""
        if len(batch.texts) < COPY_MIN_MESSAGES:
            return None
        sent = await copy_messages(conn, self._rt.queries, batch, key_template=ENDPOINT_KEY)
        return None if sent is None else [SentMessage(*s) for s in sent]

    async def _send_chunk(self, conn: AnyConn, batch: Outgoing,
                          start: int) -> list[SentMessage]:
        """The batch's messages from ``start`` (from 0), SEND_MANY_CHUNK of them, in one
        statement."""
        end = start + SEND_MANY_CHUNK
        try:
            rows = await self._all(conn, self._rt.queries.webhook_message_send_many, {
                "event_types": batch.event_types[start:end], "payloads": batch.texts[start:end],
                "endpoint_ids": batch.endpoint_ids[start:end],
                "idempotency_keys": batch.keys[start:end]}, args_row(_sent_row))
        except psycopg.DatabaseError as exc:
            if start == 0:
                raise
            # The SQL function numbers the messages of its own statement: say where in the batch.
            translated = translate_db_error(exc)
            if not isinstance(translated, InvalidEnqueue):
                raise
            raise InvalidEnqueue(_renumbered(str(translated), start)) from None
        return rows

    # -- the event-type catalog ----------------------------------------------------------------

    async def define_event_type(self, name: str, *, description: str = "",
                                schema: dict[str, Any] | None = None,
                                conn: AnyConn | None = None) -> EventType:
        """Add ``name`` to the event-type catalog, or change its description and schema (a
        JSON Schema, draft 2020-12, that payloads of this type must match; None: any JSON).
        See :mod:`notifyq._webhooks.catalog` for what a non-empty catalog refuses."""
        checks.check_event_types([name])
        if len(description) > checks.MAX_DESCRIPTION_LEN:
            raise InvalidEndpoint(f"description: at most {checks.MAX_DESCRIPTION_LEN} "
                                  "characters")
        schema = check_schema(name, schema)
        if schema is not None and len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
            raise InvalidEndpoint(f"schema: at most {MAX_SCHEMA_BYTES} bytes of JSON")
        problem = None if schema is None else jsonb_problem(json.dumps(schema, ensure_ascii=False))
        if problem is not None:
            raise InvalidEndpoint(f"schema: cannot be stored, it holds {problem}")
        async with self._conn(conn) as c:
            row = await self._one(c, self._rt.queries.webhook_event_type_upsert, {
                "name": name, "description": description,
                "schema": None if schema is None else Jsonb(schema), "now": self._now()})
        assert row is not None  # noqa: S101 - INSERT ... RETURNING
        self._catalog.forget()
        return EventType(**row)

    async def event_types(self, *, conn: AnyConn | None = None) -> list[EventType]:
        """The event-type catalog, by name."""
        async with self._conn(conn) as c:
            rows = await self._all(c, self._rt.queries.webhook_event_type_list, {}, dict_row)
        return [EventType(**r) for r in rows]

    async def delete_event_type(self, name: str, *, conn: AnyConn | None = None) -> None:
        """Remove ``name`` from the catalog (endpoints subscribed to it keep their list;
        messages already sent are kept). WebhookNotFound if it is not there."""
        async with self._conn(conn) as c:
            row = await self._one(c, self._rt.queries.webhook_event_type_delete, {"name": name})
        self._catalog.forget()
        if row is None:
            raise WebhookNotFound(f"no event type {name!r} in the catalog")

    @property
    def max_attempts(self) -> int:
        """The scheduled attempts a delivery gets: one per ``webhooks.retry_schedule_s`` entry
        (as configured in this process; workers should agree)."""
        return len(self.settings.retry_schedule_s)

    async def message(self, message_id: str, *, conn: AnyConn | None = None) -> Message:
        """The message with its deliveries (one per endpoint): ``attempts`` scheduled attempts
        made of ``max_attempts``."""
        q = self._rt.queries
        async with self._conn(conn) as c:
            found = await self._all(c, q.webhook_message_get, {"id": message_id}, message_row)
            if not found:
                raise WebhookNotFound(f"no webhook message {message_id}")
            deliveries = await self._all(c, q.webhook_delivery_list, {
                "message_id": message_id, "now": self._now()}, delivery_row)
        return {**found[0], "deliveries": [{**d, "max_attempts": self.max_attempts}
                                           for d in deliveries]}

    async def attempts(self, message_id: str, *, limit: int = ATTEMPTS_LISTED,
                       conn: AnyConn | None = None) -> list[Attempt]:
        """Every attempt of the message, oldest first. ``attempt`` counts per delivery and
        trigger: scheduled attempts 1..``max_attempts`` (the schedule's length; a recovery
        starts again at 1), manual resends 1, 2, ... (``max_attempts`` None: no retries)."""
        async with self._conn(conn) as c:
            rows = await self._all(c, self._rt.queries.webhook_attempt_list,
                                   {"message_id": message_id, "limit": limit}, attempt_row)
        return [{**r, "max_attempts": self.max_attempts if r["trigger"] == "scheduled"
                 else None} for r in rows]

    async def list_messages(self, *, endpoint_id: UUID | str | None = None,
                            before: str | None = None, limit: int = 50,
                            tenant_ids: list[str] | None = None, event_type: str | None = None,
                            to_endpoint: UUID | str | None = None,
                            conn: AnyConn | None = None) -> list[dict[str, Any]]:
        """Messages, newest first (``before``: the last id of the previous page), with their
        deliveries counted (``failed``, and ``retrying``: pending after a failed attempt); with
        ``endpoint_id``, that endpoint's deliveries with their state and next attempt instead.
        Without ``endpoint_id``: ``tenant_ids``, only messages sent to an endpoint of those
        tenants; ``event_type``, of that type; ``to_endpoint``, with a delivery to it."""
        q = self._rt.queries
        async with self._conn(conn) as c:
            if endpoint_id is None:
                return await self._all(c, q.webhook_message_list, {
                    "before": before, "limit": limit, "tenant_ids": tenant_ids,
                    "event_type": event_type,
                    "to_endpoint": to_endpoint and _uuid(to_endpoint)}, dict_row)
            return await self._all(c, q.webhook_delivery_list_by_endpoint, {
                "endpoint_id": _uuid(endpoint_id), "before": before, "limit": limit,
                "now": self._now()}, dict_row)

    async def health(self, *, endpoint_ids: list[UUID] | None = None,
                     window_s: float = HEALTH_WINDOW_S, limit: int = 1000,
                     tenant_ids: list[str] | None = None,
                     conn: AnyConn | None = None) -> list[dict[str, Any]]:
        """Per endpoint: attempts and 2xx answers in the last ``window_s`` (``success_rate``
        None without attempts), the last attempt and the last failure."""
        async with self._conn(conn) as c:
            rows = await self._all(c, self._rt.queries.webhook_endpoint_health, {
                "ids": endpoint_ids, "now": self._now(), "window_s": window_s, "limit": limit,
                "tenant_ids": tenant_ids}, dict_row)
        return [{**r, "window_s": window_s, "success_rate":
                 r["succeeded"] / r["attempts"] if r["attempts"] else None} for r in rows]

    async def operator_events(self, *, kind: str | None = None,
                              endpoint_id: UUID | str | None = None, before: int | None = None,
                              limit: int = 50, tenant_ids: list[str] | None = None,
                              conn: AnyConn | None = None) -> list[dict[str, Any]]:
        """Operator events, newest first (``before``: the last id of the previous page): an
        endpoint disabled, its circuit opened or closed, failing for
        ``webhooks.failing_alert_after_s``, a purge pass. Each has ``id``, ``kind``,
        ``endpoint_id``, ``tenant_id``, ``detail``, ``created_at``, ``emitted_at`` (None until
        the leader logged and sent it) and ``message_id`` (the message it was sent to the
        operator's endpoint as). ``tenant_ids``: only events about those tenants' endpoints.

        Example::

            for event in await app.webhooks.operator_events(kind="endpoint.disabled"):
                print(event["endpoint_id"], event["detail"]["reason"])
        """
        if kind is not None and kind not in OPERATOR_EVENT_KINDS:
            raise InvalidEndpoint(f"kind: one of {', '.join(OPERATOR_EVENT_KINDS)}, got "
                                  f"{kind!r}")
        if not 1 <= limit <= 1000:
            raise InvalidEndpoint(f"limit: between 1 and 1000, got {limit}")
        async with self._conn(conn) as c:
            return await self._all(c, self._rt.queries.operator_event_list, {
                "kind": kind, "before": before, "limit": limit, "tenant_ids": tenant_ids,
                "endpoint_id": None if endpoint_id is None else _uuid(endpoint_id)}, dict_row)

    async def tries(self, runs: Sequence[Run], *,
                    conn: AnyConn | None = None) -> dict[UUID, tuple[int, int]]:
        """:func:`delivery_tries` of ``runs``."""
        return await delivery_tries(self._rt, runs, conn=conn)

    async def resend(self, message_id: str, *, endpoint_id: UUID | str | None = None,
                     conn: AnyConn | None = None) -> list[Resent]:
        """A manual attempt (its own run, no retries on failure) per delivery of the message,
        or to one endpoint. Returns ``[{"endpoint_id", "run_id"}]``. A message whose payload
        was dropped by retention is refused (InvalidTransition): there is nothing to send."""
        async with self._conn(conn) as c:
            found = await self._all(c, self._rt.queries.webhook_message_get,
                                    {"id": message_id}, message_row)
            if found and found[0]["payload_dropped_at"] is not None:
                raise InvalidTransition(
                    f"webhook message {message_id} cannot be resent: its payload was dropped "
                    f"at {found[0]['payload_dropped_at'].isoformat()} by its retention "
                    "(webhooks.payload_retention_s)")
            rows = await self._all(c, self._rt.queries.webhook_delivery_resend, {
                "message_id": message_id,
                "endpoint_id": _uuid(endpoint_id) if endpoint_id is not None else None},
                resent_row)
        if not rows:
            raise WebhookNotFound(f"no delivery of webhook message {message_id}"
                                  + (f" to endpoint {endpoint_id}" if endpoint_id else ""))
        return rows

    async def give_up(self, message_id: str, endpoint_id: UUID | str, *,
                      reason: str = "given up by hand",
                      conn: AnyConn | None = None) -> UUID:
        """Give up the message's pending delivery to the endpoint while it waits for its next
        attempt: the delivery fails with ``reason`` (``recover`` can start it again) and its run
        is canceled; an ordered endpoint's next message goes at once. Returns the canceled
        run's id. InvalidTransition when the delivery is not pending or is being attempted
        right now (try again when the attempt is over)."""
        endpoint = _uuid(endpoint_id)
        if not reason or len(reason) > checks.MAX_DESCRIPTION_LEN:
            raise InvalidEndpoint(f"reason: 1 to {checks.MAX_DESCRIPTION_LEN} characters")
        q = self._rt.queries
        async with self._conn(conn) as c:
            row = await self._one(c, q.webhook_delivery_give_up, {
                "message_id": message_id, "endpoint_id": endpoint, "reason": reason,
                "now": self._now(), "channel": q.schema})
        if row is not None:
            return UUID(str(row["run_id"]))
        deliveries = [d for d in (await self.message(message_id, conn=conn))["deliveries"]
                      if d["endpoint_id"] == endpoint]
        if not deliveries:
            raise WebhookNotFound(f"no delivery of webhook message {message_id} to endpoint "
                                  f"{endpoint}")
        status = deliveries[0]["status"]
        if status != "pending":
            raise InvalidTransition(f"the delivery of {message_id} to endpoint {endpoint} is "
                                    f"{status}: only a pending one can be given up")
        raise InvalidTransition(f"the delivery of {message_id} to endpoint {endpoint} is being "
                                "attempted now: give it up when the attempt is over")

    async def recover(self, endpoint_id: UUID | str, since: datetime, *, limit: int = 10_000,
                      conn: AnyConn | None = None) -> list[Recovered]:
        """Re-enqueue the endpoint's failed deliveries whose last attempt was at or after
        ``since`` (a fresh series of scheduled attempts each). Returns
        ``[{"message_id", "run_id"}]``."""
        endpoint = await self.get_endpoint(endpoint_id, conn=conn)
        async with self._conn(conn) as c:
            return await self._all(c, self._rt.queries.webhook_delivery_recover, {
                "endpoint_id": endpoint.id, "since": since, "limit": limit,
                "now": self._now()}, recovered_row)

    async def replay_missing(self, endpoint_id: UUID | str, since: datetime, *,
                             limit: int = 10_000, dry_run: bool = False,
                             conn: AnyConn | None = None) -> Replayed:
        """Send the endpoint the messages since ``since`` that it should have received and
        never got: no delivery (it was disabled when they were sent, or subscribed to their
        type later) or a canceled one (disabled while they waited). Each gets a delivery and a
        fresh series of scheduled attempts, oldest message first, at most ``limit`` per call;
        ``more`` says whether another call would find more. ``dry_run`` counts (up to
        ``limit``) and changes nothing. The endpoint must be enabled. Safe to repeat and to run
        beside sends: a message is never given a second delivery."""
        if not 1 <= limit <= MAX_REPLAY:
            raise InvalidEndpoint(f"limit: between 1 and {MAX_REPLAY}")
        endpoint = await self.get_endpoint(endpoint_id, conn=conn)
        if not endpoint.enabled:
            raise InvalidEndpoint(f"endpoint: {endpoint.id} is disabled: enable it before "
                                  "replaying what it missed")
        q = self._rt.queries
        params = {"endpoint_id": endpoint.id, "since": since, "now": self._now(),
                  "from_id": f"msg_{max(0, int(since.timestamp() * 1000)):012x}"}
        async with self._conn(conn) as c, self._atomic(c):
            if dry_run:
                row = await self._one(c, q.webhook_delivery_missing_count,
                                      {**params, "limit": limit + 1})
                assert row is not None  # noqa: S101 - an aggregate
                return Replayed(min(row["missing"], limit), row["missing"] > limit, [])
            await c.execute(q.webhook_delivery_replay_lock, {"endpoint_id": endpoint.id})
            rows = await self._all(c, q.webhook_delivery_replay_missing,
                                   {**params, "limit": limit}, recovered_row)
            left = await self._one(c, q.webhook_delivery_missing_count, {**params, "limit": 1})
        assert left is not None  # noqa: S101 - an aggregate
        return Replayed(len(rows), left["missing"] > 0, rows)


def _payload_text(payload: Any, *, where: str = "",
                  encode: Callable[[Any], str] | None = None) -> str:
    """``payload`` as the JSON text PostgreSQL will store, or InvalidEnqueue. ``encode``:
    a batch's :func:`input_encoder` (json.dumps builds an encoder at every call)."""
    try:
        text = (json.dumps(payload, ensure_ascii=False, allow_nan=False) if encode is None
                else encode(payload))
    except (TypeError, ValueError) as exc:
        raise InvalidEnqueue(f"{where}payload is not JSON-serializable: {exc}") from None
    if text.isascii() and "\\u0000" not in text:  # the common case: nothing jsonb refuses
        return text
    problem = jsonb_problem(text)
    if problem:
        raise InvalidEnqueue(f"{where}payload contains {problem}, which PostgreSQL's jsonb "
                             "cannot store")
    return text


MAX_PAYLOAD_RETENTION_S = 100 * 365 * 86_400.0
"""The longest payload retention a message may ask for (100 years)."""


def _check_retention(retention_s: float | None) -> None:
    if retention_s is not None and not 0 < retention_s <= MAX_PAYLOAD_RETENTION_S:
        raise InvalidEnqueue(f"payload_retention_s must be more than 0 and at most "
                             f"{MAX_PAYLOAD_RETENTION_S:.0f} s (100 years), got {retention_s}")


def _sent_row(ord: int, message_id: str, created: bool, deliveries: int) -> SentMessage:
    return SentMessage(message_id, created, deliveries)


def _renumbered(message: str, offset: int) -> str:
    """A refusal's "message N: ..." counted from the batch's start, not the chunk's."""
    head, _, rest = message.partition(": ")
    number = head.removeprefix("message ")
    return f"message {int(number) + offset}: {rest}" if number.isdigit() else message


def _row_of(endpoint: Endpoint) -> dict[str, Any]:
    return {"id": endpoint.id, "url": endpoint.url, "description": endpoint.description,
            "event_types": endpoint.event_types, "headers": endpoint.headers,
            "disabled_at": endpoint.disabled_at, "disabled_reason": endpoint.disabled_reason,
            "failing_since": endpoint.failing_since, "created_at": endpoint.created_at,
            "updated_at": endpoint.updated_at, "valid_secrets": endpoint.valid_secrets,
            "consecutive_failures": endpoint.consecutive_failures,
            "circuit_open_until": endpoint.circuit_open_until, "ordered": endpoint.ordered}


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise WebhookNotFound(f"not an endpoint id (UUID): {value!r}") from None


async def delivery_tries(runtime: Runtime, runs: Sequence[Run], *,
                         conn: AnyConn | None = None) -> dict[UUID, tuple[int, int]]:
    """Per ``webhook.deliver`` run among ``runs``: (attempts it made, attempts it may make):
    the schedule's length for a scheduled run, 1 for a manual resend. The run's own
    ``attempts`` / ``max_attempts`` (0/100 after two failed attempts) count executions: a
    scheduled retry is a snooze, which does not count, and 100 only stops a crash loop. Needs
    no keyring: a process without webhooks enabled lists a server's webhook runs the same."""
    mine = {r.id: r.input for r in runs if r.job_type == DELIVER and isinstance(r.input, dict)}
    if not mine:
        return {}
    async with runtime.connection(conn) as c, c.cursor(row_factory=dict_row) as cur:
        await cur.execute(runtime.queries.webhook_attempt_count_by_run, {
            "message_ids": sorted({str(i.get("message_id")) for i in mine.values()}),
            "run_ids": list(mine)})
        made = {r["run_id"]: r["n"] for r in await cur.fetchall()}
    scheduled = len(runtime.settings.webhooks.retry_schedule_s)
    return {run_id: (made.get(run_id, 0), 1 if data.get("trigger") == "manual" else scheduled)
            for run_id, data in mine.items()}
