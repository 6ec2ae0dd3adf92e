"""``Webhooks.send_many`` by COPY: how a batch of :data:`COPY_MIN_MESSAGES` or more is written.

``_send_webhooks`` (migrations 0024, 0031; ``webhook_message_send_many``) fans a batch out in SQL:
it parses each payload into jsonb and prints it back, draws a ``uuid7()`` per message and per
run, joins the endpoints per message and inserts messages, runs and deliveries from CTEs. Here
the same rows are computed in Python from one read (``webhook_endpoint_fan_out``: the
statement's now(), the ``webhook.deliver`` definition, the endpoints the batch may reach) and
streamed by three COPYs (messages, runs, deliveries), then one NOTIFY; with idempotency keys, the
function's advisory locks come first and then the messages already sent under them. Ids are
this process's UUIDv7s (:func:`notifyq._enqueue.ids.new_run_ids`), messages first, then runs, in
the batch's order (and by endpoint id within a message), as the function draws them.

Every value is the function's: the body is the payload as jsonb prints it (keys by length then
bytes; a payload whose keys are already in that order is sent as encoded), a run's run_at is
``greatest(now(), circuit_open_until)``, and its concurrency key is the endpoint's, which this
path sets even when no worker has registered ``webhook.deliver`` yet, as migration 0038 (branch
``keyless``) has the functions do: a share of 1 until the definition gives its own (``defaulted``
bit 8). A batch this path cannot write identically returns None having written nothing, and goes
to the statement: one the function would refuse (it then names the message), a payload with a
non-string key or a float that jsonb prints otherwise, a definition with a key template of its
own.

Why (bench/RESULTS.md, "send_many by COPY", a loaded 2-core VM): the statement cost 56-64 us of
server CPU a message, COPY 33-44 (messages 5-6, runs 14-16, deliveries 18-22: their two
foreign-key checks stay); the client 19 -> 11 us in batches of 10,000. Each COPY goes a chunk at
a time, so Python formats the next while the server inserts the last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import lt
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from notifyq._db.queries import Queries
from notifyq._enqueue.copy import CHUNK_RUNS, COPY_NULL, copy_text
from notifyq._enqueue.ids import new_run_ids
from notifyq._enqueue.validate import floats_print_differently, input_encoder
from notifyq._notifier import wake_payload
from notifyq._webhooks.endpoints import EVENT_TYPE, MAX_IDEMPOTENCY_KEY_LEN

COPY_MIN_MESSAGES = 300
"""The fewest messages a ``send_many`` call writes by COPY; fewer go by the statement (COPY's
reads and three streams cost more round trips than a small batch saves)."""
MAX_BODY_BYTES = 262_144
"""The largest payload ``_send_webhook`` accepts, as jsonb prints it."""
POOL = "webhooks"
DELIVER = "webhook.deliver"
DEFAULTED_LIMIT = 8
"""``job_run.defaulted``'s bit for a concurrency limit the definition gives later (0038)."""

Sent = tuple[str, bool, int]
"""A message's answer: (id, created, deliveries), SentMessage's fields in order."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """The batch, column by column, in the order given (``texts``: the payloads' JSON)."""

    event_types: list[str]
    payloads: list[Any]
    texts: list[str]
    endpoint_ids: list[UUID | None]
    keys: list[str | None]


async def copy_messages(conn: psycopg.AsyncConnection[Any], queries: Queries, batch: Outgoing,
                        *, key_template: str) -> list[Sent] | None:
    """Write ``batch`` as ``webhook_message_send_many`` would and return its answers, or None,
    having written nothing, when the statement must write it. ``key_template``: the delivery
    runs' concurrency key (``webhook:{endpoint_id}``)."""
    bodies = jsonb_bodies(batch.payloads, batch.texts)
    if bodies is None or not _acceptable(batch, bodies):
        return None
    q = queries
    async with conn.cursor(row_factory=dict_row) as cur:
        known = await _known(cur, q, batch.keys)
        await cur.execute(q.webhook_endpoint_fan_out, {
            "event_types": sorted(set(batch.event_types)),
            "endpoint_ids": sorted({e for e in batch.endpoint_ids if e is not None})})
        rows = await cur.fetchall()
        targets = _Targets.of(rows, key_template=key_template)
        if targets is None or not targets.has_all(batch.endpoint_ids):
            return None
        plan = _Plan(batch, bodies, known, targets)
        # Each COPY a chunk at a time: Python formats the next while the server inserts the last.
        chunks = [(start, start + CHUNK_RUNS) for start in range(0, plan.fresh, CHUNK_RUNS)]
        async with cur.copy(q.webhook_message_copy) as copy:
            for start, end in chunks:
                await copy.write(plan.messages(start, end))
        deliveries: list[str] = []
        async with cur.copy(q.webhook_delivery_copy_runs) as copy:
            for start, end in chunks:
                runs, delivered = plan.runs(start, end)
                await copy.write(runs)
                deliveries.append(delivered)
        async with cur.copy(q.webhook_delivery_copy) as copy:
            for delivered in deliveries:
                await copy.write(delivered)
        await cur.execute(q.job_run_notify, {"channel": q.schema,
                                             "payloads": [wake_payload(POOL)]})
    return plan.answers


async def _known(cur: psycopg.AsyncCursor[Any], q: Queries,
                 keys: list[str | None]) -> dict[str, tuple[str, int]]:
    """The messages sent before under the batch's keys, locked as the function locks them."""
    keyed = [k for k in keys if k is not None]
    if not keyed:
        return {}
    await cur.execute(q.webhook_message_lock_keys, {"keys": keyed})
    await cur.execute(q.webhook_message_by_keys, {"keys": keyed})
    return {r["key"]: (r["id"], r["deliveries"]) for r in await cur.fetchall()}


def _acceptable(batch: Outgoing, bodies: list[str]) -> bool:
    """Whether the function would accept every message (else it refuses, naming the first)."""
    for event_type, body, key in zip(batch.event_types, bodies, batch.keys, strict=True):
        if (type(event_type) is not str or EVENT_TYPE.fullmatch(event_type) is None
                or body[0] not in "{[" or _bytes(body) > MAX_BODY_BYTES):
            return False
        if key is not None and (type(key) is not str or "\0" in key
                                or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LEN):
            return False
    return True


def _bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


# -- the payload as jsonb prints it ---------------------------------------------------------------

def jsonb_bodies(payloads: Sequence[Any], texts: Sequence[str]) -> list[str] | None:
    """Each payload's JSON as ``payload::jsonb::text`` prints it, from ``texts`` (the encoder's
    JSON: jsonb's separators and escapes), or None when one may print otherwise in a way this
    does not follow (a float in exponent form or -0.0, a key that is not a string)."""
    bodies: list[str] = []
    encode: Callable[[Any], str] | None = None
    for payload, text in zip(payloads, texts, strict=True):
        if floats_print_differently(text):
            return None
        order = _key_order(payload)
        if order is None:
            return None
        if not order:
            encode = encode or input_encoder()
            bodies.append(encode(_reordered(payload)))
        else:
            bodies.append(text)
    return bodies


def _jsonb_key(key: str) -> tuple[int, bytes]:
    """jsonb's order of object keys: shorter first, then bytewise."""
    raw = key.encode()
    return len(raw), raw


def _key_order(value: Any) -> bool | None:
    """True when every object in ``value`` has its keys in jsonb's order already, False when
    one has not, None when one has a key that is not a string (JSON would make it one, and
    two keys might then collide)."""
    in_order, todo = True, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            try:
                joined = "".join(item)
            except TypeError:
                return None
            if in_order and len(item) > 1:
                keys = list(item)
                ranks: list[tuple[int, str | bytes]] = (
                    list(zip(map(len, keys), keys, strict=True)) if joined.isascii()
                    else list(map(_jsonb_key, keys)))
                in_order = all(map(lt, ranks, ranks[1:]))
            todo += [v for v in item.values() if isinstance(v, dict | list | tuple)]
        elif isinstance(item, list | tuple):
            todo += [v for v in item if isinstance(v, dict | list | tuple)]
    return in_order


def _reordered(value: Any) -> Any:
    """``value`` with every object's keys in jsonb's order (all keys are strings)."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in sorted(value, key=_jsonb_key)}
    if isinstance(value, list | tuple):
        return [_reordered(v) for v in value]
    return value


# -- the fan-out ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Endpoint:
    """One endpoint as the batch's runs and deliveries name it (COPY text)."""

    id: str
    enabled: bool
    event_types: frozenset[str] | None
    input_tail: str
    """A run's columns from after its message id in ``input`` to trigger_ref."""
    key_tail: str
    """A run's columns after trigger_ref."""


@dataclass(frozen=True, slots=True)
class _Targets:
    """webhook_endpoint_fan_out's answer: the endpoints by id, in id order."""

    endpoints: dict[UUID, _Endpoint]
    head: str
    """A run's columns from job_type to the start of its message id in ``input``."""

    @classmethod
    def of(cls, rows: Sequence[dict[str, Any]], *, key_template: str) -> _Targets | None:
        d = rows[0]
        template = d["concurrency_key_template"]
        if template is not None and template != key_template:
            return None  # a template of its own: _expand_template, in SQL only
        # Without a definition: a share of 1 and `defaulted` bit 8 (migration 0038), so that
        # job_run_apply_definitions gives the runs the definition's share once a worker starts.
        limit = 1 if d["concurrency_limit"] is None else d["concurrency_limit"]
        defaulted = COPY_NULL if d["defined"] else str(DEFAULTED_LIMIT)
        version = 1 if d["version"] is None else d["version"]
        priority = 0 if d["priority_default"] is None else d["priority_default"]
        timeout = COPY_NULL if d["timeout_s"] is None else repr(float(d["timeout_s"]))
        scope = copy_text(d["scope_entity_type"])
        endpoints = {}
        for r in rows:
            if r["id"] is None:
                continue
            eid = str(r["id"])
            endpoints[r["id"]] = _Endpoint(
                eid, r["enabled"],
                None if r["event_types"] is None else frozenset(r["event_types"]),
                f'", "endpoint_id": "{eid}"}}\t{POOL}\t{priority}\t{r["run_at"].isoformat()}'
                f"\t100\t{timeout}\t{{}}\tevent\t",
                f"\t{scope}\t{copy_text(key_template.format(endpoint_id=eid))}\t{limit}"
                f"\t{defaulted}\n")
        return cls(endpoints, f'\t{DELIVER}\t{version}\t{{"message_id": "')

    def has_all(self, endpoint_ids: list[UUID | None]) -> bool:
        """Whether every endpoint named exists (the function refuses the batch otherwise)."""
        return all(e is None or e in self.endpoints for e in endpoint_ids)

    def of_message(self, event_type: str, endpoint_id: UUID | None,
                   cache: dict[str, list[_Endpoint]]) -> list[_Endpoint]:
        """Where a message goes, by endpoint id: the endpoint it names if enabled, else every
        enabled endpoint subscribed to its type or to every type."""
        if endpoint_id is not None:
            endpoint = self.endpoints[endpoint_id]
            return [endpoint] if endpoint.enabled else []
        found = cache.get(event_type)
        if found is None:
            found = cache[event_type] = [
                e for e in self.endpoints.values() if e.enabled
                and (e.event_types is None or event_type in e.event_types)]
        return found


class _Plan:
    """The batch's answers, and its rows as COPY text."""

    def __init__(self, batch: Outgoing, bodies: list[str],
                 known: dict[str, tuple[str, int]], targets: _Targets) -> None:
        self._batch, self._bodies, self._head = batch, bodies, targets.head
        fresh: list[int] = []
        first: dict[str, int] = {}  # a key new in the batch -> its first message's position
        repeats: dict[int, str] = {}  # a message whose key was sent before or earlier in it
        cache: dict[str, list[_Endpoint]] = {}
        self._targets: list[list[_Endpoint]] = []
        for n, key in enumerate(batch.keys):
            if key is not None and (key in known or key in first):
                repeats[n] = key
                continue
            if key is not None:
                first[key] = n
            fresh.append(n)
            self._targets.append(targets.of_message(batch.event_types[n],
                                                    batch.endpoint_ids[n], cache))
        ids = new_run_ids(len(fresh) + sum(map(len, self._targets)))
        self._fresh = fresh
        self._message_ids = [f"msg_{i.int:032x}" for i in ids[:len(fresh)]]
        self._run_ids = ids[len(fresh):]
        self._first_run = [0, *accumulate(map(len, self._targets))]
        """Per new message, the index of its first run in ``_run_ids``."""
        mine = {n: (mid, len(t)) for n, mid, t in zip(fresh, self._message_ids, self._targets,
                                                     strict=True)}
        by_key = {**known, **{key: mine[n] for key, n in first.items()}}
        # A repeated key answers with the message it names, not created (as the function does).
        self.answers: list[Sent] = []
        for n in range(len(batch.keys)):
            created = n in mine
            message_id, deliveries = mine[n] if created else by_key[repeats[n]]
            self.answers.append((message_id, created, deliveries))

    @property
    def fresh(self) -> int:
        """How many messages are new (written)."""
        return len(self._fresh)

    def messages(self, start: int, end: int) -> str:
        """The rows of the new messages ``start`` to ``end``."""
        b = self._batch
        return "".join([
            f"{mid}\t{b.event_types[n]}\t{self._bodies[n].replace(_BACKSLASH, _BACKSLASH_2)}\t"
            f"{COPY_NULL if b.endpoint_ids[n] is None else b.endpoint_ids[n]}\t"
            f"{copy_text(b.keys[n])}\n"
            for n, mid in zip(self._fresh[start:end], self._message_ids[start:end],
                              strict=True)])

    def runs(self, start: int, end: int) -> tuple[str, str]:
        """The rows of the runs of the new messages ``start`` to ``end``, and of their
        deliveries."""
        runs: list[str] = []
        deliveries: list[str] = []
        ids = iter(self._run_ids[self._first_run[start]:])
        head = self._head
        for mid, endpoints in zip(self._message_ids[start:end], self._targets[start:end],
                                  strict=True):
            for e in endpoints:
                run_id = f"{next(ids).int:032x}"
                runs.append(f"{run_id}{head}{mid}{e.input_tail}{mid}{e.key_tail}")
                deliveries.append(f"{mid}\t{e.id}\t{run_id}\n")
        return "".join(runs), "".join(deliveries)


# A body needs only its backslashes doubled: the JSON encoder escapes every control character
# inside strings, so none is left raw for COPY to take.
_BACKSLASH, _BACKSLASH_2 = "\\", "\\\\"
