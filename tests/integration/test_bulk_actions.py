"""Bulk actions by filter from the command line, with real worker processes claiming meanwhile:
count first (dry run), then batches of one transaction each with progress, and every outcome
counted in SQL (the ledger proves which runs executed, ``check_exactly_once`` the drain)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps.faults import FAULTS_DDL
from tests.integration.test_cli import fails, notifyq, ok
from tests.support import Workers, backends, check_exactly_once, enqueue_sql, scalar, wait_until

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(sql: Conn) -> Conn:
    sql.execute(FAULTS_DDL)
    return sql


def _count(db: Conn, where: str) -> int:
    return int(scalar(db, f"SELECT count(*) FROM notifyq.job_run WHERE {where}"))


def _equals(actual: object, expected: object) -> None:
    assert actual == expected, (actual, expected)


def _executed(db: Conn) -> int:
    return int(scalar(db, "SELECT count(*) FROM ledger"))


@pytest.mark.timeout(180)
def test_cancel_retry_reschedule_and_delete_by_filter_while_workers_run(
        dsn: str, db: Conn, logs: Path) -> None:
    with Workers(dsn, logs, concurrency=4) as workers:
        for _ in range(3):
            workers.start()
        wait_until(lambda: _equals(len(backends(db, "notifyq-listener")), 3), timeout=30)
        ok(dsn, "pause", "pool", "default")  # so the runs wait for the bulk actions
        enqueue_sql(db, "faults.record", 150)
        enqueue_sql(db, "faults.slow", 5, input='{"seconds": 0.01}')  # not matched by --type

        counted = json.loads(ok(dsn, "runs", "cancel", "--type", "faults.record", "--dry-run",
                                "--json"))
        assert counted == {"action": "cancel", "dry_run": True, "matched": 150}
        assert _count(db, "status = 'pending'") == 155

        canceled = notifyq(dsn, "runs", "cancel", "--type", "faults.record",
                           "--batch-size", "40")
        assert canceled.returncode == 0, canceled.stderr
        assert canceled.stdout.strip() == "canceled 150 runs (4 batches)"
        assert canceled.stderr.splitlines() == [
            "150 runs to be canceled", "canceled 40", "canceled 80", "canceled 120",
            "canceled 150"]
        assert _count(db, "status = 'canceled' AND job_type = 'faults.record'") == 150

        retried = json.loads(ok(dsn, "runs", "retry", "--status", "canceled", "--json"))
        assert (retried["changed"], retried["batches"], retried["matched"]) == (150, 1, 150)
        far = "2999-01-01T00:00:00+00:00"
        assert ok(dsn, "runs", "reschedule", "--type", "faults.record", "--run-at", far,
                  "--batch-size", "100").strip() == "rescheduled 150 runs (2 batches)"
        assert _count(db, "run_at = '2999-01-01T00:00Z' AND status = 'pending'") == 150

        ok(dsn, "resume", "pool", "default")
        wait_until(lambda: _equals(_count(db, "status = 'completed'"), 5), timeout=30)
        deadline = time.monotonic() + 1.0  # five polls: the rescheduled runs wait
        while time.monotonic() < deadline:
            assert _count(db, "job_type = 'faults.record' AND attempts = 0") == 150
            time.sleep(0.05)

        now = datetime.now(UTC).isoformat()
        ok(dsn, "runs", "reschedule", "--type", "faults.record", "--run-at", now)
        wait_until(lambda: _equals(_count(db, "status = 'completed'"), 155), timeout=60)
        check_exactly_once(db, 155)

    assert ok(dsn, "runs", "delete", "--status", "completed", "--type", "faults.record",
              "--dry-run").strip() == "150 runs would be deleted"
    deleted = json.loads(ok(dsn, "runs", "delete", "--status", "completed", "--json"))
    assert (deleted["changed"], deleted["matched"]) == (155, 155)
    assert _count(db, "true") == 0
    assert _executed(db) == 155  # the ledger is the handlers', untouched


def test_bulk_commands_refuse_bad_requests_and_change_nothing(dsn: str, db: Conn) -> None:
    [run_id] = enqueue_sql(db, "faults.record", 1)
    assert "give a run ID, filter flags" in fails(dsn, "runs", "delete")
    assert "not both" in fails(dsn, "runs", "cancel", str(run_id), "--type", "faults.record")
    assert "--batch-size must be between 1 and 5000" in fails(
        dsn, "runs", "cancel", "--all", "--batch-size", "0")
    assert "is not a status" in fails(dsn, "runs", "retry", "--status", "dead")
    assert "no UTC offset" in fails(dsn, "runs", "reschedule", "--all", "--run-at",
                                    "2030-01-01T00:00")
    assert "[2000-01-01, 3000-01-01)" in fails(dsn, "runs", "reschedule", "--all", "--run-at",
                                               "3100-01-01T00:00Z")
    assert "reschedule needs --run-at" in fails(dsn, "runs", "reschedule", "--all")
    assert ok(dsn, "runs", "reschedule", "--all", "--dry-run").strip() == (
        "1 run would be rescheduled")
    refused = fails(dsn, "runs", "delete", str(run_id))
    assert f"cannot delete run {run_id}: it is pending" in refused
    assert "no runs to retry" in ok(dsn, "runs", "retry", "--all")
    assert _count(db, "status = 'pending' AND run_at <= now()") == 1

    assert ok(dsn, "runs", "reschedule", str(run_id), "--run-at", "2999-01-01T00:00Z"
              ).strip() == "rescheduled 1 run (1 batch)"
    assert ok(dsn, "runs", "cancel", str(run_id)).strip() == f"canceled run {run_id}"
    assert ok(dsn, "runs", "delete", str(run_id)).strip() == "deleted 1 run (1 batch)"
    assert _count(db, "true") == 0
