"""In-process workers end to end: outcomes, handler kinds, cancel/retry, scheduling, poll-only
mode, fenced write-backs after a takeover, and periodic runs across several workers."""

from __future__ import annotations

import gc
import itertools
import time
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

import anyio
import psycopg
import pytest

from notifyq import (
    App,
    JobContext,
    ManualClock,
    Permanent,
    RetryPolicy,
    RunStatus,
    Snooze,
)
from notifyq._control import StatusCount
from notifyq._dispatch.completer import Claim, Completer
from notifyq._dispatch.outcome import Outcome
from notifyq._errors import LeaseLost
from notifyq._maintenance.reaper import Reaper
from tests.conftest import fast_settings
from tests.integration.inproc import fetch, run_row, running, scalar, status_becomes
from tests.support import backends, eventually, terminate

pytestmark = pytest.mark.anyio


async def _count(app: App, where: str = "true") -> int:
    return int(await scalar(app, f"SELECT count(*) FROM notifyq.job_run WHERE {where}"))


# -- outcomes -------------------------------------------------------------------------------------

async def test_a_failing_handler_is_retried_with_backoff_then_succeeds(app: App) -> None:
    calls: list[tuple[int, float]] = []

    @app.handler("t.flaky", retry=RetryPolicy(attempts=5, backoff="fixed", base_s=0.3, jitter=0))
    async def flaky(ctx: JobContext) -> dict[str, int]:
        calls.append((ctx.run.attempt, time.monotonic()))
        if ctx.run.attempt < 3:
            raise ConnectionError(f"upstream down (attempt {ctx.run.attempt})")
        return {"attempt": ctx.run.attempt}

    run = await app.enqueue("t.flaky", {})
    async with running(app):
        row = await status_becomes(app, run.id, "completed")
    assert [a for a, _ in calls] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(calls)]
    assert all(gap >= 0.25 for gap in gaps), gaps  # the 0.3 s backoff was waited
    assert row["attempts"] == 3
    assert row["output"] == {"attempt": 3}
    # The last failure stays on record next to the output.
    assert row["error"]["message"] == "upstream down (attempt 2)"
    assert row["error"]["retryable"] is True


async def test_a_handler_failing_every_attempt_ends_failed(app: App) -> None:
    @app.handler("t.broken", retry=RetryPolicy(attempts=2, base_s=0, jitter=0))
    async def broken(ctx: JobContext) -> None:
        raise RuntimeError("always")

    run = await app.enqueue("t.broken", {})
    async with running(app):
        row = await status_becomes(app, run.id, "failed")
    assert row["attempts"] == 2
    assert row["error"]["retryable"] is False
    assert row["error"]["attempt"] == 2
    assert row["finished_at"] is not None


async def test_permanent_fails_at_once_with_a_full_error(app: App) -> None:
    calls = 0

    @app.handler("t.perm", retry=RetryPolicy(attempts=10))
    async def perm(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        raise Permanent(LookupError("no such customer"))

    run = await app.enqueue("t.perm", {})
    async with running(app):
        row = await status_becomes(app, run.id, "failed")
    assert calls == 1
    assert row["attempts"] == 1
    error = row["error"]
    assert set(error) == {"message", "type", "stack", "retryable", "attempt"}
    assert error["message"] == "no such customer"
    assert error["type"] == "builtins.LookupError"
    assert error["retryable"] is False
    assert error["attempt"] == 1
    assert "LookupError: no such customer" in error["stack"]


async def test_snooze_puts_the_run_back_later_without_using_an_attempt(app: App) -> None:
    @app.handler("t.snooze", retry=RetryPolicy(attempts=1))
    async def snooze(ctx: JobContext) -> None:
        raise Snooze(3600)

    run = await app.enqueue("t.snooze", {})
    async with running(app):
        async def snoozed() -> dict[str, Any]:
            row = await run_row(app, run.id)
            assert row["status"] == "pending"
            assert row["run_at"] > run.run_at + timedelta(minutes=59)
            return row
        row = await eventually(snoozed)
    assert row["attempts"] == 0
    assert row["error"] is None


async def test_a_snoozed_run_on_its_last_attempt_runs_again(app: App) -> None:
    attempts: list[int] = []

    @app.handler("t.snooze_once", retry=RetryPolicy(attempts=1))
    async def snooze_once(ctx: JobContext) -> str:
        attempts.append(ctx.run.attempt)
        if len(attempts) == 1:
            raise Snooze(0.2)
        return "done"

    run = await app.enqueue("t.snooze_once", {})
    async with running(app):
        row = await status_becomes(app, run.id, "completed")
    assert attempts == [1, 1]
    assert row["attempts"] == 1
    assert row["output"] == "done"


async def test_a_handler_over_its_timeout_is_retried_then_timed_out(app: App) -> None:
    cancelled = 0

    @app.handler("t.slow", timeout_s=0.2, retry=RetryPolicy(attempts=2, base_s=0, jitter=0))
    async def slow(ctx: JobContext) -> None:
        nonlocal cancelled
        try:
            await anyio.sleep(30)
        finally:
            cancelled += 1

    run = await app.enqueue("t.slow", {})
    async with running(app):
        row = await status_becomes(app, run.id, "timed_out")
    assert cancelled == 2
    assert row["attempts"] == 2
    assert row["error"] == {"message": "timed out after 0.2 s", "type": "TimeoutError",
                            "retryable": False, "attempt": 2}


async def test_enqueue_applies_a_registered_handlers_defaults_before_any_worker_ran(
        app: App) -> None:
    @app.handler("t.defaults", retry=RetryPolicy(attempts=3), pool="mail", priority=-7)
    async def defaults(ctx: JobContext) -> None: ...

    run = await app.enqueue("t.defaults", {})
    [bulk] = await app.enqueue_many([{"job_type": "t.defaults"}])
    explicit = await app.enqueue("t.defaults", {}, max_attempts=9, pool="other", priority=1)
    assert (run.max_attempts, run.pool, run.priority) == (3, "mail", -7)
    assert (bulk.max_attempts, bulk.pool, bulk.priority) == (3, "mail", -7)
    assert (explicit.max_attempts, explicit.pool, explicit.priority) == (9, "other", 1)
    assert await scalar(app, "SELECT count(*) FROM notifyq.job") == 0


async def test_non_json_output_is_treated_as_a_failure(app: App) -> None:
    @app.handler("t.bad_output", retry=RetryPolicy(attempts=1))
    async def bad_output(ctx: JobContext) -> Any:
        return {"when": datetime.now(UTC)}

    run = await app.enqueue("t.bad_output", {})
    async with running(app):
        row = await status_becomes(app, run.id, "failed")
    assert "not JSON-serializable" in row["error"]["message"]
    assert row["output"] is None


async def test_output_or_error_jsonb_cannot_store_fails_that_run_alone(app: App) -> None:
    @app.handler("t.nul", retry=RetryPolicy(attempts=1))
    async def nul(ctx: JobContext) -> Any:
        if ctx.input["kind"] == "output":
            return {"text": "a\x00b"}
        if ctx.input["kind"] == "error":
            raise ValueError("bad\x00byte")
        if ctx.input["kind"] == "surrogate":
            return {"text": "a\ud800"}
        return {"ok": True}

    runs = await app.enqueue_many([{"job_type": "t.nul", "input": {"kind": k}}
                                   for k in ("output", "error", "fine", "surrogate", "fine")])
    async with running(app, concurrency=8):
        async def settled() -> None:
            assert await _count(app, "status IN ('completed', 'failed')") == 5
        await eventually(settled)
    out, err, fine, surrogate, _ = [await run_row(app, r.id) for r in runs]
    assert surrogate["status"] == "failed"
    assert "unpaired surrogate" in surrogate["error"]["message"]
    assert out["status"] == "failed"
    assert "NUL" in out["error"]["message"]
    assert err["status"] == "failed"
    assert err["error"]["message"] == "bad\ufffdbyte"
    assert fine["status"] == "completed"


async def test_an_unknown_job_type_fails_the_run_and_the_worker_carries_on(app: App) -> None:
    @app.handler("t.known")
    async def known(ctx: JobContext) -> int:
        return 1

    unknown = await app.enqueue("t.unknown", {}, max_attempts=1)
    async with running(app):
        row = await status_becomes(app, unknown.id, "failed")
        after = await app.enqueue("t.known", {})
        await status_becomes(app, after.id, "completed")
    assert row["error"]["type"] == "notifyq._errors.UnknownJobType"
    assert "no handler registered for job type 't.unknown'" in row["error"]["message"]


async def test_an_unknown_job_type_with_attempts_left_is_retried(app: App) -> None:
    unknown = await app.enqueue("t.unknown", {}, max_attempts=3)
    async with running(app):
        async def retried() -> None:
            row = await run_row(app, unknown.id)
            assert row["status"] == "pending"
            assert row["attempts"] == 1
            assert row["error"]["retryable"] is True
        await eventually(retried)


# -- handler kinds --------------------------------------------------------------------------------

async def test_a_sync_handler_runs_in_a_worker_thread(app: App) -> None:
    import threading

    main_thread = threading.get_ident()
    threads: list[int] = []

    @app.handler("t.sync")
    def sync(ctx: JobContext) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return {"doubled": ctx.input["n"] * 2, "attempt": ctx.run.attempt}

    run = await app.enqueue("t.sync", {"n": 21})
    async with running(app):
        row = await status_becomes(app, run.id, "completed")
    assert row["output"] == {"doubled": 42, "attempt": 1}
    assert threads
    assert threads[0] != main_thread


async def test_a_class_handler_is_called_through_handle(app: App) -> None:
    @app.handler("t.klass")
    class Greeter:
        def __init__(self) -> None:
            self.greeting = "hello"

        async def handle(self, ctx: JobContext) -> str:
            return f"{self.greeting} {ctx.input['name']}"

    class Counter:
        def __init__(self, start: int) -> None:
            self.n = start

        def handle(self, ctx: JobContext) -> int:
            self.n += 1
            return self.n

    counter = Counter(100)
    app.handler("t.instance")(counter)
    a = await app.enqueue("t.klass", {"name": "ada"})
    b = await app.enqueue("t.instance", {})
    async with running(app):
        assert (await status_becomes(app, a.id, "completed"))["output"] == "hello ada"
        assert (await status_becomes(app, b.id, "completed"))["output"] == 101
    assert counter.n == 101


async def test_the_handler_sees_its_run_in_the_context(app: App) -> None:
    seen: list[Any] = []

    @app.handler("t.ctx", pool="special", priority=3)
    async def ctx_handler(ctx: JobContext) -> None:
        seen.append((ctx.run.id, ctx.run.job_type, ctx.run.pool, ctx.run.tags,
                     ctx.run.max_attempts, ctx.input))
        ctx.log.info("hello")

    run = await app.enqueue("t.ctx", {"k": "v"}, pool="special", tags=["a"], max_attempts=4)
    async with running(app):
        await status_becomes(app, run.id, "completed")
    assert seen == [(run.id, "t.ctx", "special", ["a"], 4, {"k": "v"})]


# -- cancel / retry -------------------------------------------------------------------------------

async def test_canceling_a_pending_run_cancels_it_at_once_and_it_never_runs(app: App) -> None:
    calls = 0

    @app.handler("t.never")
    async def never(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1

    run = await app.enqueue("t.never", {}, run_at=datetime.now(UTC) + timedelta(seconds=0.5))
    canceled = await app.cancel(run.id)
    assert canceled.status is RunStatus.CANCELED
    marker = await app.enqueue("t.never", {}, run_at=datetime.now(UTC) + timedelta(seconds=0.6))
    async with running(app):
        await status_becomes(app, marker.id, "completed")
    assert calls == 1
    assert (await app.get_run(run.id)).status is RunStatus.CANCELED


async def test_canceling_a_running_run_interrupts_its_handler_via_notify(dsn: str) -> None:
    # lease 30 s: heartbeats every 10 s, so only the NOTIFY can stop the handler in time.
    app = App(settings=fast_settings(dsn, worker={"lease_s": 30.0}))
    started = anyio.Event()
    interrupted = anyio.Event()

    @app.handler("t.forever")
    async def forever(ctx: JobContext) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            interrupted.set()

    async with app:
        run = await app.enqueue("t.forever", {})
        async with running(app):
            with anyio.fail_after(10):
                await started.wait()
            requested = await app.cancel(run.id)
            assert requested.status is RunStatus.RUNNING
            assert requested.cancel_requested_at is not None
            with anyio.fail_after(5):
                await interrupted.wait()
            row = await status_becomes(app, run.id, "canceled", within=5)
    assert row["error"]["type"] == "Canceled"
    assert row["finished_at"] is not None


async def test_a_cancel_requested_while_the_handler_fails_is_not_lost(app: App) -> None:
    calls = 0

    @app.handler("t.cancel_race", retry=RetryPolicy(attempts=5, base_s=0, jitter=0))
    async def cancel_race(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        # The cancel lands (its NOTIFY not yet seen) just before the handler fails.
        await fetch(app, "UPDATE notifyq.job_run SET cancel_requested_at = now() "
                         "WHERE id = %s RETURNING id", ctx.run.id)
        raise ConnectionError("upstream down")

    run = await app.enqueue("t.cancel_race", {})
    async with running(app):
        row = await status_becomes(app, run.id, "canceled")
    assert calls == 1  # not retried
    assert row["finished_at"] is not None
    assert row["error"]["message"] == "upstream down"
    assert row["attempts"] == 1


async def test_retrying_a_failed_run_runs_it_again(app: App) -> None:
    @app.handler("t.once_bad")
    async def once_bad(ctx: JobContext) -> str:
        if ctx.input.get("fixed") is None and ctx.run.attempt == 1:
            raise Permanent("first time")
        return f"attempt {ctx.run.attempt}"

    run = await app.enqueue("t.once_bad", {})
    async with running(app):
        await status_becomes(app, run.id, "failed")
        again = await app.retry(run.id)
        assert again.status is RunStatus.PENDING
        row = await status_becomes(app, run.id, "completed")
    assert row["output"] == "attempt 2"
    assert row["attempts"] == 2


async def test_canceling_or_retrying_in_the_wrong_state_is_refused(app: App) -> None:
    from notifyq import InvalidTransition, RunNotFound

    run = await app.enqueue("t.x", {})
    with pytest.raises(InvalidTransition, match=r"cannot retry run .*: it is pending"):
        await app.retry(run.id)
    await app.cancel(run.id)
    with pytest.raises(InvalidTransition, match="it is canceled"):
        await app.cancel(run.id)
    with pytest.raises(RunNotFound):
        await app.get_run("00000000-0000-0000-0000-000000000000")
    with pytest.raises(ValueError, match="not a run id"):
        await app.cancel("nope")


# -- scheduling -----------------------------------------------------------------------------------

async def test_a_run_scheduled_300_ms_ahead_starts_on_time(dsn: str) -> None:
    # The poll is 10 s away, so only the worker's timer for the next due run can start it
    # within the bound; the bound is loose enough for a loaded CI machine (it is not a
    # latency measurement: `notifyq bench --only latency` is).
    app = App(settings=fast_settings(dsn, worker={"poll_interval_s": 10.0}))
    started_db: list[datetime] = []

    @app.handler("t.timed")
    async def timed(ctx: JobContext) -> None:
        async with (await app.pool()).connection() as conn:
            cur = await conn.execute("SELECT clock_timestamp() AS t")
            row = await cur.fetchone()
            assert row is not None
            started_db.append(row["t"])

    async with app, running(app):
        now = await scalar(app, "SELECT clock_timestamp()")
        run = await app.enqueue("t.timed", {}, run_at=now + timedelta(milliseconds=300))
        row = await status_becomes(app, run.id, "completed")
    assert row["run_at"] == run.run_at
    assert row["started_at"] >= row["run_at"]
    assert started_db[0] >= row["run_at"]
    assert started_db[0] - row["run_at"] < timedelta(seconds=2)


async def _lock_waits(app: App, condition: LiteralString) -> int:
    """How many of the test database's backends wait on a lock, their ``condition`` true."""
    return int(await scalar(app, "SELECT count(*) FROM pg_stat_activity "
                                 "WHERE datname = current_database() "
                                 "AND wait_event_type = 'Lock' AND " + condition))


async def test_a_wake_up_is_claimed_while_the_next_run_question_is_unanswered(dsn: str) -> None:
    """An idle producer asks when its pool's next scheduled run is due; a NOTIFY that comes
    meanwhile is claimed at once, not once the answer is in. The question is held unanswered
    for real: it reads rate_window, which the test locks. The poll is 10 s away, so only the
    NOTIFY can start the run."""
    app = App(settings=fast_settings(dsn, worker={"poll_interval_s": 10.0}))

    @app.handler("t.woken")
    async def woken(ctx: JobContext) -> None: ...

    async def questions_waiting() -> int:
        return await _lock_waits(app, "query LIKE '%%_rate_next_start%%'")

    async def question_waits() -> None:
        assert await questions_waiting() == 1

    async with app, await psycopg.AsyncConnection.connect(dsn) as locker, running(app):
        await locker.execute("LOCK TABLE notifyq.rate_window IN ACCESS EXCLUSIVE MODE")
        first = await app.enqueue("t.woken", {})  # after its claim the producer goes idle
        await status_becomes(app, first.id, "completed")
        await eventually(question_waits)
        second = await app.enqueue("t.woken", {})
        await status_becomes(app, second.id, "completed", within=5)
        assert await questions_waiting() == 1  # still unanswered: the run did not wait for it
        await locker.rollback()


_HOLD_CLAIM_DDL = """
CREATE FUNCTION public.hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(4242);
    RETURN NEW;
END $$;
CREATE TRIGGER job_run_hold_claim BEFORE UPDATE OF status ON notifyq.job_run FOR EACH ROW
    WHEN (NEW.status = 'running' AND OLD.input ? 'hold')
    EXECUTE FUNCTION public.hold_claim();
"""


async def test_a_run_committed_while_a_claim_is_on_its_way_is_claimed_beside_it(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    """A claim's statement sees only the runs committed before it went out; a NOTIFY that comes
    while it is on its way is claimed beside it, on another completer lane, not after its
    answer. The claim is held on its way for real: claiming the run marked ``hold`` waits (a
    test trigger) for an advisory lock the test holds. The poll is 10 s away."""
    sql.execute(_HOLD_CLAIM_DDL)
    app = App(settings=fast_settings(dsn, worker={"poll_interval_s": 10.0}))

    @app.handler("t.beside")
    async def beside(ctx: JobContext) -> None: ...

    async def claims_held() -> int:
        return await _lock_waits(app, "wait_event = 'advisory'")

    async def claim_held() -> None:
        assert await claims_held() == 1

    async with app, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as locker, \
            running(app):
        await locker.execute("SELECT pg_advisory_lock(4242)")
        held = await app.enqueue("t.beside", {"hold": True})
        await eventually(claim_held)
        second = await app.enqueue("t.beside", {})
        await status_becomes(app, second.id, "completed", within=5)
        assert await claims_held() == 1  # still on its way: the second run did not wait for it
        await locker.execute("SELECT pg_advisory_unlock(4242)")
        await status_becomes(app, held.id, "completed")


async def test_poll_only_mode_runs_everything_without_a_listener(dsn: str) -> None:
    app = App(settings=fast_settings(dsn, worker={"listen": False}))
    seen: list[int] = []

    @app.handler("t.polled")
    async def polled(ctx: JobContext) -> None:
        seen.append(ctx.input["i"])

    async with app, running(app, concurrency=3):
        await app.enqueue_many([{"job_type": "t.polled", "input": {"i": i}}
                                for i in range(10)])
        await app.enqueue("t.polled", {"i": 10})
        async def all_done() -> None:
            assert await _count(app, "status = 'completed'") == 11
        await eventually(all_done)
        listeners = await scalar(app, "SELECT count(*) FROM pg_stat_activity WHERE "
                                      "application_name = 'notifyq-listener' AND "
                                      "datname = current_database()")
    assert listeners == 0
    assert sorted(seen) == list(range(11))


async def test_the_completer_keeps_its_own_connection_and_replaces_it_when_killed(
        app: App, sql: Any) -> None:
    seen: list[int] = []

    @app.handler("t.own")
    async def own(ctx: JobContext) -> None:
        seen.append(ctx.input["i"])

    async def completed(n: int) -> None:
        assert await _count(app, "status = 'completed'") == n

    def completer_backends() -> set[int]:
        return {pid for pid, _ in backends(sql, "notifyq-completer")}

    async with running(app, concurrency=3):
        await app.enqueue_many([{"job_type": "t.own", "input": {"i": i}} for i in range(20)])
        await eventually(lambda: completed(20))
        first = completer_backends()  # one, or two when statements overlapped (its lanes)
        assert 1 <= len(first) <= 2
        assert terminate(sql, "notifyq-completer") == len(first)
        await app.enqueue_many([{"job_type": "t.own", "input": {"i": i}}
                                for i in range(20, 40)])
        await eventually(lambda: completed(40))
        second = completer_backends()
    assert second
    assert not second & first
    assert sorted(seen) == list(range(40))  # each once: nothing lost or run twice

    async def closed() -> None:  # with the worker; its backend exits a moment later
        assert completer_backends() == set()
    await eventually(closed)


async def test_handlers_that_wait_run_on_every_slot_at_once(app: App) -> None:
    """Slots are woken one at a time, each as the last takes its run: handlers that wait must
    still fill every slot. Each of these waits until all six run at once, so one slot short
    and none would finish."""
    inside = 0
    all_inside = anyio.Event()
    seen_slots: set[str] = set()

    @app.handler("t.together")
    async def together(ctx: JobContext) -> None:
        nonlocal inside
        seen_slots.add(str(anyio.get_current_task().name))
        inside += 1
        if inside == 6:
            all_inside.set()
        await all_inside.wait()

    await app.enqueue_many([{"job_type": "t.together", "input": {}} for _ in range(12)])
    async with running(app, concurrency=6):
        with anyio.fail_after(10):
            await all_inside.wait()

        async def all_completed() -> None:
            assert await _count(app, "status = 'completed'") == 12
        await eventually(all_completed)
    assert len(seen_slots) == 6


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_the_heap_is_frozen_while_a_worker_runs_and_given_back_when_the_last_stops(
        dsn: str) -> None:
    """``worker.freeze_heap``: the objects that existed when the first worker started stay out
    of the collector's full collections until the last worker of the process stops; a run
    created meanwhile is still collected as usual."""
    assert gc.get_freeze_count() == 0
    first, second = App(settings=fast_settings(dsn)), App(settings=fast_settings(dsn))
    cycles: list[weakref.ref[_Cycle]] = []

    @second.handler("t.cycle")
    async def cycle(ctx: JobContext) -> None:
        cycles.append(weakref.ref(_Cycle()))  # garbage only the collector frees

    async with first, second:
        run = await second.enqueue("t.cycle", {})
        async with running(first):
            assert gc.get_freeze_count() > 0
            async with running(second):
                await status_becomes(second, run.id, "completed")
            assert gc.get_freeze_count() > 0  # the first still runs
            gc.collect()
            assert cycles[0]() is None  # made while frozen, and collected as usual
        assert gc.get_freeze_count() == 0


async def test_with_freeze_heap_off_the_worker_leaves_the_collector_alone(dsn: str) -> None:
    app = App(settings=fast_settings(dsn, worker={"freeze_heap": False}))
    async with app, running(app):
        assert gc.get_freeze_count() == 0


async def test_a_worker_only_claims_from_its_pools(app: App) -> None:
    @app.handler("t.pooled")
    async def pooled(ctx: JobContext) -> None: ...

    mine = await app.enqueue("t.pooled", {}, pool="mine")
    theirs = await app.enqueue("t.pooled", {}, pool="theirs")
    async with running(app, pools=["mine"]):
        await status_becomes(app, mine.id, "completed")
    assert (await run_row(app, theirs.id))["status"] == "pending"


# -- fencing --------------------------------------------------------------------------------------

async def test_a_claim_alone_is_its_own_statement_and_its_runs_start_before_its_producer_wakes(
        app: App, dsn: str) -> None:
    run = await app.enqueue("t.x", {})
    db, q = await app.pool(), app._runtime.queries
    completer = Completer(db, q, app.clock, worker_id="w", dsn=dsn)
    order: list[str] = []
    slot = anyio.Event()
    claimed: list[dict[str, Any]] = []

    def start(row: dict[str, Any]) -> None:  # what Worker._start does: wake an idle slot
        claimed.append(row)
        slot.set()

    claim = Claim("default", False, False, lambda: 10, start, idle=True)

    async def handler_slot() -> None:
        await slot.wait()
        order.append("handler slot")

    async def producer() -> None:
        await completer.claim(claim)
        order.append("producer")

    async def completer_statement() -> str:
        return str(await scalar(app, "SELECT query FROM pg_stat_activity"
                                     " WHERE application_name = 'notifyq-completer'"
                                     " AND datname = current_database()"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        async with anyio.create_task_group() as asking:
            asking.start_soon(handler_slot)
            asking.start_soon(producer)
        # Nothing to write back: job_run_claim, not the combined statement's empty half.
        alone = await completer_statement()
        await completer.write(run.id, claimed[0]["fence"], Outcome(RunStatus.COMPLETED))
        combined = await completer_statement()
        completer.close()
    assert order == ["handler slot", "producer"]
    assert (claim.want, claim.got, claimed[0]["id"]) == (10, 1, run.id)
    assert "set_config('synchronous_commit', 'off', true)" in alone
    assert "unnest" not in alone
    assert "unnest" in combined
    assert (await run_row(app, run.id))["status"] == "completed"


async def test_a_claimed_run_that_cannot_start_leaves_the_statements_other_work_alone(
        app: App, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    # A bug in starting one claimed run must not cost the statement's write-backs their
    # callbacks (their executors would wait forever) nor the completer its loop.
    held = await app.enqueue("t.x", {})
    broken = await app.enqueue("t.x", {})
    fine = await app.enqueue("t.x", {})
    db, q = await app.pool(), app._runtime.queries
    async with db.connection() as conn:
        cur = await conn.execute(q.job_run_claim, {
            "now": None, "pool": "default", "limit": 1, "worker_id": "w", "lease_s": 30.0,
            "keyed": False})
        row = await cur.fetchone()
    assert row is not None
    assert row["id"] == held.id
    completer = Completer(db, q, app.clock, worker_id="w", dsn=dsn)
    started: list[Any] = []

    def start(claimed: dict[str, Any]) -> None:
        if claimed["id"] == broken.id:
            raise KeyError("a column that is not there")
        started.append(claimed["id"])

    claim = Claim("default", False, False, lambda: 10, start)
    reported: list[tuple[bool, BaseException | None]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        # Queued before the completer's turn: one statement writes back and claims.
        completer.submit(held.id, row["fence"], Outcome(RunStatus.COMPLETED),
                         lambda written, error: reported.append((written, error)))
        await completer.claim(claim)
        # The completer is still running: a later write-back goes through.
        await completer.write(fine.id, (await run_row(app, fine.id))["fence"],
                              Outcome(RunStatus.COMPLETED))
        completer.close()
    assert reported == [(True, None)]
    assert started == [fine.id]
    assert (claim.want, claim.got) == (10, 1)  # the slot of the run not started goes back
    assert completer.batches == 2
    assert f"run {broken.id} was claimed but could not be started" in caplog.text
    rows = await fetch(app, "SELECT id, status, leased_by FROM notifyq.job_run ORDER BY id")
    assert rows == [{"id": held.id, "status": "completed", "leased_by": None},
                    {"id": broken.id, "status": "running", "leased_by": "w"},
                    {"id": fine.id, "status": "completed", "leased_by": None}]


async def test_an_idle_keyed_pools_claim_takes_keyed_and_plain_runs_in_one_statement(
        app: App, dsn: str) -> None:
    keyed = await app.enqueue_many([{"job_type": "t.k", "input": {}, "concurrency_key": "a",
                                     "concurrency_limit": 1} for _ in range(2)])
    plain = await app.enqueue("t.x", {})
    db, q = await app.pool(), app._runtime.queries
    completer = Completer(db, q, app.clock, worker_id="w", dsn=dsn)
    claimed: list[dict[str, Any]] = []
    claim = Claim("default", True, False, lambda: 10, claimed.append, idle=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        await completer.claim(claim)
        sent = str(await scalar(app, "SELECT query FROM pg_stat_activity"
                                     " WHERE application_name = 'notifyq-completer'"
                                     " AND datname = current_database()"))
        completer.close()
    assert completer.batches == 1
    assert "_claim_keyed(" in sent
    assert "picked AS" in sent
    # One of the key (its limit is 1), then the plain run.
    assert [r["id"] for r in claimed] == [keyed[0].id, plain.id]
    assert claim.got == 2


async def test_a_keyed_pools_write_back_and_claim_share_a_round_trip_and_the_claim_sees_the_room(
        app: App, dsn: str) -> None:
    """The write-back of a key's running run and the pool's next claim go in one pipeline, the
    write-back first: the claim takes the key's next run in the same cycle (its limit is 1),
    and each statement commits on its own (the write-back synchronously)."""
    first, second = await app.enqueue_many([
        {"job_type": "t.k", "input": {}, "concurrency_key": "a", "concurrency_limit": 1}
        for _ in range(2)])
    db, q = await app.pool(), app._runtime.queries
    completer = Completer(db, q, app.clock, worker_id="w", dsn=dsn)
    claimed: list[dict[str, Any]] = []
    reported: list[tuple[bool, BaseException | None]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(completer.run)
        await completer.claim(Claim("default", True, False, lambda: 10, claimed.append,
                                    idle=True))
        assert [r["id"] for r in claimed] == [first.id]  # the key's limit: one at a time
        claim = Claim("default", True, False, lambda: 10, claimed.append)
        completer.submit(first.id, claimed[0]["fence"], Outcome(RunStatus.COMPLETED),
                         lambda written, error: reported.append((written, error)))
        await completer.claim(claim)
        completer.close()
    assert reported == [(True, None)]
    assert [r["id"] for r in claimed] == [first.id, second.id]
    assert (claim.want, claim.got) == (10, 1)
    assert completer.batches == 2
    rows = await fetch(app, "SELECT id, status, xmin::text AS xid FROM notifyq.job_run "
                            "ORDER BY id")
    assert [(r["id"], r["status"]) for r in rows] == [(first.id, "completed"),
                                                      (second.id, "running")]
    assert rows[0]["xid"] != rows[1]["xid"]  # two transactions: the sync point between them


async def test_a_stale_worker_loses_its_write_after_a_takeover(dsn: str) -> None:
    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=1))
    app = App(settings=fast_settings(dsn), clock=clock)
    async with app:
        run = await app.enqueue("t.contested", {})
        db = await app.pool()
        q = app._runtime.queries

        async def claim(worker_id: str) -> dict[str, Any]:
            async with db.connection() as conn:
                cur = await conn.execute(q.job_run_claim, {
                    "now": clock.db_now(), "pool": "default", "limit": 1,
                    "worker_id": worker_id, "lease_s": 3.0, "keyed": False})
                [row] = await cur.fetchall()
                return row

        first = await claim("worker-a")
        clock.advance(timedelta(seconds=5))  # worker-a stopped heartbeating
        reaped = await Reaper(db, q, clock, app.settings.reaper).run_once()
        assert reaped == {"pending": 1, "failed": 0, "canceled": 0, "workers": 0,
                          "key_holders": 0}
        second = await claim("worker-b")
        assert second["fence"] != first["fence"]  # a fresh random fence per claim

        completer = Completer(db, q, clock)
        async with anyio.create_task_group() as tg:
            tg.start_soon(completer.run)
            with pytest.raises(LeaseLost):
                await completer.write(run.id, first["fence"], Outcome(
                    RunStatus.COMPLETED, output='{"by": "worker-a"}'))
            await completer.write(run.id, second["fence"], Outcome(
                RunStatus.COMPLETED, output='{"by": "worker-b"}'))
            # worker-a's late failure report is dropped too.
            with pytest.raises(LeaseLost):
                await completer.write(run.id, first["fence"], Outcome(
                    RunStatus.FAILED, error='{"message": "late"}'))
            completer.close()
        assert completer.lease_lost == 2
        rows = await fetch(app, "SELECT status, output, attempts, fence, leased_by "
                                "FROM notifyq.job_run")
    assert rows == [{"status": "completed", "output": {"by": "worker-b"}, "attempts": 2,
                     "fence": second["fence"], "leased_by": None}]


async def test_a_handler_whose_lease_was_taken_over_is_stopped_and_its_result_dropped(
        dsn: str) -> None:
    # heartbeats every 0.2 s; the lease is taken over behind the worker's back in SQL.
    app = App(settings=fast_settings(dsn, worker={"lease_s": 3.0, "heartbeat_interval_s": 0.2}))
    started = anyio.Event()
    stopped = anyio.Event()

    @app.handler("t.hijacked")
    async def hijacked(ctx: JobContext) -> str:
        started.set()
        try:
            await anyio.sleep(30)
        finally:
            stopped.set()
        return "never"

    async with app:
        run = await app.enqueue("t.hijacked", {})
        async with running(app):
            with anyio.fail_after(10):
                await started.wait()
            [taken] = await fetch(app, "UPDATE notifyq.job_run SET fence = fence + 1, "
                                       "leased_by = 'other' WHERE id = %s RETURNING fence",
                                  run.id)
            with anyio.fail_after(5):
                await stopped.wait()
        row = await run_row(app, run.id)
    assert (row["status"], row["leased_by"], row["fence"], row["output"]) == (
        "running", "other", taken["fence"], None)


# -- leases ---------------------------------------------------------------------------------------

async def test_heartbeats_keep_a_handler_longer_than_its_lease_from_being_reaped(
        dsn: str) -> None:
    # lease 1 s, heartbeat every 1/3 s, reaper every 0.2 s; the handler works 2.5 s.
    app = App(settings=fast_settings(dsn, worker={"lease_s": 1.0}))
    calls = 0

    @app.handler("t.long_lease")
    async def long_lease(ctx: JobContext) -> str:
        nonlocal calls
        calls += 1
        await anyio.sleep(2.5)  # simulated work spanning several leases
        return "done"

    async with app:
        run = await app.enqueue("t.long_lease", {})
        async with running(app):
            row = await status_becomes(app, run.id, "completed")
    assert calls == 1
    assert row["attempts"] == 1
    assert row["error"] is None


async def test_a_run_left_by_a_dead_worker_is_reaped_and_run_again(app: App) -> None:
    @app.handler("t.orphan")
    async def orphan(ctx: JobContext) -> int:
        return ctx.run.attempt

    run = await app.enqueue("t.orphan", {})
    # A worker that claimed it and died: its lease ran out a second ago.
    await fetch(app, "UPDATE notifyq.job_run SET status = 'running', attempts = 1, fence = 1, "
                     "leased_by = 'dead:1', claimed_at = now() - interval '31 s', "
                     "lease_expires_at = now() - interval '1 s' RETURNING id")
    async with running(app):
        row = await status_becomes(app, run.id, "completed")
    assert row["output"] == 2
    assert row["fence"] != 1  # claimed again: the dead worker's fence matches nothing
    assert row["error"]["type"] == "LeaseExpired"  # the reaper's note stays on record


async def test_stats_and_listing_reflect_the_table(app: App) -> None:
    runs = await app.enqueue_many([{"job_type": "t.s", "pool": "p1", "tags": [str(i % 2)]}
                                   for i in range(5)])
    await app.cancel(runs[0].id)
    stats = await app.stats()
    assert stats.counts == [StatusCount("t.s", "p1", "canceled", 1),
                            StatusCount("t.s", "p1", "pending", 4)]
    assert [(r.pool, r.runnable) for r in stats.runnable] == [("p1", 4)]
    first = await app.list_runs(limit=3)
    rest = await app.list_runs(limit=3, before=first[-1].id)
    assert len(first) == 3
    assert len(rest) == 2
    assert {r.id for r in first + rest} == {r.id for r in runs}
    assert {r.id for r in await app.list_runs(status="canceled")} == {runs[0].id}
    assert len(await app.list_runs(tag="1")) == 2
    with pytest.raises(ValueError, match="'nope' is not a valid RunStatus"):
        await app.list_runs(status="nope")


# -- periodic -------------------------------------------------------------------------------------

async def test_periodic_runs_once_per_tick_across_three_workers(dsn: str) -> None:
    apps = [App(settings=fast_settings(dsn, pool_max_size=4)) for _ in range(3)]
    executed: list[Any] = []
    for application in apps:
        @application.periodic(every=timedelta(milliseconds=300), input={"k": 1})
        @application.handler("t.tick")
        async def tick(ctx: JobContext) -> None:
            executed.append(ctx.run.id)

    async with apps[0], apps[1], apps[2]:
        async with anyio.create_task_group() as tg:
            for application in apps:
                tg.start_soon(application.run_worker)

            async def five_ticks() -> None:
                assert await _count(apps[0], "status = 'completed'") >= 5
            await eventually(five_ticks)
            tg.cancel_scope.cancel()
        per_tick = await fetch(apps[0], "SELECT run_at, count(*) AS n FROM notifyq.job_run "
                                        "GROUP BY run_at ORDER BY run_at")
        ticks = await fetch(apps[0], "SELECT t.tick_at, r.run_at, r.trigger_source, "
                                     "r.trigger_ref FROM notifyq.periodic_tick t "
                                     "JOIN notifyq.job_run r ON r.id = t.run_id")
        total = await _count(apps[0])
    assert len(per_tick) >= 5
    assert all(r["n"] == 1 for r in per_tick)
    assert len(ticks) == total
    assert all(t["tick_at"] == t["run_at"] for t in ticks)
    assert {t["trigger_ref"] for t in ticks} == {"t.tick@300ms"}
    steps = {(b["run_at"] - a["run_at"]) % timedelta(milliseconds=300)
             for a, b in itertools.pairwise(per_tick)}
    assert steps == {timedelta(0)}
    assert len(executed) == len(set(executed))
