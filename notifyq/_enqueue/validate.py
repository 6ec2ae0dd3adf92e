"""Enqueue: validation at the edge, then one statement.

Single enqueues go through the SQL function ``_enqueue`` (the same code path as
``SELECT notifyq.enqueue(...)`` from any language: defaults from the job definition, dedupe,
validation); bulk enqueues send the whole batch as one jsonb array. Outside a caller's transaction
the wake-up is sent after commit through the :class:`~notifyq._notifier.WakeSender`, which folds
concurrent enqueues into one NOTIFY instead of making every commit take PostgreSQL's notify lock.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from itertools import repeat
from typing import Any

import psycopg

from notifyq._errors import ConcurrencyRejected, InvalidEnqueue, PayloadTooLarge, UnknownJobType

JOB_TYPE = re.compile(r"^[a-z0-9_][a-z0-9_.:-]{0,127}$")
POOL = re.compile(r"^[a-z0-9_][a-z0-9_.:-]{0,63}$")
MAX_INPUT_BYTES = 65_536
PRIORITY_RANGE = (-1000, 1000)
MAX_ATTEMPTS_RANGE = (1, 1000)
_PRIORITY_MIN, _PRIORITY_MAX = PRIORITY_RANGE
_ATTEMPTS_MIN, _ATTEMPTS_MAX = MAX_ATTEMPTS_RANGE
RUN_AT_RANGE = (datetime(2000, 1, 1, tzinfo=UTC), datetime(3000, 1, 1, tzinfo=UTC))
MAX_TAGS = 32
MAX_TAG_LEN = 128
MAX_DEDUPE_KEY_LEN = 512
CONCURRENCY_REJECTED = "NQ409"
"""SQLSTATE the SQL function raises when a "reject" concurrency key is busy."""
UNKNOWN_JOB_TYPE = "NQ422"
"""SQLSTATE of every enqueue path for a type no worker has registered (migration 0007)."""
RUN_STATUSES = ("pending", "running", "waiting", "completed", "failed", "timed_out", "canceled")
LIVE_STATUSES = ("pending", "running", "waiting")
DEDUPE_STATES = (*LIVE_STATUSES, "completed")
"""What a dedupe key matches by default: live runs whatever their age, completed ones within
the window. Failed, timed-out and canceled runs do not block enqueueing the key again."""


def new_run_id() -> uuid.UUID:
    """A UUIDv7 run id (RFC 9562): Unix milliseconds, version 7, variant, then bits that count
    up within the millisecond (see :func:`new_run_ids`), so ids sort by creation time whoever
    made them, and in creation order within one process."""
    return new_run_ids(1)[0]


_new_object = object.__new__
_set_uuid_int = uuid.UUID.__dict__["int"].__set__
_set_uuid_is_safe = uuid.UUID.__dict__["is_safe"].__set__


class _Counter:
    """The last id this process made, so the next ones follow it (RFC 9562 §6.2, method 1: a
    counter in the random bits). The first id of a millisecond has random rand_a (12 bits) and
    a random rand_b below 2**61; each next id of that millisecond is the previous one plus 1,
    which never carries into the variant bits (2**61 ids a millisecond would be needed). A clock
    that steps back keeps counting on the last millisecond, so ids never go back. Ids of other
    processes interleave by millisecond only."""

    __slots__ = ("last", "lock", "millis")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.millis = -1
        self.last = 0

    def take(self, n: int) -> int:
        """The first of ``n`` consecutive id values, all greater than any taken before."""
        now = time.time_ns() // 1_000_000
        with self.lock:
            if now > self.millis:
                seed = int.from_bytes(os.urandom(10), "big")
                self.millis = now
                first = ((now & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (seed >> 64 & 0xFFF) << 64
                         | 0b10 << 62 | seed & (1 << 61) - 1)
            else:
                first = self.last + 1
            self.last = first + n - 1
        return first


_COUNTER = _Counter()
# A forked child must not count on from its parent's last id (both would make the same ids).
os.register_at_fork(after_in_child=_COUNTER.reset)


def new_run_ids(n: int) -> list[uuid.UUID]:
    """``n`` UUIDv7 run ids, increasing: in the order given, and after every id this process
    made before (FIFO at equal priority and run_at follows the id).

    ``UUID(int=...)`` costs ~1.5 us an id in its argument checks, and a call of
    :func:`new_run_id` each ~2.6 us; a batch of 1,000 costs ~0.4 us an id here. The UUIDs are
    built the way ``UUID.__init__`` ends (its two slots set directly), from values that are
    valid by construction. Consecutive ids differ by one: they are unique and ordered, not
    secret."""
    first = _COUNTER.take(n)
    ids: list[uuid.UUID] = list(map(_new_object, repeat(uuid.UUID, n)))
    deque(map(_set_uuid_int, ids, range(first, first + n)), maxlen=0)
    deque(map(_set_uuid_is_safe, ids, repeat(uuid.SafeUUID.unknown, n)), maxlen=0)
    return ids


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueRequest:
    """One run to enqueue (``App.enqueue_many`` takes a list of these, or of dicts)."""

    job_type: str
    input: Any = field(default_factory=dict)
    run_at: datetime | None = None
    priority: int | None = None
    pool: str | None = None
    max_attempts: int | None = None
    dedupe_key: str | None = None
    tags: Sequence[str] | None = None
    tenant_id: str | None = None
    # Normally filled from the handler's policies; given here they override them.
    dedupe_window_s: float | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    concurrency_collision: str | None = None
    scope_entity_type: str | None = None
    scope_entity_id: str | None = None
    dedupe_states: Sequence[str] | None = None

    @property
    def needs_locks(self) -> bool:
        """Dedupe and concurrency keys are decided under advisory locks, one run at a time."""
        return self.dedupe_key is not None or self.concurrency_key is not None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated request: the input already serialized (it was, to measure it)."""

    request: EnqueueRequest
    input_json: str
    id: uuid.UUID

    def params(self, *, notify: bool, allow_unknown_type: bool = False) -> dict[str, Any]:
        """The parameters of ``job_run_enqueue`` (the SQL function)."""
        r = self.request
        return {
            "job_type": r.job_type, "input": self.input_json, "run_at": r.run_at,
            "priority": r.priority, "pool": r.pool, "max_attempts": r.max_attempts,
            "dedupe_key": r.dedupe_key, "tags": list(r.tags) if r.tags is not None else None,
            "id": self.id, "notify": notify, "trigger_source": "manual", "trigger_ref": None,
            "dedupe_window_s": r.dedupe_window_s, "concurrency_key": r.concurrency_key,
            "concurrency_limit": r.concurrency_limit,
            "concurrency_collision": r.concurrency_collision,
            "scope_entity_type": r.scope_entity_type, "scope_entity_id": r.scope_entity_id,
            "tenant_id": r.tenant_id, "allow_unknown_type": allow_unknown_type,
            "dedupe_states": list(r.dedupe_states) if r.dedupe_states is not None else None,
        }

    def record(self) -> str:
        """This request as one element of the bulk insert's jsonb array."""
        r = self.request
        fields_ = {
            "id": str(self.id), "job_type": r.job_type, "pool": r.pool, "priority": r.priority,
            "run_at": r.run_at.isoformat() if r.run_at else None,
            "max_attempts": r.max_attempts, "tags": list(r.tags) if r.tags is not None else None,
            "scope_entity_type": r.scope_entity_type, "scope_entity_id": r.scope_entity_id,
            "tenant_id": r.tenant_id,
        }
        # Null keys left out: jsonb_to_recordset reads a missing key as NULL, and parses each
        # key it is sent (~0.25 us of server time a key).
        head = json.dumps({k: v for k, v in fields_.items() if v is not None},
                          separators=(",", ":"))
        return f'{head[:-1]},"input":{self.input_json}}}'


def prepare(request: EnqueueRequest, max_input_bytes: int = MAX_INPUT_BYTES) -> Prepared:
    """Validate a request; raise InvalidEnqueue naming the problem."""
    input_json = check_request(request, pool=request.pool, priority=request.priority,
                               max_attempts=request.max_attempts, max_input_bytes=max_input_bytes)
    return Prepared(request, input_json, new_run_id())


def check_request(request: EnqueueRequest, *, pool: str | None, priority: int | None,
                  max_attempts: int | None, max_input_bytes: int = MAX_INPUT_BYTES,
                  encode: Callable[[Any], str] | None = None) -> str:
    """:func:`prepare`'s checks, in its order, with ``pool``, ``priority`` and ``max_attempts``
    given apart (bulk enqueue fills a handler's defaults in without copying the request);
    returns the input serialized. ``encode`` is a batch's :func:`input_encoder`."""
    # Each check accepts the common case inline and leaves the rest (and the message) to its
    # function: ~1 us less a request in bulk.
    job_type = request.job_type
    if not (type(job_type) is str and JOB_TYPE.fullmatch(job_type)):
        _check_type(job_type)
    input_json = encode_input(request.input, max_input_bytes, encode)
    if pool is not None and not (isinstance(pool, str) and POOL.fullmatch(pool)):
        raise InvalidEnqueue(f"invalid pool {pool!r}: it must match {POOL.pattern}")
    if priority is not None and not (
            type(priority) is int and _PRIORITY_MIN <= priority <= _PRIORITY_MAX):
        _check_range("priority", priority, PRIORITY_RANGE)
    if max_attempts is not None and not (
            type(max_attempts) is int and _ATTEMPTS_MIN <= max_attempts <= _ATTEMPTS_MAX):
        _check_range("max_attempts", max_attempts, MAX_ATTEMPTS_RANGE)
    r = request
    if (r.run_at is None and r.tags is None and r.dedupe_key is None and r.tenant_id is None
            and r.concurrency_key is None and r.concurrency_collision is None
            and r.concurrency_limit is None and r.dedupe_window_s is None
            and r.scope_entity_type is None and r.scope_entity_id is None
            and r.dedupe_states is None):
        return input_json  # nothing more to check: the common case, ~1 us less a request
    _check_run_at(r.run_at)
    _check_tags(r.tags)
    key = r.dedupe_key
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_DEDUPE_KEY_LEN):
        raise InvalidEnqueue(f"dedupe_key must be a string of 1 to {MAX_DEDUPE_KEY_LEN} characters")
    _check_durable(r)
    return input_json


def _check_durable(request: EnqueueRequest) -> None:
    for name in ("tenant_id", "concurrency_key", "scope_entity_type", "scope_entity_id"):
        value = getattr(request, name)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 512):
            raise InvalidEnqueue(f"{name} must be a string of 1 to 512 characters")
    if request.concurrency_collision not in (None, "queue", "reject", "replace"):
        raise InvalidEnqueue("concurrency_collision must be queue, reject or replace, got "
                             f"{request.concurrency_collision!r}")
    _check_range("concurrency_limit", request.concurrency_limit, (1, 100_000))
    window = request.dedupe_window_s
    if window is not None and (not isinstance(window, int | float) or window <= 0):
        raise InvalidEnqueue(f"dedupe_window_s must be a positive number, got {window!r}")
    check_dedupe_states(request.dedupe_states, InvalidEnqueue)


def check_dedupe_states(states: Sequence[str] | None, error: type[Exception]) -> None:
    """Dedupe states are a non-empty list of run statuses (``DedupePolicy(states=...)``)."""
    if states is None:
        return
    if isinstance(states, str) or not states or not set(states) <= set(RUN_STATUSES):
        raise error(f"dedupe states must be a non-empty list of run statuses "
                    f"({', '.join(RUN_STATUSES)}), got {states!r}")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def input_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, allow_nan=False)`` for one batch of inputs.

    ``json.dumps`` builds an encoder at every call: 2.1 us for a small object against 0.9 us
    for the C encoder built once (json's own ``c_make_encoder``, with the same arguments
    ``JSONEncoder.iterencode`` gives it). One per batch, never shared: its circular-reference
    markers are not safe across threads."""
    make: Callable[..., Callable[[Any, int], list[str]]] | None = getattr(
        json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - an interpreter without the _json accelerator
        return _ENCODER.encode
    try:
        encoder = make({}, _ENCODER.default, json.encoder.encode_basestring, None,
                       _ENCODER.key_separator, _ENCODER.item_separator, False, False, False)
    except TypeError:  # pragma: no cover - another signature in another Python version
        return _ENCODER.encode
    join = "".join

    def encode(value: Any) -> str:
        return join(encoder(value, 0))
    return encode


def encode_input(value: Any, max_input_bytes: int = MAX_INPUT_BYTES,
                 encode: Callable[[Any], str] | None = None) -> str:
    """Serialize a run's input; it must be a JSON object or array within the size limit."""
    if type(value) is not dict and not isinstance(value, Mapping | list | tuple):
        raise InvalidEnqueue(
            f"input must be a JSON object or array, got {type(value).__name__}")
    try:
        # Default separators (", ", ": ") are jsonb's text form, which the SQL function and
        # the database measure: compact JSON would let [0, 0, ...] pass here at 60 KB and be
        # refused there at 90 KB.
        text = (encode or _ENCODER.encode)(value)
    except (TypeError, ValueError) as exc:
        raise InvalidEnqueue(f"input is not JSON-serializable: {exc}") from None
    if text.isascii() and "\\u0000" not in text:  # the common case: nothing jsonb refuses,
        size = len(text)                           # and as many bytes as characters
    else:
        problem = jsonb_problem(text)
        if problem:
            raise InvalidEnqueue(
                f"input contains {problem}, which PostgreSQL's jsonb cannot store")
        size = len(text.encode())
    if size > max_input_bytes:
        raise PayloadTooLarge(size, max_input_bytes)
    return text


_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def has_nul(json_text: str) -> bool:
    """Whether JSON text holds a U+0000 escape (not a literal backslash followed by "u0000")."""
    return "\\u0000" in json_text and _NUL_ESCAPE.search(json_text) is not None


def jsonb_problem(json_text: str) -> str | None:
    """Why jsonb cannot store this JSON text (dumped with ``ensure_ascii=False``), or None."""
    if has_nul(json_text):
        return "a NUL character (\\u0000)"
    try:
        json_text.encode()
    except UnicodeEncodeError:
        return "an unpaired surrogate (not valid Unicode)"
    return None


def parse_input(text: str) -> Any:
    """Parse JSON text given on a command line or in an HTTP body; refuse what is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidEnqueue(f"input is not valid JSON: {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}") from None


def coerce_requests(items: Iterable[EnqueueRequest | Mapping[str, Any]]) -> list[EnqueueRequest]:
    out = []
    for index, item in enumerate(items):
        if isinstance(item, EnqueueRequest):
            out.append(item)
        elif type(item) is dict and "job_type" in item and item.keys() <= _REQUEST_FIELDS:
            out.append(_request_of(item))
        else:
            try:
                out.append(EnqueueRequest(**item))
            except TypeError as exc:
                raise InvalidEnqueue(f"item {index}: {exc}") from None
    return out


_REQUEST_FIELDS = frozenset(f.name for f in fields(EnqueueRequest))
_REQUEST_SLOTS = tuple((f.name, EnqueueRequest.__dict__[f.name].__set__)
                       for f in fields(EnqueueRequest) if f.name != "input")
_set_request_input = EnqueueRequest.__dict__["input"].__set__


def _request_of(item: dict[str, Any]) -> EnqueueRequest:
    """``EnqueueRequest(**item)`` for a dict of known keys: 2.8 -> 1.7 us, its slots set
    directly (the dataclass has no ``__post_init__``); anything else goes through the
    constructor, for its errors."""
    request: EnqueueRequest = _new_object(EnqueueRequest)
    for name, set_slot in _REQUEST_SLOTS:
        set_slot(request, item.get(name))
    _set_request_input(request, item.get("input", {}))
    return request


def _check_type(job_type: object) -> None:
    if not isinstance(job_type, str) or not JOB_TYPE.fullmatch(job_type):
        raise InvalidEnqueue(f"invalid job type {job_type!r}: it must match {JOB_TYPE.pattern}")


def _check_range(name: str, value: int | None, bounds: tuple[int, int]) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEnqueue(f"{name} must be an integer, got {type(value).__name__}")
    if not bounds[0] <= value <= bounds[1]:
        raise InvalidEnqueue(f"{name} {value} is out of range [{bounds[0]}, {bounds[1]}]")


def _check_run_at(run_at: datetime | None) -> None:
    if run_at is None:
        return
    if not isinstance(run_at, datetime) or run_at.tzinfo is None:
        raise InvalidEnqueue("run_at must be a timezone-aware datetime")
    if not RUN_AT_RANGE[0] <= run_at < RUN_AT_RANGE[1]:
        raise InvalidEnqueue(
            f"run_at {run_at.isoformat()} is out of range [2000-01-01, 3000-01-01)")


def _check_tags(tags: Sequence[str] | None) -> None:
    if tags is None:
        return
    if isinstance(tags, str) or len(tags) > MAX_TAGS or not all(
        isinstance(t, str) and 0 < len(t) <= MAX_TAG_LEN for t in tags
    ):
        raise InvalidEnqueue(
            f"tags must be a list of at most {MAX_TAGS} strings of 1 to {MAX_TAG_LEN} characters")


def translate_db_error(exc: Exception) -> Exception:
    """Map the SQL function's validation errors to the Python ones (same messages)."""
    diag = getattr(exc, "diag", None)
    message = getattr(diag, "message_primary", None) or ""
    if not message.startswith("notifyq: "):
        return exc
    text = message.removeprefix("notifyq: ")
    if getattr(exc, "sqlstate", None) == CONCURRENCY_REJECTED:
        return ConcurrencyRejected(text)
    if getattr(exc, "sqlstate", None) == UNKNOWN_JOB_TYPE:
        return UnknownJobType(text)
    if getattr(exc, "sqlstate", None) == "54000":
        match = re.search(r"input is (\d+) bytes; the limit is (\d+)", text)
        if match:
            return PayloadTooLarge(int(match[1]), int(match[2]))
    return InvalidEnqueue(text)


@contextmanager
def translated_errors() -> Iterator[None]:
    """The SQL refusals (validation 22023/54000, NQ409, NQ422) become the Python errors, by
    :func:`translate_db_error`; other database errors pass through."""
    try:
        yield
    except psycopg.DatabaseError as exc:
        translated = translate_db_error(exc)
        if translated is exc:
            raise
        raise translated from None
