"""Durable runs end to end, in-process workers on a real database: memoized steps and replay
policies, child runs and parent-close policies, concurrency and dedupe policies, durable sleeps
and signals."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import pytest

from notifyq import (
    App,
    ChildFailed,
    ConcurrencyPolicy,
    ConcurrencyRejected,
    DedupePolicy,
    JobContext,
    RetryPolicy,
    RunStatus,
    Scope,
    StepError,
)
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, running, scalar
from tests.support import eventually

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(attempts=3, backoff="fixed", base_s=0.05, jitter=0)


def durable_app(dsn: str, **worker: Any) -> App:
    return App(settings=fast_settings(dsn, worker=worker, resumer={"interval_s": 0.1}))


async def finished(app: App, run_id: Any, timeout: float = 15.0) -> dict[str, Any]:  # noqa: ASYNC109
    async def check() -> dict[str, Any]:
        rows = await fetch(app, "SELECT * FROM notifyq.job_run WHERE id = %s", run_id)
        assert rows[0]["status"] in ("completed", "failed", "timed_out", "canceled"), rows[0]
        return rows[0]
    return await eventually(check, timeout=timeout)


async def status_of(app: App, run_id: Any) -> str:
    return str(await scalar(app, "SELECT status FROM notifyq.job_run WHERE id = %s", run_id))


async def until_waiting(app: App, run_id: Any) -> None:
    async def waiting() -> None:
        assert await status_of(app, run_id) == "waiting"
    await eventually(waiting)


# -- steps ------------------------------------------------------------------------------------


def five_step_handler(app: App, calls: Counter[str], *, fail_at: int, replay_from: str,
                      checkpoint_after: int | None = None) -> None:
    @app.handler("durable.five", retry=FAST_RETRY, replay_from=replay_from)  # type: ignore[arg-type]
    async def five(ctx: JobContext) -> list[int]:
        out = []
        for n in range(1, 6):
            async def work(n: int = n) -> int:
                calls[f"step{n}"] += 1
                if n == fail_at and ctx.run.attempt == 1:
                    raise RuntimeError(f"step {n} fails on the first attempt")
                return n * 10
            out.append(await ctx.step(f"step-{n}", work))
            if checkpoint_after == n:
                await ctx.checkpoint("after-" + str(n))
        return out


async def test_a_run_failing_after_three_of_five_steps_reexecutes_only_steps_four_and_five(
        dsn: str) -> None:
    calls: Counter[str] = Counter()
    async with durable_app(dsn) as app:
        five_step_handler(app, calls, fail_at=4, replay_from="last_step")
        run = await app.enqueue("durable.five")
        async with running(app):
            row = await finished(app, run.id)
        assert row["status"] == "completed"
        assert row["output"] == [10, 20, 30, 40, 50]
        assert row["attempts"] == 2
        assert calls == Counter({"step1": 1, "step2": 1, "step3": 1, "step4": 2, "step5": 1})
        steps = await app.steps(run.id)
        assert [s["step_id"] for s in steps] == [f"step-{n}" for n in range(1, 6)]
        assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5]
        assert all(s["status"] == "completed" for s in steps)


async def test_replay_from_scratch_reexecutes_every_step_on_retry(dsn: str) -> None:
    calls: Counter[str] = Counter()
    async with durable_app(dsn) as app:
        five_step_handler(app, calls, fail_at=4, replay_from="scratch")
        run = await app.enqueue("durable.five")
        async with running(app):
            row = await finished(app, run.id)
        assert row["status"] == "completed"
        assert calls == Counter({"step1": 2, "step2": 2, "step3": 2, "step4": 2, "step5": 1})


async def test_replay_from_last_checkpoint_reuses_only_steps_before_the_checkpoint(
        dsn: str) -> None:
    calls: Counter[str] = Counter()
    async with durable_app(dsn) as app:
        five_step_handler(app, calls, fail_at=4, replay_from="last_checkpoint",
                          checkpoint_after=2)
        run = await app.enqueue("durable.five")
        async with running(app):
            row = await finished(app, run.id)
        assert row["status"] == "completed"
        # Steps 1-2 precede the checkpoint: reused. Step 3 came after it: executed again.
        assert calls == Counter({"step1": 1, "step2": 1, "step3": 2, "step4": 2, "step5": 1})


async def test_a_step_retry_policy_retries_the_step_inside_the_run(dsn: str) -> None:
    tries: list[int] = []
    async with durable_app(dsn) as app:
        @app.handler("durable.flaky-step")
        async def flaky(ctx: JobContext) -> Any:
            def call() -> str:
                tries.append(1)
                if len(tries) < 3:
                    raise ConnectionError("upstream hiccup")
                return "ok"
            return await ctx.step("call", call, retry=FAST_RETRY)

        run = await app.enqueue("durable.flaky-step")
        async with running(app):
            row = await finished(app, run.id)
        assert (row["status"], row["output"], row["attempts"]) == ("completed", "ok", 1)
        assert len(tries) == 3
        (step,) = await app.steps(run.id)
        assert step["attempts"] == 3


async def test_a_step_id_used_twice_or_a_non_json_step_output_fails_the_run_clearly(
        dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.twice", retry=FAST_RETRY)
        async def twice(ctx: JobContext) -> None:
            await ctx.step("same", lambda: 1)
            await ctx.step("same", lambda: 2)

        @app.handler("durable.not-json", retry=FAST_RETRY)
        async def not_json(ctx: JobContext) -> None:
            await ctx.step("set", lambda: {1, 2})

        a = await app.enqueue("durable.twice")
        b = await app.enqueue("durable.not-json")
        async with running(app):
            row_a = await finished(app, a.id)
            row_b = await finished(app, b.id)
    for row, text in ((row_a, "used twice"), (row_b, "not JSON")):
        assert row["status"] == "failed"
        assert row["attempts"] == 1  # a misused step is not retried
        assert text in row["error"]["message"]
        assert row["error"]["type"] == f"{StepError.__module__}.StepError"


# -- children ---------------------------------------------------------------------------------


async def test_a_parent_waiting_on_ten_children_holds_no_worker_slot(dsn: str) -> None:
    spawned: Counter[str] = Counter()
    async with durable_app(dsn) as app:
        @app.handler("durable.child")
        async def child(ctx: JobContext) -> int:
            return int(ctx.input["n"]) * 2

        @app.handler("durable.parent")
        async def parent(ctx: JobContext) -> int:
            children = []
            for n in range(10):
                spawned["spawn"] += 1
                children.append(await ctx.spawn_child("durable.child", {"n": n}))
            results = await ctx.wait_for(*children)
            return sum(results)

        run = await app.enqueue("durable.parent")
        # One slot: if the waiting parent kept it, no child could ever run.
        async with running(app, concurrency=1):
            row = await finished(app, run.id)
        assert (row["status"], row["output"]) == ("completed", 90)
        children = await fetch(app, "SELECT status, parent_run_id, root_run_id, trigger_source "
                                    "FROM notifyq.job_run WHERE parent_run_id = %s", run.id)
        assert len(children) == 10  # the resumed parent replayed its spawns, created none
        assert {(c["status"], c["root_run_id"], c["trigger_source"]) for c in children} == {
            ("completed", run.id, "parent")}
        assert spawned["spawn"] == 20  # executed twice (first run + resume), spawned once each


async def test_a_failed_child_raises_child_failed_in_the_parent(dsn: str) -> None:
    seen: list[str] = []
    async with durable_app(dsn) as app:
        @app.handler("durable.bad-child", retry=RetryPolicy(attempts=1))
        async def bad(ctx: JobContext) -> None:
            raise ValueError("child broke")

        @app.handler("durable.caring-parent")
        async def caring(ctx: JobContext) -> str:
            child = await ctx.spawn_child("durable.bad-child")
            try:
                await ctx.wait_for(child)
            except ChildFailed as exc:
                seen.append(exc.status)
                return "handled"
            return "unreachable"

        run = await app.enqueue("durable.caring-parent")
        async with running(app):
            row = await finished(app, run.id)
        assert (row["status"], row["output"]) == ("completed", "handled")
        assert seen == ["failed"]


async def _tree(app: App, policy: str) -> tuple[Any, list[Any], list[Any]]:
    """root (running, blocked) -> 2 children (running, blocked) -> 2 grandchildren each."""
    root = await app.enqueue("tree.node", {"depth": 0, "policy": policy})
    async def spread() -> tuple[list[Any], list[Any]]:
        kids = await fetch(app, "SELECT id, status FROM notifyq.job_run WHERE parent_run_id = %s",
                           root.id)
        grandkids = await fetch(app, "SELECT id, status FROM notifyq.job_run WHERE "
                                     "parent_run_id = ANY(%s)", [k["id"] for k in kids])
        assert len(kids) == 2
        assert len(grandkids) == 4
        assert all(r["status"] == "running" for r in kids + grandkids)
        return [k["id"] for k in kids], [g["id"] for g in grandkids]
    kids, grandkids = await eventually(spread, timeout=15)
    return root.id, kids, grandkids


def tree_handlers(app: App, release: anyio.Event,
                  root_gate: anyio.Event | None = None) -> None:
    @app.handler("tree.node")
    async def node(ctx: JobContext) -> str:
        depth, policy = ctx.input["depth"], ctx.input["policy"]
        if depth < 2:
            for i in range(2):
                await ctx.spawn_child("tree.node", {"depth": depth + 1, "policy": policy},
                                      close_policy=policy, step_id=f"kid-{i}")
        if depth == 0 and root_gate is not None:
            await root_gate.wait()  # the root finishes once the test saw the whole tree
        else:
            await release.wait()  # blocked until the test lets go (or the run is canceled)
        return "done"


async def _whole_tree_running(app: App, root: Any) -> list[Any]:
    async def check() -> list[Any]:
        rows = await fetch(app, "SELECT id, status FROM notifyq.job_run WHERE root_run_id = %s",
                           root)
        assert len(rows) == 6
        assert {r["status"] for r in rows} == {"running"}
        return [r["id"] for r in rows]
    return await eventually(check, timeout=15)


@pytest.mark.parametrize("policy", ["terminate", "cancel"])
async def test_canceling_a_root_cascades_through_a_tree_of_depth_three(dsn: str,
                                                                      policy: str) -> None:
    release = anyio.Event()
    async with durable_app(dsn, concurrency=10) as app:
        tree_handlers(app, release)
        async with running(app, concurrency=10):
            root, kids, grandkids = await _tree(app, policy)
            await app.cancel(root)
            for run_id in [root, *kids, *grandkids]:
                row = await finished(app, run_id)
                assert row["status"] == "canceled", (run_id, row["status"])
            release.set()
        rows = await fetch(app, "SELECT count(*) AS n FROM notifyq.job_run WHERE status = "
                                "'running' OR leased_by IS NOT NULL")
        assert rows == [{"n": 0}]


async def test_abandon_lets_children_run_on_after_their_parent_finishes(dsn: str) -> None:
    release, root_gate = anyio.Event(), anyio.Event()
    async with durable_app(dsn, concurrency=10) as app:
        tree_handlers(app, release, root_gate)
        async with running(app, concurrency=10):
            root = await app.enqueue("tree.node", {"depth": 0, "policy": "abandon"})
            await _whole_tree_running(app, root.id)
            root_gate.set()
            assert (await finished(app, root.id))["status"] == "completed"
            descendants = await _whole_tree_running(app, root.id)  # still running
            release.set()
            for run_id in descendants:
                assert (await finished(app, run_id))["status"] == "completed"


async def test_terminate_interrupts_running_children_when_the_parent_completes(
        dsn: str) -> None:
    release, root_gate = anyio.Event(), anyio.Event()
    async with durable_app(dsn, concurrency=10) as app:
        tree_handlers(app, release, root_gate)
        async with running(app, concurrency=10):
            root = await app.enqueue("tree.node", {"depth": 0, "policy": "terminate"})
            await _whole_tree_running(app, root.id)
            root_gate.set()
            assert (await finished(app, root.id))["status"] == "completed"

            async def all_canceled() -> None:
                rows = await fetch(app, "SELECT status FROM notifyq.job_run "
                                        "WHERE root_run_id = %s", root.id)
                assert len(rows) == 6
                assert {r["status"] for r in rows} == {"canceled"}
            await eventually(all_canceled, timeout=15)
            release.set()


# -- concurrency and dedupe -------------------------------------------------------------------


async def test_concurrency_limit_one_never_runs_two_at_once_and_finishes_all_twenty(
        dsn: str) -> None:
    async with durable_app(dsn, concurrency=10) as app:
        @app.handler("durable.serial", concurrency=ConcurrencyPolicy(key="acct:{acct}"))
        async def serial(ctx: JobContext) -> None:
            await anyio.sleep(0.01)

        runs = [await app.enqueue("durable.serial", {"acct": 7, "i": i}) for i in range(20)]
        most = 0
        async with running(app, concurrency=10):
            async def done() -> None:
                nonlocal most
                busy = await scalar(app, "SELECT count(*) FROM notifyq.job_run WHERE "
                                         "concurrency_key = 'acct:7' AND status = 'running'")
                most = max(most, busy)
                n = await scalar(app, "SELECT count(*) FROM notifyq.job_run WHERE "
                                      "status = 'completed'")
                assert n == 20
            await eventually(done, timeout=30, interval=0.002)
        assert most <= 1
        spans = await fetch(app, "SELECT started_at, finished_at FROM notifyq.job_run "
                                 "ORDER BY started_at")
        assert len(spans) == len(runs)
        for before, after in itertools.pairwise(spans):
            assert before["finished_at"] <= after["started_at"]  # never overlapping


async def test_concurrency_reject_refuses_a_second_active_run(app: App) -> None:
    @app.handler("durable.only-one", concurrency=ConcurrencyPolicy(key="k:{k}",
                                                                   collision="reject"))
    async def only(ctx: JobContext) -> None:
        return None

    first = await app.enqueue("durable.only-one", {"k": 1})
    with pytest.raises(ConcurrencyRejected, match="busy"):
        await app.enqueue("durable.only-one", {"k": 1})
    other = await app.enqueue("durable.only-one", {"k": 2})
    rows = await fetch(app, "SELECT id FROM notifyq.job_run ORDER BY id")
    assert [r["id"] for r in rows] == [first.id, other.id]


async def test_concurrency_replace_cancels_the_pending_run_and_queues_the_new_one(
        app: App) -> None:
    @app.handler("durable.latest", concurrency=ConcurrencyPolicy(key="doc:{doc}",
                                                                 collision="replace"))
    async def latest(ctx: JobContext) -> None:
        return None

    old = await app.enqueue("durable.latest", {"doc": 1, "v": 1})
    new = await app.enqueue("durable.latest", {"doc": 1, "v": 2})
    assert await status_of(app, old.id) == "canceled"
    assert await status_of(app, new.id) == "pending"


async def test_concurrent_enqueues_with_one_dedupe_key_produce_exactly_one_run(app: App) -> None:
    @app.handler("durable.once", dedupe=DedupePolicy(key="invoice:{invoice}", window_s=60))
    async def once(ctx: JobContext) -> None:
        return None

    ids: list[Any] = []

    async def enqueue() -> None:
        ids.append((await app.enqueue("durable.once", {"invoice": 42})).id)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(enqueue)
    assert len(set(ids)) == 1
    assert await scalar(app, "SELECT count(*) FROM notifyq.job_run") == 1


async def test_scope_tenant_and_tags_are_stored_and_filterable(app: App) -> None:
    @app.handler("order.ship", scope=Scope(entity="order", id_from=lambda i: str(i["order"])))
    async def ship(ctx: JobContext) -> None:
        return None

    a = await app.enqueue("order.ship", {"order": 1}, tags=["eu"], tenant_id="acme")
    await app.enqueue("order.ship", {"order": 2})
    runs = await app.runs_for_scope("order", "1")
    assert [r.id for r in runs] == [a.id]
    assert [r.id for r in await app.list_runs(tenant_id="acme", tag="eu")] == [a.id]


async def test_a_worker_stores_handler_policies_on_the_job_definition(dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.defined", concurrency=ConcurrencyPolicy(key="a:{a}", limit=2),
                     dedupe=DedupePolicy(key="d:{a}", window_s=30), replay_from="scratch",
                     scope=Scope(entity="account", id_from="{a}"))
        async def defined(ctx: JobContext) -> None:
            return None

        async with running(app):
            pass
        (row,) = await fetch(app, "SELECT * FROM notifyq.job WHERE type = 'durable.defined'")
        assert (row["concurrency_key_template"], row["concurrency_limit"],
                row["dedupe_key_template"], row["dedupe_window_s"], row["replay_from"],
                row["scope_entity_type"]) == ("a:{a}", 2, "d:{a}", 30, "scratch", "account")
        # Another language enqueuing through SQL gets the same keys from the templates.
        await fetch(app, "SELECT notifyq.enqueue('durable.defined', '{\"a\": 5}')")
        (run,) = await fetch(app, "SELECT concurrency_key, dedupe_key, scope_entity_id "
                                  "FROM notifyq.job_run")
        assert run == {"concurrency_key": "a:5", "dedupe_key": "d:5", "scope_entity_id": "5"}


# -- durable waits ----------------------------------------------------------------------------


async def test_a_durable_sleep_releases_the_slot_and_resumes_after_the_delay(dsn: str) -> None:
    entered: list[int] = []
    async with durable_app(dsn) as app:
        @app.handler("durable.nap")
        async def nap(ctx: JobContext) -> str:
            entered.append(ctx.run.attempt)
            await ctx.step("before", lambda: "b")
            await ctx.sleep(timedelta(milliseconds=400))
            return "awake"

        run = await app.enqueue("durable.nap")
        async with running(app):
            await until_waiting(app, run.id)
            row = await finished(app, run.id)
        assert (row["status"], row["output"], row["attempts"]) == ("completed", "awake", 1)
        assert entered == [1, 1]  # resumed in the same attempt
        assert (row["finished_at"] - row["started_at"]) >= timedelta(milliseconds=400)


async def test_a_signal_resumes_the_waiting_run_with_its_payload(dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.approval")
        async def approval(ctx: JobContext) -> Any:
            return await ctx.wait_for_signal(f"approve:{ctx.input['id']}")

        run = await app.enqueue("durable.approval", {"id": 9})
        async with running(app):
            await until_waiting(app, run.id)
            assert await app.signal("approve:9", {"by": "ops"}) == 1
            row = await finished(app, run.id)
        assert (row["status"], row["output"]) == ("completed", {"by": "ops"})


async def test_a_signal_sent_before_the_run_waits_is_kept_for_it(dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.early")
        async def early(ctx: JobContext) -> Any:
            return await ctx.wait_for_signal("early-bird")

        assert await app.signal("early-bird", {"n": 1}) == 0
        await fetch(app, "SELECT notifyq.signal('unused', '{}')")  # the SQL entry point
        run = await app.enqueue("durable.early")
        async with running(app):
            row = await finished(app, run.id)
        assert (row["status"], row["output"]) == ("completed", {"n": 1})


async def test_a_signal_wait_past_its_deadline_ends_timed_out(dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.impatient")
        async def impatient(ctx: JobContext) -> Any:
            return await ctx.wait_for_signal("never", timeout=timedelta(milliseconds=300))

        run = await app.enqueue("durable.impatient")
        async with running(app):
            row = await finished(app, run.id)
        assert row["status"] == "timed_out"
        assert "no signal" in row["error"]["message"]


async def test_sleep_and_signal_survive_a_worker_restart(dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.patient")
        async def patient(ctx: JobContext) -> Any:
            await ctx.sleep(timedelta(milliseconds=600))
            return await ctx.wait_for_signal("go")

        run = await app.enqueue("durable.patient")
        async with running(app):
            await until_waiting(app, run.id)
        # The worker is gone; the wait is in the table, not in its memory.
        assert await status_of(app, run.id) == "waiting"
    async with durable_app(dsn) as fresh:
        @fresh.handler("durable.patient")
        async def patient_again(ctx: JobContext) -> Any:
            await ctx.sleep(timedelta(milliseconds=600))
            return await ctx.wait_for_signal("go")

        async with running(fresh):
            async def waiting_for_signal() -> None:
                rows = await fetch(fresh, "SELECT status, wait_kind FROM notifyq.job_run "
                                          "WHERE id = %s", run.id)
                assert rows == [{"status": "waiting", "wait_kind": "signal"}]
            await eventually(waiting_for_signal)
            await fresh.signal("go", {"ok": True})
            row = await finished(fresh, run.id)
        assert (row["status"], row["output"]) == ("completed", {"ok": True})
        assert row["attempts"] == 1


async def test_canceling_a_waiting_run_cancels_it_at_once(dsn: str) -> None:
    async with durable_app(dsn) as app:
        @app.handler("durable.forever")
        async def forever(ctx: JobContext) -> Any:
            return await ctx.wait_for_signal("never-sent")

        run = await app.enqueue("durable.forever")
        async with running(app):
            await until_waiting(app, run.id)
            canceled = await app.cancel(run.id)
        assert canceled.status is RunStatus.CANCELED
