"""Bulk enqueue by COPY: how ``App.enqueue_many`` writes the plain runs of a large batch.

Two statements instead of ``job_run_insert_bulk``'s one: ``job_run_copy_defaults`` reads what
the INSERT would join (each type's stored definition, the unknown-type refusal, now()), then
``job_run_copy`` streams the rows with those values filled in, a chunk at a time, so Python
validates and formats the next chunk while the server inserts the last. The input size limit
is Python's alone here (``encode_input`` measures as jsonb prints). The rows' wake-up follows
(:mod:`.write`).

Why (2-core VM, batches of 1,000 ``{"i": n}`` runs of one type, 2026-12-03): the INSERT parses
the batch's jsonb array, then each record, then each input again as it becomes a column, and
waits for the whole array before it starts; a bare COPY of the same rows into job_run took
10.5-13 us of server CPU a row against 16.5-18.5, and 55-75k rows/s against 26-30k for
``enqueue_many`` as it was. Chunks of 250 rows beat one write of 1,000 (55-59k) and chunks of
100 (37-48k: each write wakes the server). The requests are validated a chunk at a time too,
and the runs to return built, while the server inserts the chunk before: ``enqueue_many`` of
1,000 such runs, best and median of 60 batches, alternated 3 times, 48-52k / 36-40k rows/s ->
61-73k / 45-56k. Below :data:`COPY_MIN_RUNS` runs the INSERT's one round trip wins.

Where a batch of 1,000 goes now (means of 40, three runs): the definitions' round trip
0.8-1.2 ms; Python validating 3.9-4.7 ms, formatting 0.9-1.1, building the runs 3.7-4.8
(collections of the batch's objects included), writing 0.4-0.5; then waiting 7.5-10.7 ms for
the server to finish after the last write; the wake-up 0.6-0.9. The server is the slower side:
COPY of prepared rows with no Python in between takes 15-18 us a row of wall time (8-13 us of
its CPU). Flushing each chunk to the socket at once (psycopg leaves up to 1 MiB in libpq's
buffer, which sends whole 8 KiB blocks) made no difference, alternated three times.

A type whose definition fills a scope id or a rate key from a template (only the INSERT's SQL
functions do) sends the batch by ``job_run_insert_bulk`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from notifyq._db.queries import Queries
from notifyq._enqueue.bulk import Batch, Shape, applied
from notifyq._enqueue.ids import new_run_ids
from notifyq._enqueue.request import EnqueueRequest
from notifyq._run import Run

COPY_MIN_RUNS = 300
"""The fewest plain runs a batch sends by COPY; smaller ones go by ``job_run_insert_bulk``:
COPY's two more round trips cost what it saves up to a few hundred runs (best of 200 batches,
head -> COPY: 100 runs 34-44k -> 36-37k/s, 200 runs 46-47k -> 37-38k/s, 400 runs 41-43k ->
45-50k/s, 700 runs 39-50k -> 50-59k/s)."""
CHUNK_RUNS = 250
"""Runs per write of the COPY stream, after the first."""
FIRST_CHUNK_RUNS = 100
"""The first write's runs: fewer, so the server starts sooner (it waits for the first chunk
while Python validates it)."""

_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
COPY_NULL = "\\N"
# An input needs only its backslashes doubled: the JSON encoder escapes every control character
# (tab, newline and CR included) inside strings, so none is left raw for COPY to take.
_BACKSLASH, _BACKSLASH_2 = "\\", "\\\\"


async def copy_runs(conn: psycopg.AsyncConnection[Any], queries: Queries,
                    requests: Sequence[EnqueueRequest], batch: Batch,
                    fill: Callable[[Batch, Sequence[EnqueueRequest]], object], *,
                    types: list[str], accept_types: list[str],
                    trace_context: str | None) -> list[Run] | None:
    """Write ``requests`` (plain runs of ``types``) by COPY and return their runs, or None,
    having written nothing, when a type needs ``job_run_insert_bulk``. ``fill`` validates
    requests into ``batch`` (empty at first), a chunk at a time while the server inserts the
    last; the first bad one raises, and the COPY, aborted, writes nothing. Raises what the
    INSERT would for an unknown type (the database's NQ422)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.job_run_copy_defaults,
                          {"types": types, "accept_types": accept_types or None})
        defaults = await cur.fetchall()
        if any(d["templated"] for d in defaults):
            return None
        ids = new_run_ids(len(requests))
        rows = _Rows(defaults, trace_context)
        runs: list[Run] = []
        async with cur.copy(queries.job_run_copy) as copy:
            start = 0
            while start < len(requests):
                # A short first chunk, so the server starts on it sooner.
                end = min(start + (CHUNK_RUNS if start else FIRST_CHUNK_RUNS), len(requests))
                fill(batch, requests[start:end])  # plain runs only: row i is request i
                await copy.write(rows.text(batch, ids, start, end))
                runs += batch.runs(ids[start:end], defaults, start)  # while the server inserts
                start = end
    return runs


class _Rows:
    """Formats a batch's rows as ``job_run_copy``'s input (text format)."""

    def __init__(self, defaults: Sequence[Mapping[str, Any]], trace_context: str | None) -> None:
        self.now: datetime = defaults[0]["now"]
        self._stored = {d["type"]: d for d in defaults}
        self._trace = COPY_NULL if trace_context is None else copy_text(trace_context)
        self._fixed: dict[Shape, _Fixed] = {}
        self._tails: dict[Shape, str] = {}

    def text(self, batch: Batch, ids: list[UUID], start: int, end: int) -> str:
        """Rows ``start`` to ``end`` of ``batch``."""
        if batch.shapes_only:  # no run_at, tags, scope or tenant yet: one tail per shape
            tails = self._tails
            for shape in dict.fromkeys(batch.shapes[start:end]):
                if shape not in tails:
                    tails[shape] = self._tail(shape)
            return "".join([
                f"{run_id.int:032x}\t{text.replace(_BACKSLASH, _BACKSLASH_2)}\t{tails[shape]}"
                for run_id, text, shape in zip(ids[start:end], batch.inputs[start:end],
                                               batch.shapes[start:end], strict=True)])
        return "".join([
            self._fixed_of(shape).row(run_id, text, request, self.now, self._trace)
            for run_id, text, request, shape in zip(
                ids[start:end], batch.inputs[start:end], batch.requests[start:end],
                batch.shapes[start:end], strict=True)])

    def _fixed_of(self, shape: Shape) -> _Fixed:
        fixed = self._fixed.get(shape)
        if fixed is None:
            fixed = self._fixed[shape] = _Fixed.of(shape, self._stored[shape[0]])
        return fixed

    def _tail(self, shape: Shape) -> str:
        at = self.now.isoformat()
        return self._fixed_of(shape).tail(None, at, created_at=at, tags="{}", scope_id=None,
                                          tenant_id=None, trace=self._trace)


@dataclass(frozen=True, slots=True)
class _Fixed:
    """What a shape's rows share, as COPY text: ``head`` the columns from job_type to
    timeout_s, ``defaulted``; and the stored scope entity type, unless a row gives its own."""

    head: str
    scope_type: str | None
    defaulted: str

    @classmethod
    def of(cls, shape: Shape, stored: Mapping[str, Any]) -> _Fixed:
        job_type, pool, priority, max_attempts, timeout_s = applied(shape, stored)
        version = 1 if stored["version"] is None else stored["version"]
        head = "\t".join((job_type, str(version), copy_text(pool), str(priority),
                          str(max_attempts), COPY_NULL if timeout_s is None else repr(timeout_s)))
        # For a type no worker has registered, as job_run_insert_bulk records it: which of the
        # three its definition may fill in later (job_run_apply_definitions).
        defaulted = COPY_NULL if stored["known"] else str(
            (shape[1] is None) + 2 * (shape[2] is None) + 4 * (shape[3] is None))
        return cls(head, stored["scope_entity_type"], defaulted)

    def row(self, run_id: UUID, text: str, request: EnqueueRequest, now: datetime,
            trace: str) -> str:
        """One row of a batch with run_at, tags, scope or tenant given."""
        r = request
        return (f"{run_id.int:032x}\t{text.replace(_BACKSLASH, _BACKSLASH_2)}\t" + self.tail(
            r.scope_entity_type, (now if r.run_at is None else r.run_at).isoformat(),
            created_at=now.isoformat(),
            tags="{}" if not r.tags else copy_text(_array_literal(r.tags)),
            scope_id=r.scope_entity_id, tenant_id=r.tenant_id, trace=trace))

    def tail(self, scope_type: str | None, run_at: str, *, created_at: str, tags: str,
             scope_id: str | None, tenant_id: str | None, trace: str) -> str:
        """A row's columns after the input, in job_run_copy's order (the one place it is
        written in Python): ``tags`` and ``trace`` already COPY text."""
        scope_type = self.scope_type if scope_type is None else scope_type
        return (f"{self.head}\t{copy_text(scope_type)}\t{self.defaulted}\t{run_at}\t"
                f"{created_at}\t{tags}\t{copy_text(scope_id)}\t{copy_text(tenant_id)}\t"
                f"{trace}\n")


def copy_text(value: str | None) -> str:
    """A text column in COPY's text format (None: NULL)."""
    return COPY_NULL if value is None else value.translate(_COPY_ESCAPES)


def _array_literal(values: Sequence[str]) -> str:
    """A text[] literal, every element quoted."""
    return "{" + ",".join(
        '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"
