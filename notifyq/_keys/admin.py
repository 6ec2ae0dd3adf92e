"""Key administration shared by the CLI, the admin API and the dashboard: verify the configured
keys against the database, report status, promote a version, start, throttle, pause and resume
a rotation, retire a version.

Every method takes the caller's connection (autocommit) and opens its own short transactions.
Promotion, rotation and retirement decide under one advisory lock (``key_rotation_lock``), so
"no rotation is under way" and "no row or process uses it" hold when they write. None of
promote, pause, resume or status needs key material: an admin box without keys drives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from notifyq._control import RunControl
from notifyq._crypto.keyring import Keyring
from notifyq._enqueue.request import EnqueueRequest
from notifyq._enqueue.write import Enqueuer
from notifyq._errors import ConfigError, InvalidTransition, PromotionRefused, RotationInProgress
from notifyq._keys.check import HOLDER_TTL_INTERVALS
from notifyq._keys.columns import ColumnQueries, EncryptedColumn
from notifyq._keys.status import iso, rotation_json, status_json
from notifyq._notifier import wake_payload
from notifyq._run import Run
from notifyq._runtime import Runtime

AnyConn = psycopg.AsyncConnection[Any]

REENCRYPT = "secret.reencrypt"
FAILURES_LISTED = 100


class KeyAdmin:
    """``app.keys``: the database side of the keyring."""

    def __init__(self, runtime: Runtime, enqueuer: Enqueuer, control: RunControl) -> None:
        self._rt = runtime
        self._queries = runtime.queries
        self._columns = runtime.columns
        self._enqueuer = enqueuer
        self._control = control

    async def sync(self, conn: AnyConn) -> Keyring:
        """Check the configured keyring against the database now (see
        :mod:`notifyq._keys.check`): record new versions' check values, this process as a key
        holder and its encrypted columns, refuse a key that differs from the one that encrypted
        existing data, take the cluster's active version and load retirements."""
        return await self._rt.checked_keyring(conn, force=True)

    async def columns(self, conn: AnyConn) -> list[EncryptedColumn]:
        """Every encrypted column: this process's and those any process recorded in the
        database's registry (``encrypted_column``), the user's first."""
        rows = await self._all(conn, self._queries.encrypted_column_list)
        return self._columns.with_recorded(rows)

    async def column_queries(self, conn: AnyConn, column: EncryptedColumn) -> ColumnQueries:
        return await ColumnQueries.describe(conn, self._queries, column)

    async def counts(self, conn: AnyConn) -> list[dict[str, Any]]:
        """Rows per key version of every encrypted column (:meth:`columns`)."""
        out = []
        for column in await self.columns(conn):
            cq = await self.column_queries(conn, column)
            counted = await self._all(conn, cq.version_counts)
            per = {int(r["version"]): int(r["n"]) for r in counted}
            out.append({"column": column.name, "rows": sum(per.values()),
                        "by_version": {str(v): n for v, n in per.items()}})
        return out

    async def active(self, conn: AnyConn) -> dict[str, Any] | None:
        """The cluster's active version (``version``, ``promoted_at``, ``promoted_by``,
        ``forced``); None before any process set one."""
        return await self._one(conn, self._queries.key_active_get)

    async def processes(self, conn: AnyConn) -> list[dict[str, Any]]:
        """The live key holders (``key_holder_list``)."""
        return await self._all(conn, self._queries.key_holder_list, {"now": None})

    async def status(self, conn: AnyConn) -> dict[str, Any]:
        """Versions, the cluster's active one, the live processes and what they hold, rows per
        version per column, the latest rotation with its progress, and whether everything is
        on the active version (``done``). JSON-ready, schema in notifyq/_keys/status.py. Writes
        nothing (a read-only token may ask)."""
        rows = await self._all(conn, self._queries.key_version_list)
        keyring = self._rt.verified_keyring(rows) if self._rt.has_keyring else None
        return status_json(versions=rows, active=await self.active(conn),
                           configured=keyring.versions if keyring else [],
                           holders=await self.processes(conn), columns=await self.counts(conn),
                           rotation=await self._rotation(conn))

    async def _rotation(self, conn: AnyConn) -> dict[str, Any] | None:
        q = self._queries
        row = await self._one(conn, q.key_rotation_latest, {"now": None})
        if row is None:
            return None
        key = {"run_id": row["run_id"]}
        failed = await self._one(conn, q.key_rotation_failure_count, key)
        return rotation_json(row, await self._all(conn, q.key_rotation_progress_list, key),
                             int(failed["n"]) if failed else 0)

    # -- promotion ---------------------------------------------------------------------------

    async def readiness(self, conn: AnyConn, version: int) -> dict[str, Any]:
        """What :meth:`promote` would answer now, written and announced nowhere (its statement
        in a transaction rolled back): ``outcome`` (promoted, unchanged, lacking, rotating,
        unknown, retired), ``previous``, ``lacking`` (processes) and ``rotation``."""
        return await self._promote(conn, version, force=False, by="readiness", dry_run=True)

    async def promote(self, conn: AnyConn, version: int, *, force: bool = False,
                      by: str) -> dict[str, Any]:
        """Make ``version`` the one every process encrypts under (workers follow at once, by
        NOTIFY; other processes at their next key check). Refused with
        :class:`PromotionRefused` while a live process does not hold it (unless ``force``:
        those processes then refuse to encrypt and cannot read what is written under it),
        :class:`RotationInProgress` while a rotation to another version is unfinished, and
        ``InvalidTransition`` for a version no process has held, or one retired. ``by`` is
        recorded (who promoted). Idempotent: promoting the active version changes nothing."""
        if self._rt.has_keyring:
            await self.sync(conn)  # records the versions this process holds
        row = await self._promote(conn, version, force=force, by=by, dry_run=False)
        outcome = row["outcome"]
        if outcome not in ("promoted", "unchanged"):
            raise _refusal(version, row)
        self._rt.expire_key_check()  # this process follows before its next encrypt
        return {"version": version, "previous": row["previous"], "changed": outcome == "promoted",
                "promoted_at": iso(row["promoted_at"]), "forced": bool(force and row["lacking"]),
                "lacking": row["lacking"]}

    async def _promote(self, conn: AnyConn, version: int, *, force: bool, by: str,
                       dry_run: bool) -> dict[str, Any]:
        q = self._queries
        async with conn.transaction(force_rollback=dry_run):
            await conn.execute(q.key_rotation_lock)
            row = await self._one(conn, q.key_active_promote, {
                "version": version, "force": force, "first_time": False, "by": by[:300],
                "now": None, "channel": q.schema})
        assert row is not None  # noqa: S101 - the statement always answers one row
        return row

    # -- rotation ----------------------------------------------------------------------------

    async def rotate(self, conn: AnyConn, *, batch_size: int | None = None,
                     pause_s: float | None = None,
                     rate_per_s: float | None = None) -> tuple[Run, bool]:
        """Enqueue one ``secret.reencrypt`` run to the cluster's active version; returns (run,
        created). ``rate_per_s`` caps the rows it handles per second (0 lifts a cap set before;
        None leaves it as it is).

        Idempotent: while a rotation to the same version is pending or running, that run is
        returned (with ``rate_per_s`` applied to it). RotationInProgress while one to another
        version is."""
        if self._rt.has_keyring:
            await self.sync(conn)  # a wrong key stops here; records this process's columns
        target = await self._active_version(conn)
        options: dict[str, Any] = {"target_version": target}
        if batch_size is not None:
            options["batch_size"] = batch_size
        if pause_s is not None:
            options["pause_s"] = pause_s
        q = self._queries
        async with conn.transaction():
            await conn.execute(q.key_rotation_lock)
            found = await self._one(conn, q.key_rotation_find_active)
            if found is not None:
                if found["target_version"] != target:
                    raise RotationInProgress(
                        f"a rotation to key version {found['target_version']} is still "
                        f"{found['status']} (run {found['run_id']}); wait for it or cancel it "
                        f"before rotating to version {target}")
                await self._throttle(conn, found["run_id"], rate_per_s)
                return await self._control.get(conn, found["run_id"]), False
            run, _ = await self._enqueuer.enqueue(
                EnqueueRequest(job_type=REENCRYPT, input=options), conn=conn, builtin=True)
            await conn.execute(q.key_rotation_register, {
                "run_id": run.id, "target_version": target, "now": None})
            await self._throttle(conn, run.id, rate_per_s)
        return run, True

    async def _active_version(self, conn: AnyConn) -> int:
        if self._rt.has_keyring:
            active = self._rt.keyring.active_version  # synced just now
        else:
            row = await self.active(conn)
            active = int(row["version"]) if row else None
        if active is None:
            raise ConfigError("no key version is active yet: set NOTIFYQ_ACTIVE_KEY_VERSION "
                              "in a process with keys, or run `notifyq keys promote N`")
        return active

    async def _throttle(self, conn: AnyConn, run_id: UUID, rate_per_s: float | None) -> None:
        if rate_per_s is not None:
            await conn.execute(self._queries.key_rotation_throttle, {
                "run_id": run_id, "rate_per_s": rate_per_s or None})

    async def pause(self, conn: AnyConn) -> dict[str, Any]:
        """Pause the unfinished rotation: its run stops before its next batch and steps aside
        (snoozed, its worker slot free) until :meth:`resume`. InvalidTransition when no
        rotation is pending or running."""
        row = await self._one(conn, self._queries.key_rotation_pause, {"now": None})
        if row is None:
            raise InvalidTransition("no key rotation is pending or running: nothing to pause")
        return {"run_id": str(row["run_id"]), "target_version": row["target_version"],
                "paused_at": iso(row["paused_at"])}

    async def resume(self, conn: AnyConn, *, rate_per_s: float | None = None) -> dict[str, Any]:
        """Resume a paused rotation at once (optionally with a new ``rate_per_s``, 0 lifting
        the cap). InvalidTransition when none is paused (with ``rate_per_s``, a running one
        takes the new rate instead)."""
        q = self._queries
        async with conn.transaction():
            await conn.execute(q.key_rotation_lock)
            row = await self._one(conn, q.key_rotation_resume, {"now": None})
            if row is None:
                found = await self._one(conn, q.key_rotation_find_active)
                if found is None or rate_per_s is None:
                    raise InvalidTransition("no key rotation is paused: nothing to resume")
                await self._throttle(conn, found["run_id"], rate_per_s)
                return {"run_id": str(found["run_id"]), "resumed": False}
            await self._throttle(conn, row["run_id"], rate_per_s)
            if row["woken"]:
                await conn.execute(q.job_run_notify, {"channel": q.schema,
                                                      "payloads": [wake_payload(row["pool"])]})
        return {"run_id": str(row["run_id"]), "resumed": True}

    # -- retirement --------------------------------------------------------------------------

    async def retire(self, conn: AnyConn, version: int) -> dict[str, Any]:
        """Retire ``version``: refused while it is the active version, while any registered row
        uses it, or while a live process still encrypts under it (it learns of a promotion at
        its next key check); after it, the version no longer decrypts in any process (workers
        at once, others from their next key check)."""
        if self._rt.has_keyring:
            await self.sync(conn)
        q = self._queries
        async with conn.transaction():
            await conn.execute(q.key_rotation_lock)
            active = await self.active(conn)
            if active is not None and active["version"] == version:
                raise InvalidTransition(f"key version {version} is the active version: "
                                        "promote another version and rotate first")
            self._refuse_if_used(version, await self.counts(conn))
            self._refuse_if_encrypting(version, await self.processes(conn))
            row = await self._one(conn, q.key_version_retire, {"version": version, "now": None})
            if row is None:
                raise InvalidTransition(f"key version {version} was never configured here")
            await conn.execute(q.key_announce, {"channel": q.schema, "version": version})
        if self._rt.has_keyring:
            keyring = self._rt.keyring
            keyring.set_retired({*keyring.retired, version})
        return {"version": version, "retired_at": iso(row["retired_at"])}

    @staticmethod
    def _refuse_if_used(version: int, counts: list[dict[str, Any]]) -> None:
        in_use = {c["column"]: n for c in counts if (n := c["by_version"].get(str(version), 0))}
        if in_use:
            listing = ", ".join(f"{name}: {n}" for name, n in in_use.items())
            raise InvalidTransition(
                f"key version {version} is still used by {sum(in_use.values())} rows "
                f"({listing}): run `notifyq keys rotate --wait` first")

    def _refuse_if_encrypting(self, version: int, holders: list[dict[str, Any]]) -> None:
        writers = [h for h in holders if h["encrypts_with"] == version]
        if writers:
            ttl = HOLDER_TTL_INTERVALS * self._rt.settings.key_check_interval_s
            raise InvalidTransition(
                f"key version {version} is still encrypted under by {len(writers)} live "
                f"process(es): {describe(writers)}; each takes the promoted version at its "
                "next key check (workers at once; a process that stopped expires "
                f"{ttl:g} s after its last check): try again shortly")

    async def failures(self, conn: AnyConn, run_id: UUID,
                       limit: int = FAILURES_LISTED) -> list[dict[str, Any]]:
        return await self._all(conn, self._queries.key_rotation_failure_list,
                               {"run_id": run_id, "limit": limit})

    # -- reading -----------------------------------------------------------------------------

    @staticmethod
    async def _all(conn: AnyConn, query: str,
                   params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return [dict(r) for r in await cur.fetchall()]

    @staticmethod
    async def _one(conn: AnyConn, query: str,
                   params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            row = await cur.fetchone()
        return dict(row) if row is not None else None


def describe(processes: list[dict[str, Any]]) -> str:
    """``worker host:pid:token (holds 1, 2)`` for each, comma-separated."""
    return ", ".join(f"{p['role']} {p['id']} (holds "
                     f"{', '.join(str(v) for v in p['versions']) or 'none'})" for p in processes)


def _refusal(version: int, row: Mapping[str, Any]) -> InvalidTransition | RotationInProgress:
    outcome = row["outcome"]
    if outcome == "lacking":
        lacking = list(row["lacking"])
        return PromotionRefused(
            f"key version {version} cannot be promoted: {len(lacking)} live process(es) do not "
            f"hold it: {describe(lacking)}. Add version {version} to their NOTIFYQ_KEYS (or "
            "NOTIFYQ_KEY_FILE) and restart them (a stopped one drops out three key-check "
            "intervals after its last check); --force promotes anyway, and those processes "
            f"then refuse to encrypt and cannot read anything written under version {version}",
            lacking)
    if outcome == "rotating":
        rotation = row["rotation"] or {}
        return RotationInProgress(
            f"a rotation to key version {rotation.get('target_version')} is still "
            f"{rotation.get('status')} (run {rotation.get('run_id')}): let it finish (or cancel "
            f"it) before promoting version {version}")
    if outcome == "retired":
        return InvalidTransition(f"key version {version} is retired: it cannot be active "
                                 "again; give a new key a new version number")
    return InvalidTransition(
        f"key version {version} is not known: no process has held it yet; add it to the "
        "NOTIFYQ_KEYS (or NOTIFYQ_KEY_FILE) of your processes and restart them (each records "
        "the versions it holds at its key check)")
