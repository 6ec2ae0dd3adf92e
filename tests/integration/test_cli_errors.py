"""What a new user's mistakes look like from the ``notifyq`` command, run as a real process: a
wrong DSN, a missing database, a setting or config file that does not parse, a port in use. Each
is one line on stderr naming what is wrong, a non-zero exit, and no wait for a pool to give up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps.ledger import LEDGER_DDL
from tests.integration.serving import free_port
from tests.support import ROOT

FAST_S = 10.0  # a bound for "at once": the pool alone would retry for 30 s
PASSWORD = "s3cret-pw-9f2c"
CONNECTING = [["migrate"], ["worker"], ["serve", "--no-worker"], ["enqueue", "cli.test"],
              ["runs", "list"], ["stats"], ["keys", "status"], ["webhooks", "endpoints", "list"]]


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
        timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m notifyq ARGS`` with only the NOTIFYQ_* variables given; the time it took."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")}
    # serve must not generate a token when it fails to start; if it tried, it would fail here
    # instead of writing into the real home directory.
    full = {**base, "PYTHONPATH": str(ROOT), "NOTIFYQ_ENV": "test",
            "XDG_DATA_HOME": "/dev/null/notifyq-test-data", **(env or {})}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "notifyq", *args], env=full, cwd=cwd,
                            capture_output=True, text=True, timeout=timeout, check=False)
    return result, time.monotonic() - started


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("notifyq: error: ")
    return lines[0]


# -- item 6: the first connection fails at once, with its cause ------------------------------


@pytest.fixture(scope="module")
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (a hung server or proxy)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


def _bad_dsns(silent_port: int) -> dict[str, tuple[str, str]]:
    """name -> (DSN, what the error line must say)."""
    closed = free_port()
    return {
        "closed port": (f"postgresql://postgres:{PASSWORD}@127.0.0.1:{closed}/postgres",
                        f"cannot connect to the database at 127.0.0.1:{closed}: Connection "
                        "refused"),
        "no such database": (f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/nosuchdb",
                             'cannot connect to the database at 127.0.0.1:5432: database '
                             '"nosuchdb" does not exist'),
        "bad host": (f"host=/nonexistent/pg user=postgres password={PASSWORD} dbname=x",
                     "cannot connect to the database at /nonexistent/pg/.s.PGSQL.5432: No "
                     "such file or directory"),
        "silent server": (f"postgresql://postgres:{PASSWORD}@127.0.0.1:{silent_port}/x",
                          f"cannot connect to the database at 127.0.0.1:{silent_port}: "
                          "connection timeout expired (no answer within connect_timeout=5s)"),
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", ["closed port", "no such database", "bad host",
                                  "silent server"])
def test_every_command_that_connects_fails_at_once_with_the_cause_in_one_line(
        case: str, silent_server: int) -> None:
    dsn, expected = _bad_dsns(silent_server)[case]
    # A silent server costs the whole connect_timeout: one command through the pool, one
    # through the single connection of the run commands.
    commands = [["migrate"], ["runs", "list"]] if case == "silent server" else CONNECTING
    for args in commands:
        result, elapsed = run(*args, env={"NOTIFYQ_DATABASE_URL": dsn})

        line = one_error(result)
        assert expected in line, (args, line)
        assert PASSWORD not in result.stderr + result.stdout
        assert elapsed < FAST_S, (args, elapsed)


def test_a_malformed_database_url_is_named_without_its_password() -> None:
    result, _ = run("runs", "list", env={"NOTIFYQ_DATABASE_URL": "postgresql://u:p%zz@h/db"})

    line = one_error(result)
    assert "database_url (NOTIFYQ_DATABASE_URL) is not a valid connection string or URL" in line
    assert "p%zz" not in line


# -- item 7: settings, config file, port --------------------------------------------------------


def test_a_comma_separated_pools_variable_is_a_list_of_pools(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    sql.execute(LEDGER_DDL)
    sql.execute("SELECT notifyq.enqueue('ledger.write', '{\"i\": 1}', pool => 'emails')")

    result, _ = run("worker", "--burst", "--app", "tests.apps.ledger:app",
                    env={"NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_WORKER__POOLS": "default,emails"})

    assert result.returncode == 0, result.stderr
    assert sql.execute("SELECT status FROM notifyq.job_run").fetchall() == [("completed",)]


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("NOTIFYQ_WORKER__POOLS", '["default", "emails"',
     "worker.pools (NOTIFYQ_WORKER__POOLS): Value error, not a JSON list"),
    ("NOTIFYQ_WORKER__POOLS", "default,Emails",
     "worker.pools (NOTIFYQ_WORKER__POOLS): Value error, pool name 'Emails' must match"),
    ("NOTIFYQ_ENCRYPTED_COLUMNS", "app.users:secret",
     "encrypted_columns (NOTIFYQ_ENCRYPTED_COLUMNS): Input should be a valid list (in the "
     "environment: a JSON list)"),
    ("NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S", "1,5,60",
     "webhooks.retry_schedule_s (NOTIFYQ_WEBHOOKS__RETRY_SCHEDULE_S): Input should be a valid "
     "list (in the environment: a JSON list)"),
])
def test_a_variable_that_does_not_parse_is_one_line_naming_it(name: str, value: str,
                                                               expected: str) -> None:
    result, _ = run("stats", env={name: value,
                                  "NOTIFYQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"})

    assert expected in one_error(result)


def test_a_malformed_config_file_is_one_line_naming_the_file_line_and_column(
        tmp_path: Path) -> None:
    (tmp_path / "notifyq.yaml").write_text("worker:\n  pools: [default\n  concurrency: 3\n")

    result, _ = run("stats", cwd=tmp_path,
                    env={"NOTIFYQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"})

    assert one_error(result) == (
        "notifyq: error: notifyq.yaml line 3, column 14: not valid YAML: expected ',' or ']', "
        "but got ':' (while parsing a flow sequence)")


@pytest.mark.parametrize("content", ["- database_url\n- worker\n", "just some text\n"])
def test_a_config_file_that_is_not_a_mapping_is_one_line_saying_so(tmp_path: Path,
                                                                   content: str) -> None:
    (tmp_path / "notifyq.yaml").write_text(content)

    result, _ = run("stats", cwd=tmp_path,
                    env={"NOTIFYQ_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"})

    assert one_error(result).startswith(
        "notifyq: error: notifyq.yaml: the config file must be a mapping of settings")


def test_a_port_in_use_is_one_line_naming_the_address(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]

        result, elapsed = run("serve", "--no-worker", "--port", str(port),
                              env={"NOTIFYQ_DATABASE_URL": dsn})

    assert one_error(result) == (
        f"notifyq: error: cannot listen on 127.0.0.1:{port} for the admin API (Address already "
        "in use): another process listens there: stop it, or choose another port with --port "
        "(NOTIFYQ_API__PORT)")
    assert elapsed < FAST_S
