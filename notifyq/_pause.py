"""Pausing and resuming a pool or a job type (CLI, API, dashboard and metrics share these).

A paused pool's or type's pending runs stay pending; runs already running finish. The state is a
row of ``notifyq.pause`` that the claim statement reads, so every worker obeys from its next claim
(within one poll interval), whatever process paused it. A resume NOTIFYs the pools concerned so
their workers claim at once instead of at their next poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._limits import JOB_TYPE, POOL
from notifyq._notifier import wake_payload

PauseKind = Literal["pool", "type"]
KINDS: tuple[PauseKind, ...] = ("pool", "type")
MAX_REASON = 500


@dataclass(frozen=True, slots=True)
class Pause:
    """A paused pool (``kind`` "pool") or job type (``kind`` "type")."""

    kind: str
    name: str
    reason: str | None
    paused_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "reason": self.reason,
                "paused_at": self.paused_at.isoformat()}


def check_target(kind: str, name: str) -> None:
    """ValueError naming the problem when ``kind``/``name`` cannot be a pool or a job type."""
    if kind not in KINDS:
        raise ValueError(f"pause kind must be pool or type, got {kind!r}")
    pattern = POOL if kind == "pool" else JOB_TYPE
    if not pattern.fullmatch(name):
        raise ValueError(f"{kind} name {name!r} must match {pattern.pattern}")


class PauseControl:
    def __init__(self, queries: Queries, clock: Clock) -> None:
        self._q = queries
        self._clock = clock

    async def pause(self, conn: AsyncConn, kind: PauseKind, name: str, *,
                    reason: str | None = None) -> tuple[Pause, bool]:
        """Pause a pool or a type; the bool is False when it was paused already (the reason,
        if given, replaces the old one). Workers stop claiming it at their next claim."""
        check_target(kind, name)
        if reason is not None and len(reason) > MAX_REASON:
            raise ValueError(f"reason is {len(reason)} characters; at most {MAX_REASON}")
        row = await (await conn.execute(self._q.pause_set, {
            "kind": kind, "name": name, "reason": reason,
            "now": self._clock.db_now()})).fetchone()
        assert row is not None  # noqa: S101 - an upsert with RETURNING returns its row
        return _pause(row), bool(row["created"])

    async def resume(self, conn: AsyncConn, kind: PauseKind, name: str) -> Pause | None:
        """Resume a pool or a type and wake the pools its runs are claimed from; None when it
        was not paused."""
        check_target(kind, name)
        async with conn.transaction():
            row = await (await conn.execute(self._q.pause_clear, {
                "kind": kind, "name": name})).fetchone()
            if row is None:
                return None
            if row["pools"]:
                await conn.execute(self._q.job_run_notify, {
                    "channel": self._q.schema,
                    "payloads": [wake_payload(pool) for pool in row["pools"]]})
        return _pause(row)

    async def list(self, conn: AsyncConn) -> list[Pause]:
        """What is paused, pools first, by name."""
        rows = await (await conn.execute(self._q.pause_list)).fetchall()
        return [_pause(row) for row in rows]


def _pause(row: dict[str, Any]) -> Pause:
    return Pause(row["kind"], row["name"], row["reason"], row["paused_at"])
