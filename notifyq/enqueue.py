"""Enqueue: validation at the edge, then one statement.

Single enqueues go through the SQL function ``_enqueue`` (the same code path as
``SELECT notifyq.enqueue(...)`` from any language: defaults from the job definition, dedupe,
validation); bulk enqueues send the whole batch as one jsonb array. Outside a caller's transaction
the wake-up is sent after commit through the :class:`~notifyq.notifier.WakeSender`, which folds
concurrent enqueues into one NOTIFY instead of making every commit take PostgreSQL's notify lock.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from notifyq.errors import ConcurrencyRejected, InvalidEnqueue, PayloadTooLarge

JOB_TYPE = re.compile(r"^[a-z0-9_][a-z0-9_.:-]{0,127}$")
POOL = re.compile(r"^[a-z0-9_][a-z0-9_.:-]{0,63}$")
MAX_INPUT_BYTES = 65_536
PRIORITY_RANGE = (-1000, 1000)
MAX_ATTEMPTS_RANGE = (1, 1000)
RUN_AT_RANGE = (datetime(2000, 1, 1, tzinfo=UTC), datetime(3000, 1, 1, tzinfo=UTC))
MAX_TAGS = 32
MAX_TAG_LEN = 128
MAX_DEDUPE_KEY_LEN = 512
CONCURRENCY_REJECTED = "NQ409"
"""SQLSTATE the SQL function raises when a "reject" concurrency key is busy."""


def new_run_id() -> uuid.UUID:
    """A UUIDv7 run id (RFC 9562): Unix milliseconds, version 7, variant, random bits — the
    layout of the SQL ``uuid7()``, so ids sort by creation time whoever made them."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 random bits, 74 of them used
    value = (millis & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64
    value |= 0b10 << 62 | rand & (1 << 62) - 1
    return uuid.UUID(int=value)


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

    def params(self, *, notify: bool) -> dict[str, Any]:
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
            "tenant_id": r.tenant_id,
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
        head = json.dumps(fields_, separators=(",", ":"))
        return f'{head[:-1]},"input":{self.input_json}}}'


def prepare(request: EnqueueRequest, max_input_bytes: int = MAX_INPUT_BYTES) -> Prepared:
    """Validate a request; raise InvalidEnqueue naming the problem."""
    _check_type(request.job_type)
    input_json = encode_input(request.input, max_input_bytes)
    pool = request.pool
    if pool is not None and not (isinstance(pool, str) and POOL.match(pool)):
        raise InvalidEnqueue(f"invalid pool {request.pool!r}: it must match {POOL.pattern}")
    _check_range("priority", request.priority, PRIORITY_RANGE)
    _check_range("max_attempts", request.max_attempts, MAX_ATTEMPTS_RANGE)
    _check_run_at(request.run_at)
    _check_tags(request.tags)
    key = request.dedupe_key
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= MAX_DEDUPE_KEY_LEN):
        raise InvalidEnqueue(f"dedupe_key must be a string of 1 to {MAX_DEDUPE_KEY_LEN} characters")
    _check_durable(request)
    return Prepared(request, input_json, new_run_id())


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


def encode_input(value: Any, max_input_bytes: int = MAX_INPUT_BYTES) -> str:
    """Serialize a run's input; it must be a JSON object or array within the size limit."""
    if not isinstance(value, Mapping | list | tuple):
        raise InvalidEnqueue(
            f"input must be a JSON object or array, got {type(value).__name__}")
    try:
        # Default separators (", ", ": ") are jsonb's text form, which the SQL function and
        # the database measure: compact JSON would let [0, 0, ...] pass here at 60 KB and be
        # refused there at 90 KB.
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidEnqueue(f"input is not JSON-serializable: {exc}") from None
    problem = jsonb_problem(text)
    if problem:
        raise InvalidEnqueue(f"input contains {problem}, which PostgreSQL's jsonb cannot store")
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
            continue
        try:
            out.append(EnqueueRequest(**item))
        except TypeError as exc:
            raise InvalidEnqueue(f"item {index}: {exc}") from None
    return out


def _check_type(job_type: object) -> None:
    if not isinstance(job_type, str) or not JOB_TYPE.match(job_type):
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
    if getattr(exc, "sqlstate", None) == "54000":
        match = re.search(r"input is (\d+) bytes; the limit is (\d+)", text)
        if match:
            return PayloadTooLarge(int(match[1]), int(match[2]))
    return InvalidEnqueue(text)
