"""Key administration shared by the CLI and the admin API: verify the configured keys against
the database, report status, start a rotation, retire a version.

Every method takes the caller's connection (autocommit) and opens its own short transactions.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from notifyq._control import RunControl
from notifyq._crypto.keyring import Keyring
from notifyq._enqueue.request import EnqueueRequest
from notifyq._enqueue.write import Enqueuer
from notifyq._errors import InvalidTransition, RotationInProgress
from notifyq._keys.columns import ColumnQueries, EncryptedColumn
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
        :mod:`notifyq._keys.check`): record new versions' check values and this process's
        encrypted columns, refuse a key that differs from the one that encrypted existing data
        or a retired active version, and load retirements."""
        return await self._rt.checked_keyring(conn, force=True)

    async def columns(self, conn: AnyConn) -> list[EncryptedColumn]:
        """Every encrypted column: this process's and those any process recorded in the
        database's registry (``encrypted_column``), the user's first."""
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._queries.encrypted_column_list)
            rows = await cur.fetchall()
        return self._columns.with_recorded(rows)

    async def column_queries(self, conn: AnyConn, column: EncryptedColumn) -> ColumnQueries:
        return await ColumnQueries.describe(conn, self._queries, column)

    async def counts(self, conn: AnyConn) -> list[dict[str, Any]]:
        """Rows per key version of every encrypted column (:meth:`columns`)."""
        out = []
        for column in await self.columns(conn):
            cq = await self.column_queries(conn, column)
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(cq.version_counts)
                per = {int(r["version"]): int(r["n"]) for r in await cur.fetchall()}
            out.append({"column": column.name, "rows": sum(per.values()),
                        "by_version": {str(v): n for v, n in per.items()}})
        return out

    async def status(self, conn: AnyConn) -> dict[str, Any]:
        """Configured and known versions, the active one, per-column counts by version and the
        latest rotation with its progress. JSON-ready. Writes nothing (a read-only token
        may ask): versions this process has configured but the database has not recorded yet
        are listed with no ``first_seen_at``."""
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._queries.key_version_list)
            rows = await cur.fetchall()
        known = {r["version"]: r for r in rows}
        keyring = self._rt.verified_keyring(rows) if self._rt.has_keyring else None
        configured = set(keyring.versions) if keyring else set()
        active = keyring.active_version if keyring else None
        versions = [{
            "version": v, "active": v == active, "configured": v in configured,
            "decrypt_only": v in configured and v != active,
            "retired": bool(known.get(v) and known[v]["retired_at"]),
            "first_seen_at": _iso(known[v]["first_seen_at"]) if v in known else None,
        } for v in sorted(configured | set(known))]
        columns = await self.counts(conn)
        for entry in columns:
            entry["remaining"] = sum(n for v, n in entry["by_version"].items()
                                     if active is None or int(v) != active)
        rotation = await self._rotation(conn)
        return {"active_version": active, "versions": versions, "columns": columns,
                "rotation": rotation, "progress": _progress(columns, rotation)}

    async def _rotation(self, conn: AnyConn) -> dict[str, Any] | None:
        q = self._queries
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(q.key_rotation_latest)
            row = await cur.fetchone()
            if row is None:
                return None
            await cur.execute(q.key_rotation_progress_list, {"run_id": row["run_id"]})
            progress = await cur.fetchall()
            await cur.execute(q.key_rotation_failure_count, {"run_id": row["run_id"]})
            failed = await cur.fetchone()
        last = max((p["updated_at"] for p in progress), default=None)
        busy_s = (last - row["started_at"]).total_seconds() if last and row["started_at"] else 0
        reencrypted = sum(int(p["reencrypted"]) for p in progress)
        return {"run_id": str(row["run_id"]), "status": row["status"],
                "target_version": row["target_version"], "created_at": _iso(row["created_at"]),
                "started_at": _iso(row["started_at"]), "finished_at": _iso(row["finished_at"]),
                "columns": [progress_json(p) for p in progress],
                "undecryptable": int(failed["n"]) if failed else 0,
                "rate_per_s": reencrypted / busy_s if busy_s > 0 and reencrypted else None}

    async def rotate(self, conn: AnyConn, *, batch_size: int | None = None,
                     pause_s: float | None = None) -> tuple[Run, bool]:
        """Enqueue one ``secret.reencrypt`` run to the active version; returns (run, created).

        Idempotent: while a rotation to the same version is pending or running, that run is
        returned. RotationInProgress while one to another version is."""
        keyring = await self.sync(conn)
        target = keyring.active_version
        options: dict[str, Any] = {"target_version": target}
        if batch_size is not None:
            options["batch_size"] = batch_size
        if pause_s is not None:
            options["pause_s"] = pause_s
        q = self._queries
        async with conn.transaction():
            await conn.execute(q.key_rotation_lock)
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(q.key_rotation_find_active)
                active = await cur.fetchone()
            if active is not None:
                if active["target_version"] != target:
                    raise RotationInProgress(
                        f"a rotation to key version {active['target_version']} is still "
                        f"{active['status']} (run {active['run_id']}); wait for it or cancel it "
                        f"before rotating to version {target}")
                return await self._control.get(conn, active["run_id"]), False
            run, _ = await self._enqueuer.enqueue(
                EnqueueRequest(job_type=REENCRYPT, input=options), conn=conn, builtin=True)
            await conn.execute(q.key_rotation_register, {
                "run_id": run.id, "target_version": target, "now": None})
        return run, True

    async def retire(self, conn: AnyConn, version: int) -> dict[str, Any]:
        """Retire ``version``: refused while it is active or any registered row uses it; after
        it, the version no longer decrypts (in every process, from its next key check)."""
        keyring = await self.sync(conn) if self._rt.has_keyring else None
        if keyring is not None and version == keyring.active_version:
            raise InvalidTransition(f"key version {version} is the active version: "
                                    "activate another version and rotate first")
        q = self._queries
        async with conn.transaction():
            await conn.execute(q.key_rotation_lock)
            users = {c["column"]: c["by_version"].get(str(version), 0)
                     for c in await self.counts(conn)}
            in_use = {name: n for name, n in users.items() if n}
            if in_use:
                listing = ", ".join(f"{name}: {n}" for name, n in in_use.items())
                raise InvalidTransition(
                    f"key version {version} is still used by {sum(in_use.values())} rows "
                    f"({listing}): run `notifyq keys rotate --wait` first")
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(q.key_version_retire, {"version": version, "now": None})
                row = await cur.fetchone()
        if row is None:
            raise InvalidTransition(f"key version {version} was never configured here")
        if keyring is not None:
            keyring.set_retired({*keyring.retired, version})
        return {"version": version, "retired_at": _iso(row["retired_at"])}

    async def failures(self, conn: AnyConn, run_id: UUID,
                       limit: int = FAILURES_LISTED) -> list[dict[str, Any]]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self._queries.key_rotation_failure_list,
                              {"run_id": run_id, "limit": limit})
            return [dict(r) for r in await cur.fetchall()]


def _progress(columns: list[dict[str, Any]],
              rotation: dict[str, Any] | None) -> dict[str, Any]:
    """How far the keyring's data is on the active version: rows done (on it) of all rows of
    the registered columns, and, while a rotation runs, its re-encryption rate (rows it
    re-encrypted over the time from its start to its last checkpoint) and the time left at that
    rate."""
    total = sum(int(c["rows"]) for c in columns)
    remaining = sum(int(c["remaining"]) for c in columns)
    rate = rotation.get("rate_per_s") if rotation else None
    running = rotation is not None and rotation["status"] in ("pending", "running")
    return {"done": total - remaining, "total": total,
            "percent": 100.0 if not total else round(100 * (total - remaining) / total, 1),
            "rate_per_s": rate if running else None,
            "eta_s": remaining / rate if running and rate and remaining else None}


def progress_json(row: dict[str, Any]) -> dict[str, Any]:
    return {"column": row["column_name"], "pass": row["pass"],
            "reencrypted": int(row["reencrypted"]), "conflicts": int(row["conflicts"]),
            "batches": int(row["batches"]), "finished": row["finished_at"] is not None}


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
