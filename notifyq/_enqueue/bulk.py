"""Bulk enqueue: what ``App.enqueue_many`` sends, and the runs it gives back.

A :class:`Batch` collects validated requests column by column; the plain ones (no dedupe or
concurrency key) go into the database as one jsonb array of compact records in one statement
(``job_run_insert_bulk``), which sends back no row per run: only how many rows went in, its
``now()`` and the stored definitions it applied. :meth:`Batch.runs` then builds the runs with the
same coalesce the SQL applies. Runs with keys are enqueued one at a time by the caller, as
before, after the plain ones.

Why it looks like this (``notifyq bench --only bulk``, batches of 1,000, 2-core VM shared with
other benchmarks at load 1.5-2; CPU per run from ``time.process_time`` and the backend's
/proc CPU time, medians of 3 interleaved rounds):

    before: 10-13k jobs/s; 46-64 us of Python and 30-40 us of server CPU per run
    after:  30-36k jobs/s; 11-14 us of Python and 15-19 us of server CPU per run

Python went on a ``dataclasses.replace`` per request for the handler's defaults (~8 us),
``json.dumps`` building an encoder at every call (~2 us), ``new_run_id`` and ``str(uuid)``
(~3.5 us), and decoding 18 returned columns into ``Run(...)`` (~12 us). Those are now paid once a
batch or once a job type, or replaced by cheaper paths (``input_encoder``, ``new_run_ids``,
``runs_from_columns``, the dict path of ``coerce_requests``). The server's share is in
``job_run_insert_bulk`` and migration 0005 (the name CHECKs of job_run cost 8-13 us a row of it).

Tried and dropped: sending the batch as chunks of 125-500 rows in pipeline mode, so Python
prepares the next chunk while the server inserts the last: more CPU on both sides (Python 11 ->
15-20 us, server 15 -> 18-22 us a run: a statement's fixed costs, pipeline bookkeeping) and no
faster. Server-made ids (``uuid7()`` in the INSERT): ~1.5 us a row more server CPU, which is the
scarcer side, plus ids to send back and match. Building runs lazily: the return type is a
``list[Run]``, and a lazy list subclass is wrong under CPython's list fast paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any
from uuid import UUID

from notifyq._enqueue.ids import new_run_ids
from notifyq._enqueue.request import EnqueueRequest, Prepared, check_request
from notifyq._enqueue.validate import input_encoder
from notifyq._run import Run, RunStatus, runs_from_columns

Resolved = tuple[str | None, int | None, int | None]
"""A row's (pool, priority, max_attempts) after the handler's defaults: None where the stored
job definition (or the table default) decides."""
Shape = tuple[str, str | None, int | None, int | None]
"""A plain row's job type and its :data:`Resolved` values: all its record and run depend on,
unless it has a run_at, tags, a scope or a tenant."""


class Batch:
    """The requests of one ``enqueue_many`` call, validated, in the order given."""

    def __init__(self, max_input_bytes: int) -> None:
        self.max_input_bytes = max_input_bytes
        self._encode = input_encoder()
        self.requests: list[EnqueueRequest] = []
        """The plain requests (no dedupe or concurrency key), inserted by one statement."""
        self.inputs: list[str] = []
        self.shapes: list[Shape] = []
        self.shapes_only = True
        """No plain request has a run_at, tags, scope or tenant (the usual batch)."""
        self.keyed: dict[int, Prepared] = {}
        """Requests with dedupe or concurrency keys, by position: enqueued one at a time."""

    def __len__(self) -> int:
        return len(self.requests) + len(self.keyed)

    def add(self, request: EnqueueRequest, resolved: Resolved) -> None:
        """A request without keys, with its handler's defaults (if any) in ``resolved``."""
        pool, priority, max_attempts = resolved
        self.inputs.append(check_request(
            request, pool=pool, priority=priority, max_attempts=max_attempts,
            max_input_bytes=self.max_input_bytes, encode=self._encode))
        self._append(request, resolved)

    def add_prepared(self, prepared: Prepared) -> None:
        """A request that went through ``App._prepare`` (a handler with policies, or keys)."""
        r = prepared.request
        if r.needs_locks:
            self.keyed[len(self)] = prepared
        else:
            self.inputs.append(prepared.input_json)
            self._append(r, (r.pool, r.priority, r.max_attempts))

    def _append(self, request: EnqueueRequest, resolved: Resolved) -> None:
        self.requests.append(request)
        self.shapes.append((request.job_type, *resolved))  # a str: check_request said so
        if self.shapes_only and not _shaped(request):
            self.shapes_only = False

    def order(self, plain: list[Run]) -> list[Run | Prepared]:
        """The plain runs, with the keyed requests put back in their places."""
        if not self.keyed:
            return list(plain)
        out: list[Run | Prepared] = []
        runs = iter(plain)
        for position in range(len(self)):
            keyed = self.keyed.get(position)
            out.append(next(runs) if keyed is None else keyed)
        return out

    def params(self, trace_context: str | None = None) -> tuple[list[UUID], dict[str, Any]]:
        """New ids for the plain rows, and ``job_run_insert_bulk``'s parameters;
        ``trace_context``: the enqueue's, for every row (see notifyq/_tracing.py)."""
        ids = self.ids()
        traced = f'"trace_context":{trace_context},' if trace_context is not None else ""
        rows = ",".join([f'{{"id":"{run_id.int:032x}",{traced}{head}"input":{text}}}'
                         for run_id, head, text in zip(ids, self._heads(), self.inputs,
                                                       strict=True)])
        return ids, {"rows": f"[{rows}]", "types": self.types()}

    def types(self) -> list[str]:
        """The plain rows' job types, each once."""
        return list(dict.fromkeys(s[0] for s in self.shapes))

    def ids(self) -> list[UUID]:
        """The plain rows' ids, drawn with the keyed requests' in one increasing block in the
        order given (the claim breaks ties on the id, so this is the order they run in)."""
        ids = new_run_ids(len(self))
        if not self.keyed:
            return ids
        for position, prepared in self.keyed.items():
            self.keyed[position] = replace(prepared, id=ids[position])
        return [run_id for position, run_id in enumerate(ids) if position not in self.keyed]

    def _heads(self) -> list[str]:
        """Each record's keys before the input: one string per shape in the usual batch."""
        if not self.shapes_only:
            return [self._head(r, s) for r, s in zip(self.requests, self.shapes, strict=True)]
        one_each = dict(zip(self.shapes, self.requests, strict=True))
        by_shape = {s: self._head(r, s) for s, r in one_each.items()}
        return [by_shape[s] for s in self.shapes]

    def _head(self, request: EnqueueRequest, shape: Shape) -> str:
        """A record's keys before the input, null ones left out (they parse as NULL)."""
        r = request
        job_type, pool, priority, max_attempts = shape
        values = {
            "job_type": job_type, "pool": pool, "priority": priority,
            "run_at": r.run_at.isoformat() if r.run_at is not None else None,
            "max_attempts": max_attempts, "tags": list(r.tags) if r.tags is not None else None,
            "scope_entity_type": r.scope_entity_type, "scope_entity_id": r.scope_entity_id,
            "tenant_id": r.tenant_id,
        }
        return self._encode({k: v for k, v in values.items() if v is not None})[1:-1] + ","

    def runs(self, ids: list[UUID], summary: Sequence[Mapping[str, Any]],
             start: int = 0) -> list[Run]:
        """The plain rows from ``start`` as runs (``ids``: theirs), from
        ``job_run_insert_bulk``'s answer (or ``job_run_copy_defaults``'): the values the INSERT
        wrote, by the same coalesce (given, else the stored definition, else the default)."""
        now: datetime = summary[0]["now"]
        stored = {row["type"]: row for row in summary}
        n = len(ids)
        requests, shapes = self.requests[start:start + n], self.shapes[start:start + n]
        by_shape = {s: applied(s, stored[s[0]]) for s in dict.fromkeys(shapes)}
        columns: dict[str, Sequence[Any]] = {
            "id": ids, "input": [r.input for r in requests],
            "tags": [[] if r.tags is None else list(r.tags) for r in requests]}
        same: dict[str, Any] = {"status": RunStatus.PENDING, "attempts": 0, "created_at": now,
                                "trigger_source": "manual"}
        if len(by_shape) == 1:  # one job type with one set of defaults: the usual batch
            [values] = by_shape.values()
            same.update(zip(_APPLIED, values, strict=True))
        else:
            per_row = [by_shape[s] for s in shapes]
            columns.update(zip(_APPLIED, zip(*per_row, strict=True), strict=True))
        if self.shapes_only:
            same["run_at"] = now
        else:
            columns["run_at"] = [now if r.run_at is None else r.run_at.astimezone(now.tzinfo)
                                 for r in requests]
        return runs_from_columns(n, columns, same)


_APPLIED = ("job_type", "pool", "priority", "max_attempts", "timeout_s")


def _shaped(request: EnqueueRequest) -> bool:
    """Whether the request's record and run follow from its shape alone."""
    r = request
    return (r.run_at is None and r.tags is None and r.scope_entity_type is None
            and r.scope_entity_id is None and r.tenant_id is None)


def applied(shape: Shape, stored: Mapping[str, Any]) -> tuple[str, str, int, int, Any]:
    """job_run_insert_bulk's coalesce(given, stored definition, table default), as _APPLIED;
    ``stored``: the definition's columns (all None for a type without one)."""
    job_type, pool, priority, max_attempts = shape
    return (job_type, str(_first(pool, stored["pool"], "default")),
            int(_first(priority, stored["priority_default"], 0)),
            int(_first(max_attempts, stored["max_attempts"], 25)),
            stored["timeout_s"])


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)
