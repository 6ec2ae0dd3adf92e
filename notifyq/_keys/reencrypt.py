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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import psycopg
from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from notifyq._crypto.keyring import Keyring
from notifyq._db.queries import Queries
from notifyq._errors import DecryptionFailed, Permanent, StaleWriters
from notifyq._keys.admin import REENCRYPT, KeyAdmin, progress_json
from notifyq._keys.columns import ColumnQueries, EncryptedColumn
from notifyq._runtime import Runtime
from notifyq._tracing import child_span

if TYPE_CHECKING:
    from notifyq._context import JobContext

log = logging.getLogger("notifyq.reencrypt")

AnyConn = psycopg.AsyncConnection[Any]

FAILURES_IN_OUTPUT = 100
_RETRY_BASE_S = 0.05
_RETRY_MAX_S = 2.0


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
            keyring = await self._keys.sync(conn)
            if keyring.active_version != options.target_version:
                raise RuntimeError(
                    f"this worker's active key version is {keyring.active_version} but the "
                    f"rotation targets {options.target_version}: deploy "
                    f"NOTIFYQ_ACTIVE_KEY_VERSION={options.target_version} to every worker")
            await conn.execute(self._rt.queries.key_rotation_register, {
                "run_id": run_id, "target_version": options.target_version, "now": None})
            columns = []
            for column in await self._keys.columns(conn):
                cq = await self._keys.column_queries(conn, column)
                columns.append(await _ColumnRotation(
                    conn, self._rt.queries, keyring, cq, run_id=run_id, options=options,
                    on_batch=self._on_batch, recheck=self._rt.checked_keyring).run())
            failures = await self._keys.failures(conn, run_id, FAILURES_IN_OUTPUT + 1)
        return {"target_version": options.target_version, "columns": columns,
                "undecryptable": failures[:FAILURES_IN_OUTPUT],
                "undecryptable_truncated": len(failures) > FAILURES_IN_OUTPUT}


class _ColumnRotation:
    def __init__(self, conn: AnyConn, queries: Queries, keyring: Keyring, cq: ColumnQueries, *,
                 run_id: UUID, options: ReencryptOptions, on_batch: BatchHook | None,
                 recheck: Callable[[], Awaitable[Keyring]]) -> None:
        self.conn = conn
        self.recheck = recheck
        self.q = queries
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
            progress, full = await self._batch_with_retries(progress)
            if full:
                if self.options.pause_s:
                    await anyio.sleep(self.options.pause_s)
                continue
            progress = await self._end_pass(progress)
        return progress_json(progress)

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

    async def _batch_with_retries(self, progress: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        delay = _RETRY_BASE_S
        while True:
            try:
                return await self._batch(progress)
            except psycopg.errors.LockNotAvailable:
                log.info("%s: a row of the next batch is locked by live traffic; retrying in "
                         "%.2f s", self.column.name, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    async def _batch(self, progress: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        with child_span("key rotation batch", {
                "notifyq.key.column": self.column.name,
                "notifyq.key.target_version": self.options.target_version,
                "notifyq.key.pass": progress["pass"]}) as span:
            new, full = await self._batch_once(progress)
            if span is not None:
                span.set_attributes({
                    "notifyq.key.batch.reencrypted": new["reencrypted"] - progress["reencrypted"],
                    "notifyq.key.batch.conflicts": new["conflicts"] - progress["conflicts"],
                    "notifyq.key.batch.full": full})
            return new, full

    async def _batch_once(self, progress: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """One transaction: read a page, swap what decrypts, record what does not, and
        checkpoint. Returns the new progress and whether the page was full."""
        limit = self.options.batch_size
        async with self.conn.transaction(), self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.q.key_rotation_lock_timeout,
                              {"lock_timeout": f"{self.options.lock_timeout_ms}ms"})
            params = {"version": self.options.target_version, "limit": limit,
                      "after": progress["last_pk"]}
            await cur.execute(self.cq.page_first if progress["last_pk"] is None
                              else self.cq.page_after, params)
            rows = await cur.fetchall()
            if not rows:
                return progress, False
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
        return new, len(rows) == limit

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
