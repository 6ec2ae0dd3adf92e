"""Rate-limit windows as the CLI, the API and the dashboard show them.

Limits are declared on handlers (:class:`~notifyq._policies.RateLimit`) and enforced by the
keyed claim in SQL (migration 0015); this module only reads ``notifyq.rate_window``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from notifyq._clock import Clock
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries

MAX_KEYS_LISTED = 1000


@dataclass(frozen=True, slots=True)
class RateWindow:
    """A rate-limited key that has started runs: ``in_window`` of its ``limit`` starts are
    inside the last ``period_s`` seconds; ``next_start_at`` is when the next may start (None:
    now)."""

    key: str
    pool: str
    limit: int
    period_s: float
    in_window: int
    runnable: int
    next_start_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "pool": self.pool, "limit": self.limit,
                "period_s": self.period_s, "in_window": self.in_window,
                "runnable": self.runnable,
                "next_start_at": self.next_start_at.isoformat() if self.next_start_at else None}


async def list_windows(conn: AsyncConn, queries: Queries, clock: Clock) -> list[RateWindow]:
    cur = await conn.execute(queries.rate_window_list, {"now": clock.db_now(),
                                                        "limit": MAX_KEYS_LISTED})
    return [RateWindow(r["key"], r["pool"], r["rate_limit"], r["period_s"], r["in_window"],
                       r["runnable"], r["next_start_at"]) for r in await cur.fetchall()]
