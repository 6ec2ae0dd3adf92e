"""The database's refusals of an enqueue, as the Python errors: the SQL functions raise
SQLSTATEs that only this module translates."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from notifyq._errors import ConcurrencyRejected, InvalidEnqueue, PayloadTooLarge, UnknownJobType

CONCURRENCY_REJECTED = "NQ409"
"""SQLSTATE the SQL function raises when a "reject" concurrency key is busy."""
UNKNOWN_JOB_TYPE = "NQ422"
"""SQLSTATE of every enqueue path for a type no worker has registered (migration 0007)."""


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
