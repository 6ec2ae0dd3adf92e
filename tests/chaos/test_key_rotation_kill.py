"""Key rotation with real processes: the CLI starts it, a worker is SIGKILLed mid-rotation, a
new worker resumes from the last committed batch, and the CLI waits, verifies and retires."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests import vault
from tests.support import ROOT, Workers, scalar, wait_until, worker_log_dir

pytestmark = pytest.mark.chaos

VAULT_APP = "tests.apps.vault:app"
KEYS = vault.keys_env(1, 2, active=2)


def _cli(dsn: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_ENV": "test",
           "PYTHONPATH": str(ROOT), **KEYS}
    return subprocess.run([sys.executable, "-m", "notifyq", *args, "--app", VAULT_APP],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _progress(sql: psycopg.Connection[Any]) -> dict[str, tuple[int, bool]]:
    rows = sql.execute("SELECT column_name, reencrypted, finished_at IS NOT NULL "
                       "FROM notifyq.key_rotation_progress").fetchall()
    return {name: (int(done), finished) for name, done, finished in rows}


def test_a_worker_killed_mid_rotation_is_resumed_from_its_last_committed_batch(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 4000, 1000)
    started = _cli(dsn, "keys", "rotate", "--batch-size", "100", "--pause-s", "0.05")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert _cli(dsn, "keys", "rotate").stdout.strip() == run_id  # idempotent

    with worker_log_dir() as logs, Workers(dsn, logs, app=VAULT_APP, extra_env=KEYS) as workers:
        first = workers.start()

        def a_few_batches_done() -> None:
            assert _progress(sql).get("public.vault_a.secret", (0, False))[0] >= 500
        wait_until(a_few_batches_done, timeout=30)
        workers.kill(first)
        at_kill = _progress(sql)["public.vault_a.secret"]
        assert at_kill[0] < 4000
        assert not at_kill[1]

        workers.start()
        waited = _cli(dsn, "keys", "rotate", "--wait", "--json", timeout=90)
        assert waited.returncode == 0, waited.stderr + workers.logs()
        report = json.loads(waited.stdout)
        assert report["run"]["id"] == run_id
        assert report["run"]["status"] == "completed"
        assert report["run"]["attempts"] == 2
        # Every row was swapped exactly once: the killed batch rolled back with its checkpoint.
        assert _progress(sql) == {"public.vault_a.secret": (4000, True),
                                  "public.vault_b.token": (1000, True),
                                  "notifyq.webhook_endpoint.header_values": (0, True),
                                  "notifyq.webhook_secret.ciphertext": (0, True)}
        assert vault.versions(sql) == {vault.TABLE_A: {2: 4000}, vault.TABLE_B: {2: 1000}}
        vault.decrypt_all(sql, vault.keyring(2, active=2))

        status = _cli(dsn, "keys", "status", "--json")
        assert status.returncode == 0, status.stderr
        columns = json.loads(status.stdout)["columns"]
        assert [(c["column"], c["remaining"]) for c in columns] == [
            ("public.vault_a.secret", 0), ("public.vault_b.token", 0),
            ("notifyq.webhook_endpoint.header_values", 0),
            ("notifyq.webhook_secret.ciphertext", 0)]
        text = _cli(dsn, "keys", "status")
        assert "decrypt-only" in text.stdout
        assert re.search(r"public\.vault_a\.secret +4000 +v2: 4000", text.stdout), text.stdout

        retired = _cli(dsn, "keys", "retire", "1")
        assert retired.returncode == 0, retired.stderr
        assert "retired key version 1" in retired.stdout

        again = _cli(dsn, "keys", "rotate", "--wait", "--json", timeout=60)
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)
        assert report["run"]["id"] != run_id
        assert [c["reencrypted"] for c in report["run"]["output"]["columns"]] == [0, 0, 0, 0]
        assert workers.problems() == {}, workers.logs()


def test_keys_commands_refuse_with_one_line_errors(dsn: str,
                                                   sql: psycopg.Connection[Any]) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 5, 5)
    refused = _cli(dsn, "keys", "retire", "1")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "notifyq: error: key version 1 is still used by 10 rows (public.vault_a.secret: 5, "
        "public.vault_b.token: 5): run `notifyq keys rotate --wait` first"]
    assert scalar(sql, "SELECT count(*) FROM notifyq.key_version WHERE retired_at IS NOT NULL"
                  ) == 0
    env_bad = {**KEYS, "NOTIFYQ_KEYS": "1:bm90IGEga2V5"}
    bad = subprocess.run([sys.executable, "-m", "notifyq", "keys", "status"],
                         env={**os.environ, "NOTIFYQ_DATABASE_URL": dsn, **env_bad},
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 1
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "key version 1 is 9 bytes; keys must be 32 bytes" in bad.stderr
    assert "bm90IGEga2V5" not in bad.stderr
