"""The answer of ``notifyq keys status --json`` and ``GET /v1/keys``: one JSON object whose
fields are a contract (``schema_version`` 1, documented in docs/keys.md, "keys status --json").
Fields may be added within a schema version; none is renamed, removed or changes meaning.

Everything here is pure: :class:`~notifyq._keys.admin.KeyAdmin` reads the rows, these functions
shape them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

SCHEMA_VERSION = 1


def status_json(*, versions: Sequence[Mapping[str, Any]], active: Mapping[str, Any] | None,
                configured: Sequence[int], holders: Sequence[Mapping[str, Any]],
                columns: list[dict[str, Any]], rotation: dict[str, Any] | None
                ) -> dict[str, Any]:
    """``versions``: rows of ``key_version_list``; ``active``: the ``key_active_get`` row;
    ``configured``: the versions of the process answering; ``holders``: ``key_holder_list``;
    ``columns``: per-column counts (``KeyAdmin.counts``); ``rotation``: :func:`rotation_json`."""
    version = int(active["version"]) if active else None
    processes = [process_json(h, version) for h in holders]
    for entry in columns:
        entry["remaining"] = sum(n for v, n in entry["by_version"].items()
                                 if version is None or int(v) != version)
    rows_left = sum(int(c["remaining"]) for c in columns)
    behind = [p["id"] for p in processes if p["encrypts_with"] != version]
    return {
        "schema_version": SCHEMA_VERSION,
        "active_version": version,
        "promotion": None if active is None else {
            "version": version, "promoted_at": iso(active["promoted_at"]),
            "promoted_by": active["promoted_by"], "forced": bool(active["forced"])},
        "versions": _versions(versions, version, configured, processes),
        "processes": processes,
        "columns": columns,
        "rotation": rotation,
        "progress": progress_json(columns, rotation),
        "rows_left": rows_left,
        "processes_left": behind,
        "done": version is not None and rows_left == 0 and not behind,
    }


def _versions(rows: Sequence[Mapping[str, Any]], active: int | None, configured: Sequence[int],
              processes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    known = {int(r["version"]): r for r in rows}
    mine = set(configured)
    out = []
    for v in sorted(mine | set(known)):
        row = known.get(v)
        out.append({
            "version": v, "active": v == active, "configured": v in mine,
            "decrypt_only": v in mine and v != active,
            "retired": bool(row and row["retired_at"]),
            "first_seen_at": iso(row["first_seen_at"]) if row else None,
            "promoted_at": iso(row["promoted_at"]) if row else None,
            "held_by": sum(v in p["versions"] for p in processes),
            "encrypted_by": sum(p["encrypts_with"] == v for p in processes),
        })
    return out


def process_json(row: Mapping[str, Any], active: int | None) -> dict[str, Any]:
    versions = [int(v) for v in row["versions"]]
    return {"id": row["id"], "role": row["role"], "host": row["host"], "pid": row["pid"],
            "versions": versions, "encrypts_with": row["encrypts_with"],
            "holds_active": active is not None and active in versions,
            "checked_at": iso(row["checked_at"]), "expires_at": iso(row["expires_at"])}


def rotation_json(row: Mapping[str, Any], progress: Sequence[Mapping[str, Any]],
                  undecryptable: int) -> dict[str, Any]:
    """The latest rotation (``key_rotation_latest``) with its checkpoints. ``rate_per_s``: rows
    re-encrypted per second of its work: from its start to now (to its last checkpoint once it
    ended, to its pause while paused), less the time it spent paused."""
    started = row["started_at"]
    end = (max((p["updated_at"] for p in progress), default=None)
           if row["status"] not in ("pending", "running", "waiting")
           else row["paused_at"] or row["now"])
    busy_s = ((end - started).total_seconds() - float(row["paused_s"])
              if end and started else 0.0)
    reencrypted = sum(int(p["reencrypted"]) for p in progress)
    options = row["input"] if isinstance(row["input"], dict) else {}
    return {"run_id": str(row["run_id"]), "status": row["status"],
            "target_version": row["target_version"], "created_at": iso(row["created_at"]),
            "started_at": iso(started), "finished_at": iso(row["finished_at"]),
            "paused": row["paused_at"] is not None, "paused_at": iso(row["paused_at"]),
            "rate_limit_per_s": row["rate_per_s"],
            "batch_size": int(options.get("batch_size", 500)),
            "columns": [checkpoint_json(p) for p in progress],
            "undecryptable": undecryptable,
            "rate_per_s": reencrypted / busy_s if busy_s > 0 and reencrypted else None}


def progress_json(columns: Sequence[Mapping[str, Any]],
                  rotation: Mapping[str, Any] | None) -> dict[str, Any]:
    """How far the data is on the active version: rows on it of all rows of the registered
    columns; while a rotation runs (not paused), its rate and the time left at that rate."""
    total = sum(int(c["rows"]) for c in columns)
    remaining = sum(int(c["remaining"]) for c in columns)
    moving = rotation is not None and rotation["status"] in ("pending", "running")
    rate = rotation.get("rate_per_s") if rotation and moving else None
    paused = bool(rotation and rotation["paused"])
    return {"done": total - remaining, "total": total,
            "percent": 100.0 if not total else round(100 * (total - remaining) / total, 1),
            "rate_per_s": rate,
            "eta_s": remaining / rate if rate and remaining and not paused else None}


def checkpoint_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"column": row["column_name"], "pass": row["pass"],
            "reencrypted": int(row["reencrypted"]), "conflicts": int(row["conflicts"]),
            "batches": int(row["batches"]), "finished": row["finished_at"] is not None}


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
