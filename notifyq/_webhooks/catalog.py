"""The event-type catalog: the event types an application sends, each with a description and an
optional JSON Schema (draft 2020-12) that its payloads must match.

Once the catalog holds a type, a send of a type it does not hold, and an endpoint subscribing to
one, are refused (``webhooks.allow_unknown_event_types`` lets them through); an empty catalog
refuses nothing, so an application adopts it when it is ready. Checks run where messages enter
(``send``, ``send_many``, the HTTP API): a plain SQL send is not checked.

Each process reads the catalog at most every :data:`CATALOG_TTL_S` seconds (a send pays no
extra round trip in between); a change made by this process is seen at once, one made by
another within the TTL.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from notifyq._errors import InvalidEndpoint, InvalidEnqueue

CATALOG_TTL_S = 5.0
MAX_SCHEMA_BYTES = 65_536
MAX_ERRORS_SHOWN = 3
MAX_ERROR_CHARS = 200


@dataclass(frozen=True, slots=True)
class EventType:
    name: str
    description: str
    schema: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "schema": self.schema,
                "created_at": self.created_at.isoformat(),
                "updated_at": self.updated_at.isoformat()}


def check_schema(name: str, schema: Any) -> dict[str, Any] | None:
    """``schema`` if it is a valid JSON Schema (an object), else InvalidEndpoint naming why."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise InvalidEndpoint(f"schema: the schema of {name!r} must be a JSON object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(top)"
        raise InvalidEndpoint(f"schema: not a valid JSON Schema at {where}: "
                              f"{exc.message}") from None
    return schema


def _short(text: str) -> str:
    """A validator's message quotes the offending value: keep a refusal one readable line."""
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


class Catalog:
    """This process's copy of the catalog, refreshed from ``load`` when older than the TTL."""

    def __init__(self, load: Callable[[], Awaitable[list[EventType]]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self._clock = clock
        self._read_at = -CATALOG_TTL_S
        self._validators: dict[str, Draft202012Validator | None] = {}

    def forget(self) -> None:
        """Read the catalog again at the next check (this process changed it)."""
        self._read_at = -CATALOG_TTL_S

    async def _current(self) -> dict[str, Draft202012Validator | None]:
        now = self._clock()
        if now - self._read_at >= CATALOG_TTL_S:
            self._validators = {t.name: None if t.schema is None else
                                Draft202012Validator(t.schema) for t in await self._load()}
            self._read_at = now
        return self._validators

    async def check_messages(self, messages: list[tuple[str, Any]], *, allow_unknown: bool,
                             numbered: bool) -> None:
        """InvalidEnqueue for the first (event_type, payload) the catalog refuses; ``numbered``
        names its position from 1 ("message N: ..."), as send_many's refusals do."""
        types = await self._current()
        if not types:
            return
        for n, (event_type, payload) in enumerate(messages, 1):
            where = f"message {n}: " if numbered else ""
            if event_type not in types:
                if allow_unknown:
                    continue
                raise InvalidEnqueue(
                    f"{where}event_type {event_type!r} is not in the event-type catalog "
                    "(define it with app.webhooks.define_event_type or `notifyq webhooks "
                    "event-types define`, or set webhooks.allow_unknown_event_types)")
            validator = types[event_type]
            if validator is None:
                continue
            errors = sorted(validator.iter_errors(payload), key=lambda e: list(e.path))
            if errors:
                shown = "; ".join(f"at {'/'.join(str(p) for p in e.path) or '(top)'}: "
                                  f"{_short(e.message)}" for e in errors[:MAX_ERRORS_SHOWN])
                more = (f" (and {len(errors) - MAX_ERRORS_SHOWN} more)"
                        if len(errors) > MAX_ERRORS_SHOWN else "")
                raise InvalidEnqueue(f"{where}payload does not match the schema of "
                                     f"{event_type!r}: {shown}{more}")

    async def check_subscription(self, event_types: list[str] | None, *,
                                 allow_unknown: bool) -> None:
        """InvalidEndpoint when an endpoint would subscribe to a type the catalog lacks."""
        if event_types is None or allow_unknown:
            return
        types = await self._current()
        unknown = [t for t in event_types if types and t not in types]
        if unknown:
            raise InvalidEndpoint(f"event_types: {', '.join(map(repr, unknown))} not in the "
                                  "event-type catalog")
