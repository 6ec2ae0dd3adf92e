"""Replaying a durable run from a step (issue 16, item 7) with real worker processes: the steps
recorded before the step are not executed again (executions counted in SQL), the step and the
later ones are; refusals are clear and change nothing. Also the CLI command and, through a real
``notifyq serve``, the API route and ``GET /v1/jobs/{id}?wait=``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from notifyq import App, InvalidTransition, RunFailed, RunNotFound, UnknownStep
from tests.apps.awaiting import REPLAY_DDL
from tests.conftest import fast_settings
from tests.integration.serving import Served
from tests.integration.test_cli import fails, ok
from tests.support import Workers, wait_until

pytestmark = pytest.mark.timeout(120)

APP = "tests.apps.awaiting:app"
Conn = psycopg.Connection[Any]


@pytest.fixture
def tables(sql: Conn) -> Conn:
    sql.execute(REPLAY_DDL)
    return sql


@pytest.fixture
async def app(dsn: str, tables: Conn) -> AsyncIterator[App]:
    application = App(settings=fast_settings(dsn))
    async with application:
        yield application


@pytest.fixture
def workers(dsn: str, logs: Path, tables: Conn) -> Iterator[Workers]:
    with Workers(dsn, logs, app=APP, concurrency=4) as fleet:
        fleet.start()
        yield fleet


def executions(sql: Conn, run_id: UUID) -> dict[str, int]:
    rows = sql.execute("SELECT step, count(*) FROM step_exec WHERE run_id = %s GROUP BY step",
                       (run_id,)).fetchall()
    return dict(rows)


def state(sql: Conn, run_id: UUID) -> tuple[Any, ...]:
    row = sql.execute("SELECT status, output, (SELECT count(*) FROM notifyq.job_step s "
                      "WHERE s.run_id = r.id) FROM notifyq.job_run r WHERE id = %s",
                      (run_id,)).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.anyio
async def test_a_failed_run_replayed_from_its_failing_step_reuses_the_steps_before_it(
        app: App, workers: Workers, tables: Conn) -> None:
    tables.execute("INSERT INTO replay_broken VALUES ('c')")
    run = await app.enqueue("replay.steps", {})
    with pytest.raises(RunFailed, match="step c is broken"):
        await run.result(timeout=30)
    assert executions(tables, run.id) == {"a": 1, "b": 1, "c": 1}
    tables.execute("DELETE FROM replay_broken")

    replayed = await app.replay(run.id, from_step="c")
    assert replayed.status == "pending"
    assert await replayed.result(timeout=30) == {"a": 1, "b": 1, "c": 2}
    assert executions(tables, run.id) == {"a": 1, "b": 1, "c": 2}


@pytest.mark.anyio
async def test_a_completed_run_replayed_from_a_middle_step_runs_it_and_the_later_ones_again(
        app: App, workers: Workers, tables: Conn) -> None:
    run = await app.enqueue("replay.steps", {})
    assert await run.result(timeout=30) == {"a": 1, "b": 1, "c": 1}
    replayed = await app.replay(run.id, from_step="b")
    assert await replayed.result(timeout=30) == {"a": 1, "b": 2, "c": 2}
    assert executions(tables, run.id) == {"a": 1, "b": 2, "c": 2}
    # Once more from the first step: everything runs again.
    again = await app.replay(run.id, from_step="a")
    assert await again.result(timeout=30) == {"a": 2, "b": 3, "c": 3}


@pytest.mark.anyio
async def test_a_replay_reuses_the_earlier_steps_even_when_the_handler_replays_from_scratch(
        app: App, workers: Workers, tables: Conn) -> None:
    run = await app.enqueue("replay.scratch", {})
    await run.result(timeout=30)
    replayed = await app.replay(run.id, from_step="c")
    assert await replayed.result(timeout=30) == {"a": 1, "b": 1, "c": 2}
    assert executions(tables, run.id) == {"a": 1, "b": 1, "c": 2}


@pytest.mark.anyio
async def test_replay_refusals_name_the_problem_and_change_nothing(
        app: App, workers: Workers, tables: Conn) -> None:
    with pytest.raises(RunNotFound):
        await app.replay(UUID(int=7), from_step="a")

    plain = await app.enqueue("await.echo", {"n": 1})
    await plain.result(timeout=30)
    with pytest.raises(InvalidTransition, match=r"recorded no steps .* retry it instead"):
        await app.replay(plain.id, from_step="a")

    durable = await app.enqueue("replay.steps", {})
    await durable.result(timeout=30)
    before = state(tables, durable.id)
    with pytest.raises(UnknownStep, match="has no step 'z'; its steps: 'a', 'b', 'c'"):
        await app.replay(durable.id, from_step="z")
    assert state(tables, durable.id) == before == ("completed", {"a": 1, "b": 1, "c": 1}, 3)

    later = await app.enqueue("replay.steps", {}, run_at=durable.created_at.replace(year=2999))
    with pytest.raises(InvalidTransition, match="it is pending; wait until it is finished"):
        await app.replay(later.id, from_step="a")
    assert state(tables, later.id)[0] == "pending"


def test_notifyq_runs_replay_runs_again_from_the_step(
        dsn: str, workers: Workers, tables: Conn) -> None:
    run_id = ok(dsn, "enqueue", "replay.steps").strip()

    def completed(count: int) -> None:
        assert state(tables, UUID(run_id))[0] == "completed"
        assert executions(tables, UUID(run_id)).get("c") == count
    _until(lambda: completed(1))
    out = ok(dsn, "runs", "replay", run_id, "--from-step", "b")
    assert out.strip() == (f"run {run_id} is pending again from step 'b': 1 earlier steps "
                           "reused, 2 to run again")
    _until(lambda: completed(2))
    assert executions(tables, UUID(run_id)) == {"a": 1, "b": 2, "c": 2}

    error = fails(dsn, "runs", "replay", run_id, "--from-step", "nope")
    assert "has no step 'nope'; its steps: 'a', 'b', 'c'" in error
    assert "the following arguments are required: --from-step" in fails(
        dsn, "runs", "replay", run_id, code=2)


def test_the_api_waits_for_a_run_and_replays_it_from_a_step(
        dsn: str, logs: Path, tables: Conn) -> None:
    with Served(dsn, logs / "serve.log", args=["--app", APP]) as served:
        with served.client() as http:
            created = http.post("/v1/jobs", json={"job_type": "replay.steps", "input": {}})
            assert created.status_code == 201, created.text
            run_id = created.json()["id"]
            done = http.get(f"/v1/jobs/{run_id}", params={"wait": "30s"}, timeout=40)
            assert done.status_code == 200
            assert (done.json()["status"], done.json()["output"]) == (
                "completed", {"a": 1, "b": 1, "c": 1})

            replayed = http.post(f"/v1/jobs/{run_id}/replay", json={"from_step": "b"})
            assert replayed.status_code == 200, replayed.text
            assert replayed.json()["status"] == "pending"
            assert replayed.json()["replay"] == {"from_step": "b", "steps_kept": 1,
                                                 "steps_dropped": 2}
            again = http.get(f"/v1/jobs/{run_id}", params={"wait": "30s"}, timeout=40).json()
            assert (again["status"], again["output"]) == ("completed", {"a": 1, "b": 2, "c": 2})

            _api_refusals(http, run_id)
        assert served.terminate() == 0, served.log()


def _api_refusals(http: Any, run_id: str) -> None:
    never = http.post("/v1/jobs", json={"job_type": "replay.steps", "input": {},
                                        "run_at": "2999-01-01T00:00:00Z"}).json()["id"]
    short = http.get(f"/v1/jobs/{never}", params={"wait": "200ms"})
    assert (short.status_code, short.json()["status"]) == (200, "pending")
    for bad in ("5m", "soon", "-1s"):
        refused = http.get(f"/v1/jobs/{never}", params={"wait": bad})
        assert refused.status_code == 422, bad
        assert refused.json()["field"] == "wait"
    assert http.post(f"/v1/jobs/{never}/replay", json={"from_step": "a"}).status_code == 409
    unknown = http.post(f"/v1/jobs/{run_id}/replay", json={"from_step": "z"})
    assert (unknown.status_code, unknown.json()["field"]) == (422, "from_step")
    assert http.post(f"/v1/jobs/{UUID(int=9)}/replay",
                     json={"from_step": "a"}).status_code == 404
    assert http.get(f"/v1/jobs/{UUID(int=9)}", params={"wait": "1s"}).status_code == 404


def _until(check: Any) -> None:
    wait_until(check, timeout=30)
