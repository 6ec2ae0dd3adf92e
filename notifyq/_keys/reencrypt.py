"""``secret.reencrypt``: re-encrypt every registered column under the active key version.

Per column, a checkpoint row (``key_rotation_progress``) says which pass the run is in and the
last primary key it finished. Each batch is one short transaction:

1. ``SET LOCAL lock_timeout`` (default 100 ms): never make live traffic wait on us;
2. read the next keyset page (``pk > last_pk``, rows not on the target version, no locks);
3. decrypt and re-encrypt in Python; rows that do not decrypt are recorded and skipped;
4. compare-and-swap them back (``WHERE pk = … AND col = <old ciphertext>``): a row a writer
   changed meanwhile keeps the writer's value;
5. advance the checkpoint in the same transaction.

A batch that meets a locked row rolls back (55P03) and is retried after a backoff. Pass 1
re-encrypts; each later pass re-scans from the start and re-encrypts what appeared meanwhile
(lost compare-and-swaps, stale writers still on an old key); the column is done after a pass
that found nothing to change. A run killed mid-way resumes from its last committed batch; a new
run with nothing left to do changes no row.

Before it scans, the run waits (up to ``STALE_WRITERS_WAIT_S``) until no live process may still
encrypt under another version (``key_holder_stale_writers``: each takes a promotion at its next
key check), so the passes do not chase writes that are about to stop.

**Throttle and pause.** Before every batch the run reads its ``key_rotation`` row: with a rate
limit (``rate_per_s``, set by ``rotate --rate`` and changeable while it runs) a batch reads at
most one second's worth of rows, after a wait that keeps the average within the rate
(:class:`Pacer`);
a paused rotation snoozes (its worker slot free, no attempt used) until ``resume`` makes the
run due again, and goes on from its last checkpoint.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import psycopg
from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from notifyq._crypto.keyring import Keyring
from notifyq._errors import (
    ConfigError,
    DecryptionFailed,
    InvalidTransition,
    Permanent,
    Snooze,
    StaleWriters,
)
from notifyq._keys.admin import REENCRYPT, KeyAdmin, describe
from notifyq._keys.columns import ColumnQueries, EncryptedColumn
from notifyq._keys.status import checkpoint_json
from notifyq._runtime import Runtime
from notifyq._tracing import child_span

if TYPE_CHECKING:
    from notifyq._context import JobContext

log = logging.getLogger("notifyq.reencrypt")

AnyConn = psycopg.AsyncConnection[Any]

FAILURES_IN_OUTPUT = 100
_RETRY_BASE_S = 0.05
_RETRY_MAX_S = 2.0
PAUSED_RECHECK_S = 10.0
"""A paused run snoozes this long at a time; ``resume`` makes it due at once, so this only
bounds a resume that raced the snooze's write-back."""
STALE_WRITERS_WAIT_S = 60.0
STALE_WRITERS_POLL_S = 0.2


def batch_limit(batch_size: int, rate_per_s: float | None) -> int:
    """Rows per batch: ``batch_size``, but never more than one second's worth of the rate."""
    if not rate_per_s:
        return batch_size
    return max(1, min(batch_size, math.ceil(rate_per_s)))


class Pacer:
    """Spaces a rotation's batches so that its rows per second stay within a rate.

    Each batch is paid for (``rows / rate`` seconds) before it runs, and a batch's own work
    counts towards the next one's payment, so the average from the first batch on stays within
    the rate, and a rate measured while it runs (rows done over the time since it started) is
    the rate. What a batch will read is not known before: it pays for as many rows as the batch
    before it read (a full batch at first) and settles the difference afterwards
    (:meth:`settle`), so the empty batches that end a pass or a column cost nothing (and the
    first batch of the next column may run one batch ahead, once). Time spent slower than the
    rate (a busy database, a pause) is not saved up for a burst later.

    Example::

        pacer = Pacer()
        await anyio.sleep(pacer.wait_s(clock(), limit=500, rate_per_s=500))  # 1.0 s
        pacer.settle(read=500, rate_per_s=500)
    """

    def __init__(self) -> None:
        self._paid_until: float | None = None
        self._expected: int | None = None

    def wait_s(self, now: float, *, limit: int, rate_per_s: float | None) -> float:
        if not rate_per_s:
            self._paid_until = None
            return 0.0
        expected = limit if self._expected is None else min(self._expected, limit)
        self._expected = expected
        cost = expected / rate_per_s
        begin = now if self._paid_until is None else max(self._paid_until, now - cost)
        self._paid_until = begin + cost
        return max(0.0, self._paid_until - now)

    def settle(self, *, read: int, rate_per_s: float | None) -> None:
        """The batch read ``read`` rows: charge (or refund) what it was not paid for."""
        if rate_per_s and self._paid_until is not None and self._expected is not None:
            self._paid_until += (read - self._expected) / rate_per_s
        self._expected = read


class ReencryptOptions(BaseModel):
    """The run's input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_version: int = Field(ge=1)
    """The key version every row must end on (the active version when rotate was called)."""
    batch_size: int = Field(default=500, ge=1, le=10_000)
    """Rows per batch transaction. Defaults to 500."""
    lock_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    """How long a batch may wait for a row lock before it backs off. Defaults to 100."""
    pause_s: float = Field(default=0.0, ge=0, le=60)
    """A pause between batches to spare a busy database. Defaults to 0."""
    max_passes: int = Field(default=10, ge=2, le=1000)
    """Verification passes before giving up (a writer keeps using an old key); the run then
    fails and its retry resumes. Defaults to 10."""


@dataclass(slots=True)
class Batch:
    """What one batch read: handed to the ``on_batch`` test hook before the swap."""

    column: EncryptedColumn
    pass_number: int
    pks: list[Any] = field(default_factory=list)
    olds: list[bytes] = field(default_factory=list)
    news: list[bytes] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)


BatchHook = Callable[[Batch], Awaitable[None]]




class Reencryptor:
    """The ``secret.reencrypt`` handler (registered by the App when a keyring is configured).

    ``rotate(run_id, options)`` is the whole job and what tests call; ``on_batch`` runs inside
    each batch's transaction between the read and the swap (a test signal)."""

    def __init__(self, runtime: Runtime, keys: KeyAdmin, *,
                 on_batch: BatchHook | None = None) -> None:
        self._rt = runtime
        self._keys = keys
        self._on_batch = on_batch

    async def handle(self, ctx: JobContext) -> dict[str, Any]:
        try:
            options = ReencryptOptions.model_validate(ctx.input)
        except ValidationError as exc:
            problem = exc.errors(include_input=False)[0]["msg"]
            raise Permanent(ValueError(f"bad {REENCRYPT} input: {problem}")) from None
        async with self._rt.connection() as conn:
            cur = await conn.execute(self._rt.queries.key_rotation_get, {"run_id": ctx.run.id})
            rotation = await cur.fetchone()
        if rotation is None or rotation["target_version"] != options.target_version:
            raise Permanent(ValueError(
                f"run {ctx.run.id} was not started by a key rotation to version "
                f"{options.target_version}: {REENCRYPT} runs are enqueued by app.keys.rotate, "
                "POST /v1/admin/rotate-key or `notifyq keys rotate` only; refused"))
        return await self.rotate(ctx.run.id, options)

    async def rotate(self, run_id: UUID, options: ReencryptOptions) -> dict[str, Any]:
        async with self._rt.connection() as conn:
            keyring = _targeting(await self._keys.sync(conn), options.target_version)
            await conn.execute(self._rt.queries.key_rotation_register, {
                "run_id": run_id, "target_version": options.target_version, "now": None})
            await self._wait_for_stale_writers(conn, options.target_version)
            columns = []
            pacer = Pacer()  # one rate for the whole rotation, across columns
            for column in await self._keys.columns(conn):
                cq = await self._keys.column_queries(conn, column)
                columns.append(await _ColumnRotation(
                    conn, self._rt, keyring, cq, run_id=run_id, options=options,
                    on_batch=self._on_batch, pacer=pacer).run())
            failures = await self._keys.failures(conn, run_id, FAILURES_IN_OUTPUT + 1)
        return {"target_version": options.target_version, "columns": columns,
                "undecryptable": failures[:FAILURES_IN_OUTPUT],
                "undecryptable_truncated": len(failures) > FAILURES_IN_OUTPUT}


    async def _wait_for_stale_writers(self, conn: AnyConn, target: int) -> None:
        """Until no live process may still encrypt under another version (bounded: the passes
        catch what a straggler writes)."""
        q, clock = self._rt.queries, self._rt.clock
        deadline = clock.monotonic() + STALE_WRITERS_WAIT_S
        noted = False
        while clock.monotonic() < deadline:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(q.key_holder_stale_writers, {"version": target, "now": None})
                writers = await cur.fetchall()
            if not writers:
                return
            if not noted:
                log.info("waiting for processes that may still encrypt under an older version "
                         "to take version %d at their next key check: %s", target,
                         describe([{**w, "versions": [w["encrypts_with"]]} for w in writers]))
                noted = True
            await anyio.sleep(STALE_WRITERS_POLL_S)


def _targeting(keyring: Keyring, target: int) -> Keyring:
    """The keyring, if it can re-encrypt to ``target``: the cluster's active version, held
    here."""
    if keyring.active_version != target:
        raise Permanent(InvalidTransition(
            f"the rotation targets key version {target} but version {keyring.active_version} "
            "is active now: this rotation is obsolete, run `notifyq keys rotate` again"))
    if not keyring.holds(target):
        raise ConfigError(f"this worker does not hold key version {target}, the rotation's "
                          f"target (it holds {', '.join(map(str, keyring.versions))}): add it "
                          "to every worker's NOTIFYQ_KEYS")
    return keyring


class _ColumnRotation:
    def __init__(self, conn: AnyConn, runtime: Runtime, keyring: Keyring, cq: ColumnQueries, *,
                 run_id: UUID, options: ReencryptOptions, on_batch: BatchHook | None,
                 pacer: Pacer) -> None:
        self.conn = conn
        self.pacer = pacer
        self.recheck = runtime.checked_keyring
        self.clock = runtime.clock.monotonic
        self.q = runtime.queries
        self.keyring = keyring
        self.cq = cq
        self.column = cq.column
        self.options = options
        self.on_batch = on_batch
        self.key = {"run_id": run_id, "column_name": cq.column.name, "now": None}
        self.skip: set[str] = set()

    async def run(self) -> dict[str, Any]:
        progress = await self._one(self.q.key_rotation_progress_start)
        self.skip = {f["row_pk"] for f in await self._failures()}
        while progress["finished_at"] is None:
            # A long rotation meets the key check's interval: run it here, awaited, so the
            # keyring's guard never blocks the event loop mid-batch.
            await self.recheck()
            rate = await self._rate_unless_paused()
            limit = batch_limit(self.options.batch_size, rate)
            wait = self.pacer.wait_s(self.clock(), limit=limit, rate_per_s=rate)
            if wait > 0:
                await anyio.sleep(wait)
            progress, read = await self._batch_with_retries(progress, limit)
            self.pacer.settle(read=read, rate_per_s=rate)
            if read == limit:
                if self.options.pause_s:
                    await anyio.sleep(self.options.pause_s)
                continue
            progress = await self._end_pass(progress)
        return checkpoint_json(progress)

    async def _rate_unless_paused(self) -> float | None:
        """The rotation's rate limit; Snooze when an operator paused it."""
        async with self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q.key_rotation_control, {"run_id": self.key["run_id"]})
            control = await cur.fetchone()
        if control is None:
            return None
        if control["paused"]:
            log.info("rotation paused by an operator; stepping aside until it is resumed")
            raise Snooze(PAUSED_RECHECK_S)
        rate = control["rate_per_s"]
        return float(rate) if rate else None

    async def _end_pass(self, progress: dict[str, Any]) -> dict[str, Any]:
        log.info("%s: pass %d done (%d re-encrypted so far, %d changed concurrently)",
                 self.column.name, progress["pass"], progress["reencrypted"],
                 progress["conflicts"])
        if progress["pass_changes"] == 0:
            return await self._one(self.q.key_rotation_progress_finish)
        if progress["pass"] >= self.options.max_passes:
            raise StaleWriters(f"{self.column.name}: rows still appear under old key versions "
                               f"after {progress['pass']} passes; some writer still uses an "
                               "old active key version")
        return await self._one(self.q.key_rotation_progress_next_pass)

    async def _batch_with_retries(self, progress: dict[str, Any],
                                  limit: int) -> tuple[dict[str, Any], int]:
        delay = _RETRY_BASE_S
        while True:
            try:
                return await self._batch(progress, limit)
            except psycopg.errors.LockNotAvailable:
                log.info("%s: a row of the next batch is locked by live traffic; retrying in "
                         "%.2f s", self.column.name, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    async def _batch(self, progress: dict[str, Any], limit: int) -> tuple[dict[str, Any], int]:
        with child_span("key rotation batch", {
                "notifyq.key.column": self.column.name,
                "notifyq.key.target_version": self.options.target_version,
                "notifyq.key.pass": progress["pass"]}) as span:
            new, read = await self._batch_once(progress, limit)
            if span is not None:
                span.set_attributes({
                    "notifyq.key.batch.reencrypted": new["reencrypted"] - progress["reencrypted"],
                    "notifyq.key.batch.conflicts": new["conflicts"] - progress["conflicts"],
                    "notifyq.key.batch.full": read == limit})
            return new, read

    async def _batch_once(self, progress: dict[str, Any],
                          limit: int) -> tuple[dict[str, Any], int]:
        """One transaction: read a page of at most ``limit`` rows, swap what decrypts, record
        what does not, and checkpoint. Returns the new progress and the rows read."""
        async with self.conn.transaction(), self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q.key_rotation_lock_timeout,
                              {"lock_timeout": f"{self.options.lock_timeout_ms}ms"})
            params = {"version": self.options.target_version, "limit": limit,
                      "after": progress["last_pk"]}
            await cur.execute(self.cq.page_first if progress["last_pk"] is None
                              else self.cq.page_after, params)
            rows = await cur.fetchall()
            if not rows:
                return progress, 0
            batch = self._reencrypt(rows, progress["pass"])
            if self.on_batch is not None:
                await self.on_batch(batch)
            swapped = 0
            if batch.pks:
                await cur.execute(self.cq.swap_many, {
                    "pks": batch.pks, "olds": batch.olds, "news": batch.news})
                swapped = cur.rowcount
            if batch.failures:
                await cur.execute(self.q.key_rotation_failure_record, {
                    **self.key, "row_pks": [f[0] for f in batch.failures],
                    "reasons": [f[1] for f in batch.failures]})
                self.skip.update(f[0] for f in batch.failures)
            await cur.execute(self.q.key_rotation_progress_checkpoint, {
                **self.key, "last_pk": str(rows[-1]["pk"]), "attempted": len(batch.pks),
                "reencrypted": swapped, "conflicts": len(batch.pks) - swapped})
            new = await cur.fetchone()
        assert new is not None  # noqa: S101 - the progress row exists
        return new, len(rows)

    def _reencrypt(self, rows: list[dict[str, Any]], pass_number: int) -> Batch:
        batch = Batch(self.column, pass_number)
        for row in rows:
            pk_text = str(row["pk"])
            if pk_text in self.skip:
                continue
            old = bytes(row["ciphertext"])
            context = self.column.context(pk_text)
            try:
                plaintext = self.keyring.decrypt(old, context)
            except DecryptionFailed as exc:
                batch.failures.append((pk_text, f"{type(exc).__name__}: {exc}"))
                continue
            batch.pks.append(row["pk"])
            batch.olds.append(old)
            batch.news.append(self.keyring.encrypt(plaintext, context))
        if batch.failures:
            log.warning("%s: %d rows cannot be decrypted; skipped and recorded",
                        self.column.name, len(batch.failures))
        return batch

    async def _one(self, query: str) -> dict[str, Any]:
        async with self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, self.key)
            row = await cur.fetchone()
        assert row is not None  # noqa: S101 - these statements return the progress row
        return row

    async def _failures(self) -> list[dict[str, Any]]:
        async with self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q.key_rotation_failure_list,
                              {"run_id": self.key["run_id"], "limit": 10_000_000})
            return [r for r in await cur.fetchall()
                    if r["column_name"] == self.column.name]
