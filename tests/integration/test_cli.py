"""The ``notifyq`` command, run as a real process (``python -m notifyq ...``) against a fresh
database. Errors must be one line on stderr with a non-zero exit, and leave the table as it was
(checked in SQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest

import notifyq as notifyq_package
from notifyq._bench import SECTIONS
from tests.apps.ledger import LEDGER_DDL
from tests.conftest import ADMIN_DSN
from tests.support import ROOT

RUN_TIMEOUT_S = 60
CONSOLE_SCRIPT = "import sys; from notifyq._cli.main import main; sys.exit(main())"
"""What the ``notifyq`` console script runs (pyproject.toml's [project.scripts])."""


def notifyq(dsn: str, *args: str, stdin: str | None = None,
            timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NOTIFYQ_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT),
           "NOTIFYQ_ENV": "test", "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.2"}
    return subprocess.run([sys.executable, "-m", "notifyq", *args], env=env, cwd=ROOT,
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)


def ok(dsn: str, *args: str, stdin: str | None = None) -> str:
    result = notifyq(dsn, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def fails(dsn: str, *args: str, code: int = 1, stdin: str | None = None) -> str:
    """Run a command that must fail; return its one stderr line."""
    result = notifyq(dsn, *args, stdin=stdin)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("notifyq: error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


def rows(sql: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return sql.execute("SELECT * FROM notifyq.job_run ORDER BY id").fetchall()


def enqueue(dsn: str, job_type: str = "cli.test", *args: str) -> str:
    return ok(dsn, "enqueue", job_type, *args).strip()


# -- enqueue ---------------------------------------------------------------------------------


def test_enqueue_prints_the_run_id_of_one_new_pending_run(dsn: str,
                                                        sql: psycopg.Connection[Any]) -> None:
    run_id = enqueue(dsn, "email.send", "--input", '{"to": "a@b.c"}')

    row = sql.execute("SELECT job_type, status, input, pool FROM notifyq.job_run WHERE id = %s",
                      (uuid.UUID(run_id),)).fetchone()
    assert row == ("email.send", "pending", {"to": "a@b.c"}, "default")
    assert len(rows(sql)) == 1


def test_enqueue_json_prints_the_run_with_every_option_applied(dsn: str) -> None:
    out = ok(dsn, "enqueue", "email.send", "--input", "[1, 2]", "--run-at",
             "2031-05-06T07:08:09+02:00", "--priority", "-5", "--pool", "mail",
             "--max-attempts", "3", "--dedupe-key", "k1", "--tag", "a", "--tag", "b", "--json")

    run = json.loads(out)
    assert run["input"] == [1, 2]
    assert run["run_at"] == "2031-05-06T05:08:09+00:00"
    assert (run["priority"], run["pool"], run["max_attempts"]) == (-5, "mail", 3)
    assert (run["dedupe_key"], run["tags"], run["status"]) == ("k1", ["a", "b"], "pending")
    uuid.UUID(run["id"])


def test_enqueue_reads_the_input_from_stdin_given_dash(dsn: str,
                                                     sql: psycopg.Connection[Any]) -> None:
    run_id = ok(dsn, "enqueue", "cli.test", "--input", "-", stdin='{"from": "stdin"}\n').strip()

    row = sql.execute("SELECT input FROM notifyq.job_run WHERE id = %s",
                      (uuid.UUID(run_id),)).fetchone()
    assert row == ({"from": "stdin"},)


def test_enqueue_with_a_known_dedupe_key_returns_the_existing_run(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    first = enqueue(dsn, "cli.test", "--dedupe-key", "once")
    second = enqueue(dsn, "cli.test", "--dedupe-key", "once")

    assert first == second
    assert len(rows(sql)) == 1


@pytest.mark.parametrize(("args", "stdin", "names"), [
    (["--input", "{bad"], None, "--input: input is not valid JSON"),
    (["--input", "-"], "not json", "--input: input is not valid JSON"),
    (["--input", '"a string"'], None, "input must be a JSON object or array"),
    (["--priority", "5000"], None, "priority 5000 is out of range"),
    (["--priority", "high"], None, "--priority must be an integer, got 'high'"),
    (["--max-attempts", "0"], None, "max_attempts 0 is out of range"),
    (["--run-at", "tomorrow"], None, "--run-at 'tomorrow' is not an ISO 8601 time"),
    (["--run-at", "2030-01-01T09:00:00"], None, "has no UTC offset"),
    (["--run-at", "3100-01-01T00:00:00Z"], None, "is out of range"),
    (["--pool", "Bad Pool"], None, "invalid pool 'Bad Pool'"),
    (["--tag", ""], None, "tags must be a list"),
], ids=["malformed-json", "malformed-stdin", "not-an-object", "priority-range", "priority-int",
        "max-attempts", "run-at-format", "run-at-naive", "run-at-range", "pool", "tag"])
def test_enqueue_refuses_a_bad_value_in_one_line_and_writes_nothing(
        dsn: str, sql: psycopg.Connection[Any], args: list[str], stdin: str | None,
        names: str) -> None:
    line = fails(dsn, "enqueue", "cli.test", *args, stdin=stdin)

    assert names in line
    assert rows(sql) == []


def test_enqueue_refuses_an_invalid_job_type(dsn: str, sql: psycopg.Connection[Any]) -> None:
    assert "invalid job type 'Bad Type'" in fails(dsn, "enqueue", "Bad Type")
    assert rows(sql) == []


def test_version_prints_the_installed_version_and_exits_0() -> None:
    for command in (["-m", "notifyq", "--version"], ["-c", CONSOLE_SCRIPT, "--version"]):
        result = subprocess.run([sys.executable, *command], env={**os.environ,
                                "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S, check=False)

        assert (result.returncode, result.stdout, result.stderr) == (
            0, f"notifyq {notifyq_package.__version__}\n", ""), command


def test_a_usage_error_is_one_line_with_exit_code_2(dsn: str) -> None:
    assert "unrecognized arguments: --bogus" in fails(dsn, "enqueue", "x", "--bogus", code=2)
    assert "required: list|show|cancel|retry" in fails(dsn, "runs", code=2)


# -- runs ------------------------------------------------------------------------------------


def test_runs_list_prints_a_table_of_the_newest_runs_first(dsn: str) -> None:
    older = enqueue(dsn, "cli.first")
    newer = enqueue(dsn, "cli.second", "--priority", "7")

    lines = ok(dsn, "runs", "list").splitlines()

    assert lines[0].split()[:4] == ["ID", "TYPE", "STATUS", "POOL"]
    assert lines[1].split()[:5] == [newer, "cli.second", "pending", "default", "7"]
    assert lines[2].split()[:3] == [older, "cli.first", "pending"]
    assert len(lines) == 3


def test_runs_list_says_so_when_there_are_no_runs(dsn: str) -> None:
    assert ok(dsn, "runs", "list").strip() == "no runs"
    assert json.loads(ok(dsn, "runs", "list", "--json")) == []


def test_runs_list_filters_by_status_type_pool_and_tag_and_limits(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    a = enqueue(dsn, "cli.a", "--tag", "red", "--pool", "p1")
    b = enqueue(dsn, "cli.b", "--tag", "blue")
    c = enqueue(dsn, "cli.a", "--tag", "blue")
    sql.execute("UPDATE notifyq.job_run SET status = 'failed' WHERE id = %s", (uuid.UUID(c),))

    def listed(*args: str) -> list[str]:
        return [r["id"] for r in json.loads(ok(dsn, "runs", "list", "--json", *args))]

    assert listed() == [c, b, a]
    assert listed("--status", "failed") == [c]
    assert listed("--type", "cli.a") == [c, a]
    assert listed("--pool", "p1") == [a]
    assert listed("--tag", "blue") == [c, b]
    assert listed("--type", "cli.a", "--status", "pending") == [a]
    assert listed("--limit", "2") == [c, b]


@pytest.mark.parametrize(("args", "names"), [
    (["--status", "done"], "--status 'done' is not a status: choose from pending"),
    (["--limit", "0"], "--limit must be between 1 and 1000, got 0"),
    (["--limit", "many"], "--limit must be an integer, got 'many'"),
])
def test_runs_list_refuses_bad_filters(dsn: str, args: list[str], names: str) -> None:
    assert names in fails(dsn, "runs", "list", *args)


def test_runs_show_prints_the_run_with_its_input(dsn: str) -> None:
    run_id = enqueue(dsn, "cli.show", "--input", '{"k": "v"}', "--tag", "t1")

    text = ok(dsn, "runs", "show", run_id)
    shown = json.loads(ok(dsn, "runs", "show", run_id, "--json"))

    assert text.splitlines()[0].split() == ["id", run_id]
    assert "cli.show" in text
    assert '"k": "v"' in text
    assert shown["id"] == run_id
    assert shown["input"] == {"k": "v"}
    assert shown["tags"] == ["t1"]


def test_runs_show_refuses_a_malformed_id(dsn: str) -> None:
    assert "not a run id (UUID): 'nope'" in fails(dsn, "runs", "show", "nope")


def test_runs_show_reports_an_unknown_id(dsn: str) -> None:
    unknown = str(uuid.uuid4())
    assert fails(dsn, "runs", "show", unknown) == f"notifyq: error: no run {unknown}"


def test_runs_cancel_cancels_a_pending_run(dsn: str, sql: psycopg.Connection[Any]) -> None:
    run_id = enqueue(dsn)

    out = ok(dsn, "runs", "cancel", run_id)

    assert out.strip() == f"canceled run {run_id}"
    row = sql.execute("SELECT status, finished_at IS NOT NULL FROM notifyq.job_run").fetchone()
    assert row == ("canceled", True)


def test_runs_cancel_of_a_running_run_asks_its_worker_to_stop(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    run_id = enqueue(dsn)
    sql.execute("UPDATE notifyq.job_run SET status = 'running', attempts = 1")

    run = json.loads(ok(dsn, "runs", "cancel", run_id, "--json"))

    assert run["status"] == "running"
    assert run["cancel_requested_at"] is not None


def test_runs_cancel_refuses_a_finished_run_and_changes_nothing(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    run_id = enqueue(dsn)
    sql.execute("UPDATE notifyq.job_run SET status = 'completed', finished_at = now()")
    before = rows(sql)

    line = fails(dsn, "runs", "cancel", run_id)

    assert line == f"notifyq: error: cannot cancel run {run_id}: it is completed"
    assert rows(sql) == before


def test_runs_retry_puts_a_failed_run_back_in_line(dsn: str,
                                                   sql: psycopg.Connection[Any]) -> None:
    run_id = enqueue(dsn, "cli.test", "--max-attempts", "1")
    sql.execute("UPDATE notifyq.job_run SET status = 'failed', attempts = 1, "
                "finished_at = now(), run_at = now() - interval '1 hour'")

    out = ok(dsn, "runs", "retry", run_id)

    assert out.strip() == f"run {run_id} is pending again (attempt 2 of 2)"
    row = sql.execute("SELECT status, max_attempts, finished_at, run_at > now() - interval '1 "
                      "minute' FROM notifyq.job_run").fetchone()
    assert row == ("pending", 2, None, True)


def test_runs_retry_refuses_a_pending_run_and_changes_nothing(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    run_id = enqueue(dsn)
    before = rows(sql)

    line = fails(dsn, "runs", "retry", run_id)

    assert line == f"notifyq: error: cannot retry run {run_id}: it is pending"
    assert rows(sql) == before


def test_runs_cancel_and_retry_report_an_unknown_run(dsn: str) -> None:
    unknown = str(uuid.uuid4())
    assert fails(dsn, "runs", "cancel", unknown) == f"notifyq: error: no run {unknown}"
    assert fails(dsn, "runs", "retry", unknown) == f"notifyq: error: no run {unknown}"
    assert "not a run id" in fails(dsn, "runs", "retry", "12")


# -- stats -----------------------------------------------------------------------------------


def test_stats_counts_by_status_type_and_pool_with_the_oldest_runnable_age(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    enqueue(dsn, "cli.a")
    enqueue(dsn, "cli.a", "--pool", "bulk")
    done = enqueue(dsn, "cli.b")
    enqueue(dsn, "cli.b", "--run-at", "2999-01-01T00:00:00Z")
    sql.execute("UPDATE notifyq.job_run SET status = 'completed' WHERE id = %s",
                (uuid.UUID(done),))
    sql.execute("UPDATE notifyq.job_run SET run_at = now() - interval '90 seconds' "
                "WHERE pool = 'bulk'")

    stats = json.loads(ok(dsn, "stats", "--json"))
    text = ok(dsn, "stats")

    assert stats["total"] == 4
    assert stats["by_status"] == {"completed": 1, "pending": 3}
    assert stats["by_type"] == {"cli.a": {"pending": 2}, "cli.b": {"completed": 1, "pending": 1}}
    assert stats["by_pool"] == {"bulk": {"pending": 1},
                                "default": {"completed": 1, "pending": 2}}
    runnable = {r["pool"]: r for r in stats["runnable"]}
    assert runnable["default"]["runnable"] == 1  # the one scheduled in 2999 is not runnable
    assert runnable["bulk"]["oldest_age_s"] >= 90
    assert text.startswith("4 runs: 3 pending, 1 completed")
    assert "OLDEST WAITING" in text


def test_stats_of_an_empty_queue(dsn: str) -> None:
    assert ok(dsn, "stats").strip() == "no runs"
    assert json.loads(ok(dsn, "stats", "--json"))["total"] == 0


# -- migrate, database problems --------------------------------------------------------------


def test_migrate_check_passes_on_a_migrated_database(dsn: str) -> None:
    assert ok(dsn, "migrate", "--check").strip() == "schema is current"


def test_migrate_check_fails_on_an_unmigrated_database_and_says_what_to_run(
        empty_dsn: str) -> None:
    line = fails(empty_dsn, "migrate", "--check")

    assert "not migrated" in line
    assert "run `notifyq migrate`" in line
    with psycopg.connect(empty_dsn) as conn:
        schemas = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'notifyq'").fetchall()
    assert schemas == []  # --check applied nothing


def test_migrate_applies_everything_once(empty_dsn: str) -> None:
    assert ok(empty_dsn, "migrate").startswith("applied: 0001_")
    assert ok(empty_dsn, "migrate").strip() == "nothing to apply"
    assert ok(empty_dsn, "migrate", "--check").strip() == "schema is current"


@pytest.mark.parametrize("args", [["runs", "list"], ["stats"], ["enqueue", "cli.test"]])
def test_commands_on_an_unmigrated_database_say_to_migrate(empty_dsn: str,
                                                          args: list[str]) -> None:
    assert "run `notifyq migrate`" in fails(empty_dsn, *args)


def test_an_unreachable_database_is_a_one_line_error() -> None:
    line = fails("postgresql://postgres@127.0.0.1:1/nothing", "runs", "list")
    assert line.startswith("notifyq: error: cannot connect to the database at 127.0.0.1:1: ")


# -- worker ----------------------------------------------------------------------------------


def test_worker_burst_drains_the_queue_and_exits_0(dsn: str,
                                                   sql: psycopg.Connection[Any]) -> None:
    sql.execute(LEDGER_DDL)
    sql.execute("SELECT notifyq.enqueue('ledger.write', jsonb_build_object('i', i)) "
                "FROM generate_series(1, 25) AS i")

    result = notifyq(dsn, "worker", "--burst", "--app", "tests.apps.ledger:app",
                     "--concurrency", "5")

    assert result.returncode == 0, result.stderr
    assert sql.execute("SELECT count(*) FROM ledger").fetchone() == (25,)
    assert sql.execute("SELECT status, attempts, count(*) FROM notifyq.job_run "
                       "GROUP BY 1, 2").fetchall() == [("completed", 1, 25)]


def test_worker_with_a_bad_app_is_a_one_line_error(dsn: str) -> None:
    assert "--app must look like MODULE:ATTR" in fails(dsn, "worker", "--app", "nocolon")
    assert "cannot import 'no_such_module'" in fails(dsn, "worker", "--app", "no_such_module:app")


# -- bench -----------------------------------------------------------------------------------


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    return []


@pytest.mark.timeout(180)
def test_bench_quick_json_reports_every_section_with_positive_numbers() -> None:
    database = f"notifyq_bench_{uuid.uuid4().hex[:8]}"

    out = ok(ADMIN_DSN, "bench", "--quick", "--json", "--dsn", ADMIN_DSN,
             "--database", database)

    report = json.loads(out)
    assert report["meta"]["cpus"] >= 1
    assert report["meta"]["postgresql"]
    for section in SECTIONS:
        numbers = _numbers(report[section])
        assert numbers, section
        assert all(n > 0 for n in numbers), (section, report[section])
    assert report["drain"]["verified_exactly_once"] is True
    with psycopg.connect(ADMIN_DSN) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        assert left.fetchall() == []  # the scratch database is dropped afterwards


def test_bench_refuses_to_drop_a_database_not_named_for_it() -> None:
    line = fails(ADMIN_DSN, "bench", "--quick", "--database", "test")
    assert "must start with 'notifyq_bench'" in line
