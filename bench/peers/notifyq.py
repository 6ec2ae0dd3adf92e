"""bench/compare driver for notifyq itself, from this checkout, in notifyq's own environment
(``python3 -P bench/peers/notifyq.py``; never in a peer's venv).

Used as the README shows: ``App(settings=load_settings(database_url=dsn))`` with every setting
at its default, ``app.migrate()``, an ``@app.handler`` async no-op, ``app.enqueue(...)`` for one,
``app.enqueue_many([...])`` for bulk, ``app.run_worker(concurrency=10)`` as the worker and
``burst=True`` (its documented burst mode) for the drain. The extra cell ``drain_best`` drains
at concurrency 50, 100 and 200 and reports the best.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]
# bench/compare --notifyq-src: measure another copy of notifyq (e.g. `git archive HEAD`).
ROOT = Path(os.environ.get("NOTIFYQ_SRC") or CHECKOUT)
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE] + [
    str(HERE)]

from _common import CELLS, Peer, Sizes, cell_drain, expect, main, sql_one, started  # noqa: E402

from notifyq import App, JobContext  # noqa: E402
from notifyq._settings import load_settings  # noqa: E402

BEST_OF = (50, 100, 200)


class NotifyqPeer(Peer):
    name = "notifyq"
    has_burst = True
    cells = (*CELLS, "drain_defaults", "drain_100", "drain_best")

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.app = App(settings=load_settings(database_url=dsn))
        self._worker: asyncio.Task[None] | None = None

        @self.app.handler("bench.noop")
        async def noop(ctx: JobContext) -> None:
            started(ctx.input.get("i"))

    def meta(self) -> dict[str, Any]:
        import subprocess

        rev = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain",
                                "notifyq", "db"], capture_output=True, text=True,
                               check=False).stdout.strip()
        version = (os.environ.get("NOTIFYQ_SRC_DESC") if os.environ.get("NOTIFYQ_SRC") else
                   f"checkout {rev}{' (+ uncommitted changes)' if dirty else ''}")
        s = self.app.settings
        return {"version": version, "source": str(ROOT),
                "python": platform.python_version(),
                "settings": f"App(load_settings(database_url=dsn)) defaults (pool_max_size "
                            f"{s.pool_max_size}, poll {s.worker.poll_interval_s} s, lease "
                            f"{s.worker.lease_s} s); enqueue / enqueue_many; "
                            "run_worker(concurrency=10); drain: burst=True; drain_best: "
                            f"burst at concurrency {'/'.join(map(str, BEST_OF))}"}

    async def setup(self) -> None:
        logging.getLogger("notifyq").setLevel(logging.WARNING)  # start/stop lines
        await self.app.__aenter__()
        await self.app.migrate()

    async def open_client(self) -> None:
        await self.app.__aenter__()

    async def close(self) -> None:
        await self.stop_worker()
        await self.app.__aexit__(None, None, None)

    async def reset(self) -> None:
        async with (await self.app.pool()).connection() as conn:
            await conn.execute("TRUNCATE notifyq.job_run CASCADE")

    async def enqueue(self, i: int) -> None:
        await self.app.enqueue("bench.noop", {"i": i})

    async def enqueue_many(self, ids: list[int]) -> None:
        await self.app.enqueue_many([{"job_type": "bench.noop", "input": {"i": i}}
                                     for i in ids])

    async def burst(self, concurrency: int | None) -> None:
        if concurrency is None:  # worker.concurrency's default
            await self.app.run_worker(burst=True)
        else:
            await self.app.run_worker(concurrency=concurrency, burst=True)

    async def start_worker(self, concurrency: int | None) -> None:
        self._worker = asyncio.create_task(
            self.app.run_worker() if concurrency is None
            else self.app.run_worker(concurrency=concurrency))
        await asyncio.sleep(0.5)

    async def stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
            self._worker = None

    async def verify(self, conn: Any, n: int) -> dict[str, Any]:
        total, ok = await sql_one(conn, "SELECT count(*), count(*) FILTER (WHERE status = "
                                  "'completed' AND attempts = 1) FROM notifyq.job_run")
        facts = {"runs": total, "completed_attempts_1": ok}
        return expect(facts, {"runs": n, "completed_attempts_1": n})

    async def extra_cell(self, cell: str, sizes: Sizes) -> Any:
        if cell != "drain_best":
            return await super().extra_cell(cell, sizes)
        rates = {c: (await cell_drain(self, sizes, c))["jobs_per_s"] for c in BEST_OF}
        best = max(rates, key=lambda c: rates[c])
        return {"jobs_per_s": rates[best], "concurrency": best,
                "by_concurrency": {str(c): r for c, r in rates.items()}}


if __name__ == "__main__":
    main(NotifyqPeer, __file__)
