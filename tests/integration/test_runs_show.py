"""``notifyq runs show`` (issue 11, item 11): the step timeline and the children of a durable run
executed by a real worker process, in text and in ``--json``, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.test_cli import ok
from tests.support import Workers, wait_until

APP = "tests.apps.semantics:app"


@pytest.mark.timeout(90)
def test_runs_show_prints_the_step_timeline_and_the_children(dsn: str, logs: Path) -> None:
    with Workers(dsn, logs, app=APP) as workers, psycopg.connect(dsn, autocommit=True) as sql:
        workers.start()
        # Enqueued once the worker registered its types: before, an unknown type is refused.
        wait_until(lambda: _registered(sql, "report.build"), timeout=30)
        run_id = ok(dsn, "enqueue", "report.build").strip()

        def completed() -> None:
            row = sql.execute("SELECT status FROM notifyq.job_run WHERE id = %s",
                              (run_id,)).fetchone()
            assert row == ("completed",), (row, workers.logs())
        wait_until(completed, timeout=30)
        assert workers.stop_all() == [0]
        (child_id,) = sql.execute("SELECT id::text FROM notifyq.job_run WHERE parent_run_id = %s",
                                  (run_id,)).fetchone() or ()

    detail = json.loads(ok(dsn, "runs", "show", run_id, "--json"))
    assert detail["id"] == run_id
    assert detail["status"] == "completed"
    steps = detail["steps"]
    assert [(s["seq"], s["step_id"], s["kind"], s["status"], s["attempts"], s["memoized"])
            for s in steps] == [(1, "load", "step", "completed", 1, True),
                                (2, "checkpoint:loaded", "checkpoint", "completed", 1, True),
                                (3, "sum", "step", "completed", 1, True),
                                (4, "child:1", "child", "completed", 1, True)]
    assert all(isinstance(s["duration_s"], float) and s["duration_s"] >= 0 for s in steps)
    assert steps[0]["output"] == [1, 2, 3]
    assert detail["children"] == [{"id": child_id, "job_type": "report.part",
                                   "status": "completed"}]

    text = ok(dsn, "runs", "show", run_id)
    lines = text.splitlines()
    at = lines.index("steps (4):")
    header, *rows = lines[at + 1:at + 6]
    assert header.split() == ["SEQ", "STEP", "KIND", "STATUS", "TRIES", "DURATION", "MEMOIZED"]
    cells: list[list[Any]] = [row.split() for row in rows]
    assert [(c[0], c[1], c[2], c[3], c[4], c[6]) for c in cells] == [
        ("1", "load", "step", "completed", "1", "yes"),
        ("2", "checkpoint:loaded", "checkpoint", "completed", "1", "yes"),
        ("3", "sum", "step", "completed", "1", "yes"),
        ("4", "child:1", "child", "completed", "1", "yes")]
    assert all(c[5].endswith(("ms", "s")) for c in cells)
    assert lines[at + 6] == "children (1):"
    assert lines[at + 7].split() == ["ID", "TYPE", "STATUS"]
    assert lines[at + 8].split() == [child_id, "report.part", "completed"]


def test_runs_show_of_a_run_without_steps_prints_no_timeline(dsn: str) -> None:
    run_id = ok(dsn, "enqueue", "plain.type").strip()
    text = ok(dsn, "runs", "show", run_id)
    assert "steps" not in text
    assert "children" not in text
    detail = json.loads(ok(dsn, "runs", "show", run_id, "--json"))
    assert (detail["steps"], detail["children"]) == ([], [])


def _registered(sql: psycopg.Connection[Any], job_type: str) -> None:
    row = sql.execute("SELECT count(*) FROM notifyq.job WHERE type = %s", (job_type,)).fetchone()
    assert row == (1,), row
