"""Issue 35, item 4: a key rotation as a rolling deploy, with real processes the whole time.

Three worker processes and an application process (tests/apps/rollout_writer.py: encrypted
writes and reads, endpoints created, webhook messages sent) run throughout. Version 2 is added
to one worker only: ``keys promote 2`` is refused naming the other two. It is added to them
(restarted one at a time, as a rolling deploy does), promoted, rotated with a rate limit and
version 1 retired, while deliveries and writes go on. Counted in SQL at the end: no decryption
failure anywhere, every message delivered to every endpoint on its first attempt, every row
readable with version 2 alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import vault
from tests.receiver import Receiver
from tests.support import ROOT, Workers, scalar, stop, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

VAULT_APP = "tests.apps.vault:app"
LOOPBACK = {"NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
            "NOTIFYQ_KEY_CHECK_INTERVAL_S": "1"}
OLD = {**vault.keys_env(1, active=1), **LOOPBACK}
BOTH = {**vault.keys_env(1, 2, active=1), **LOOPBACK}  # 2 added, decrypt-only
RATE = 1500
Sql = psycopg.Connection[Any]


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """An operator's command, from a box with both keys (it needs none for promote)."""
    env = {**os.environ, "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_ENV": "test",
           "PYTHONPATH": str(ROOT), **BOTH}
    return subprocess.run([sys.executable, "-m", "notifyq", *args, "--app", VAULT_APP],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


def _writer(dsn: str, receiver: Receiver, logs: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_ENV": "test",
           "PYTHONPATH": str(ROOT), **BOTH, "ROLLOUT_WRITER_BASE": "1000000",
           "ROLLOUT_RECEIVER_URL": receiver.url(), "NOTIFYQ_POOL_MAX_SIZE": "4"}
    with (logs / "writer.log").open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "tests.apps.rollout_writer"], env=env,
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)


def _holders(sql: Sql) -> dict[int, list[int]]:
    rows = sql.execute("SELECT pid, versions FROM notifyq.key_holder WHERE expires_at > now()")
    return dict(rows.fetchall())


def _restart(workers: Workers, proc: subprocess.Popen[bytes],
             env: dict[str, str]) -> subprocess.Popen[bytes]:
    """One step of a rolling deploy: stop a worker (SIGTERM, graceful), start its successor."""
    assert workers.stop_one(proc) == 0
    return workers.start(extra_env=env)


def test_a_rolling_deploy_of_a_new_key_loses_no_delivery_and_decrypts_everything(
        dsn: str, sql: Sql, logs: Path) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 2000, 500)
    with Receiver() as receiver, Workers(dsn, logs, app=VAULT_APP, concurrency=4) as workers:
        w1, w2, w3 = (workers.start(extra_env=OLD) for _ in range(3))
        writer = _writer(dsn, receiver, logs)
        try:
            def everyone_holds_keys() -> None:
                assert set(_holders(sql)) == {w1.pid, w2.pid, w3.pid, writer.pid}
                assert scalar(sql, "SELECT count(*) FROM rollout_sent") >= 20
            wait_until(everyone_holds_keys, timeout=60)
            assert scalar(sql, "SELECT version FROM notifyq.key_active") == 1

            # Version 2 reaches one worker: promotion is refused, naming the other two.
            w1 = _restart(workers, w1, BOTH)
            wait_until(lambda: _assert(_holders(sql).get(w1.pid) == [1, 2]), timeout=30)
            refused = _cli(dsn, "keys", "promote", "2")
            assert refused.returncode == 1, refused.stderr
            assert "2 live process(es) do not hold it" in refused.stderr, refused.stderr
            named = {p.pid for p in (w1, w2, w3, writer) if f":{p.pid}:" in refused.stderr}
            assert named == {w2.pid, w3.pid}, refused.stderr
            assert scalar(sql, "SELECT version FROM notifyq.key_active") == 1

            # Everywhere, one worker at a time; then promote, rotate (throttled), retire 1.
            w2 = _restart(workers, w2, BOTH)
            w3 = _restart(workers, w3, BOTH)
            wait_until(lambda: _assert(set(_holders(sql)) == {w1.pid, w2.pid, w3.pid,
                                                              writer.pid}), timeout=30)
            promoted = _cli(dsn, "keys", "promote", "2")
            assert promoted.returncode == 0, promoted.stderr
            rotated = _cli(dsn, "keys", "rotate", "--wait", "--rate", str(RATE), "--json")
            assert rotated.returncode == 0, rotated.stderr + workers.logs()
            report = json.loads(rotated.stdout)
            assert report["status"]["rotation"]["rate_limit_per_s"] == RATE
            measured = report["status"]["rotation"]["rate_per_s"]
            assert measured <= RATE * 1.1, measured

            def all_on_2() -> None:
                status = _cli(dsn, "keys", "status", "--json")
                assert status.returncode == 0, status.stdout
                assert json.loads(status.stdout)["done"]
            wait_until(all_on_2, timeout=30)
            retired = _cli(dsn, "keys", "retire", "1")
            assert retired.returncode == 0, retired.stderr
            sent_at_retire = scalar(sql, "SELECT count(*) FROM rollout_sent")
            wait_until(lambda: _assert(scalar(sql, "SELECT count(*) FROM rollout_sent")
                                       >= sent_at_retire + 30), timeout=30)
        finally:
            stop(writer)
        wait_until(lambda: _delivered(sql), timeout=60)
        received = {r.headers["webhook-id"] for r in receiver.requests}
        problems = workers.problems()
        workers.stop_all()

    facts = _facts(sql)
    failures = sql.execute("SELECT step, left(error, 200), count(*) FROM rollout_failure "
                           "GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 5").fetchall()
    assert facts == {**facts, "writer_failures": 0, "run_key_errors": 0, "lost": 0,
                     "not_first_attempt": 0, "rows_not_on_2": 0}, (facts, failures)
    assert facts["messages"] > 100, facts
    assert facts["deliveries"] > facts["messages"], facts  # several endpoints each
    sent = {r[0] for r in sql.execute("SELECT message_id FROM rollout_sent").fetchall()}
    assert sent <= received
    assert not [p for p in problems if "key" in p.lower() or "decrypt" in p.lower()], problems
    plain = vault.decrypt_all(sql, vault.keyring(2, active=2))  # version 2 alone reads all
    assert len(plain[vault.TABLE_A]) == scalar(sql, "SELECT count(*) FROM vault_a")


def _assert(condition: bool) -> None:
    assert condition


def _delivered(sql: Sql) -> None:
    pending = scalar(sql, "SELECT count(*) FROM notifyq.webhook_delivery "
                          "WHERE status <> 'succeeded'")
    assert pending == 0, pending


def _facts(sql: Sql) -> dict[str, int]:
    """Everything the test asserts, counted in SQL."""
    row = sql.execute("""
        SELECT (SELECT count(*) FROM rollout_failure),
               (SELECT count(*) FROM notifyq.job_run
                WHERE error IS NOT NULL AND (error::text ILIKE '%decrypt%'
                                             OR error::text ILIKE '%key version%')),
               (SELECT count(*) FROM rollout_sent s
                WHERE NOT EXISTS (SELECT FROM notifyq.webhook_delivery d
                                  WHERE d.message_id = s.message_id)
                   OR EXISTS (SELECT FROM notifyq.webhook_delivery d
                              WHERE d.message_id = s.message_id AND d.status <> 'succeeded')),
               (SELECT count(*) FROM notifyq.webhook_delivery WHERE attempts <> 1),
               (SELECT count(*) FROM vault_a WHERE notifyq.key_version_of(secret) <> 2)
                 + (SELECT count(*) FROM vault_b WHERE notifyq.key_version_of(token) <> 2)
                 + (SELECT count(*) FROM notifyq.webhook_secret
                    WHERE notifyq.key_version_of(ciphertext) <> 2),
               (SELECT count(*) FROM rollout_sent),
               (SELECT count(*) FROM notifyq.webhook_delivery)
    """).fetchone()
    assert row is not None
    names = ("writer_failures", "run_key_errors", "lost", "not_first_attempt", "rows_not_on_2",
             "messages", "deliveries")
    return dict(zip(names, (int(v) for v in row), strict=True))
