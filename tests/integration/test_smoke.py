from __future__ import annotations

import pytest

from notifyq import App, JobContext, RunStatus

pytestmark = pytest.mark.anyio


async def test_burst_worker_completes_every_enqueued_run(app: App) -> None:
    seen: list[int] = []

    @app.handler("smoke.add")
    async def add(ctx: JobContext) -> dict[str, int]:
        seen.append(ctx.input["i"])
        return {"sum": ctx.input["i"] + 1}

    runs = await app.enqueue_many([{"job_type": "smoke.add", "input": {"i": i}} for i in range(50)])
    await app.run_worker(concurrency=5, burst=True)

    assert sorted(seen) == list(range(50))
    done = await app.get_run(runs[7].id)
    assert done.status is RunStatus.COMPLETED
    assert done.output == {"sum": 8}
