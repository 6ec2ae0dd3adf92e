"""Durable runs across real worker processes: a SIGKILL mid-step loses no completed step."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from tests.apps.durable import STEP_LEDGER_DDL
from tests.support import spawn_worker, stop, wait_until


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_step_resumes_without_rerunning_completed_steps(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(STEP_LEDGER_DDL)
        (run_id,) = db.execute(
            "SELECT notifyq.enqueue('durable.five-steps', '{\"slow_s\": 30}')").fetchone() or ()
        first = spawn_worker(dsn, "tests.apps.durable:app", concurrency=2)
        second = None
        try:
            def in_step_three() -> None:
                row = db.execute("SELECT count(*) FROM step_ledger WHERE step = 3").fetchone()
                assert row == (1,)
            wait_until(in_step_three, timeout=30)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            # Let the second worker finish quickly: the replayed step 3 no longer sleeps.
            db.execute("UPDATE notifyq.job_run SET input = '{\"slow_s\": 0}' WHERE id = %s",
                       (run_id,))
            second = spawn_worker(dsn, "tests.apps.durable:app", concurrency=2)

            def completed() -> Any:
                row = db.execute("SELECT status, output, attempts FROM notifyq.job_run "
                                 "WHERE id = %s", (run_id,)).fetchone()
                assert row is not None
                assert row[0] == "completed", row
                return row
            _, output, attempts = wait_until(completed, timeout=45)
            assert output == [1, 2, 3, 4, 5]
            assert attempts == 2  # the killed attempt, then the rescue
            finished = db.execute(
                "SELECT step, count(*) FILTER (WHERE finished), count(*) FILTER (WHERE NOT "
                "finished) FROM step_ledger GROUP BY step ORDER BY step").fetchall()
            # (step, finished, started). Steps 1-2 completed before the kill: never run again.
            # Step 3 was cut short and ran again to completion. Steps 4-5 ran once.
            assert finished == [(1, 1, 1), (2, 1, 1), (3, 1, 2), (4, 1, 1), (5, 1, 1)]
        finally:
            stop(first)
            if second is not None:
                assert stop(second) == 0
