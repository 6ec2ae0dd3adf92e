"""SIGKILL the leader while it runs work (issue 31, item 5): another worker process takes the
role within ``leader.ttl_s`` and reaps the dead leader's runs at once.

The bound (docs/operations.md, "Maintenance"): a leader renews every ``ttl_s / 3``, so its row
runs out at most ``ttl_s`` after it died; a follower tries again the moment it does, and a new
leader runs its reaper as it is elected. Here the leases (``ttl_s / 2``) have run out by then,
so the runs are back in line, and claimed by the survivor, at the takeover. The reaper's own
interval is set to 300 s to show it plays no part: before, a new leader waited for its next tick
(and a follower tried only every ``ttl_s / 3``), so a SIGKILLed leader's runs came back ~15 s
after it died with the default ttl; with a 60 s interval, 3.5-9.7 s after it here, ttl 1-3 s.
Times are the database's: the kill's, the takeover's ``elected_at`` and the runs' ``claimed_at``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps.faults import FAULTS_DDL
from tests.support import Workers, pid_of, scalar, wait_until

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.chaos

RUNS = 3
SLACK_S = 1.0  # statements and process wake-ups on a loaded 2-core machine


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ttl_s", [1.0, 3.0])
def test_a_sigkilled_leaders_runs_are_back_within_its_ttl(
        dsn: str, sql: Conn, logs: Path, ttl_s: float) -> None:
    sql.execute(FAULTS_DDL)
    env = {"NOTIFYQ_LEADER__TTL_S": str(ttl_s), "NOTIFYQ_WORKER__LEASE_S": str(ttl_s / 2),
           "NOTIFYQ_REAPER__INTERVAL_S": "300"}
    with Workers(dsn, logs, extra_env=env) as workers:
        leader = workers.start()
        wait_until(lambda: _leader_pid(sql, leader.pid), timeout=20)
        runs = [scalar(sql, "SELECT notifyq.enqueue('faults.slow', '{\"seconds\": 60}')")
                for _ in range(RUNS)]
        wait_until(lambda: _held_by(sql, runs, leader.pid, attempts=1), timeout=20)
        follower = workers.start()
        workers.wait_registered()
        workers.kill(leader)
        killed_at = scalar(sql, "SELECT clock_timestamp()")
        wait_until(lambda: _leader_pid(sql, follower.pid), timeout=ttl_s * 3 + 10)
        wait_until(lambda: _held_by(sql, runs, follower.pid, attempts=2), timeout=30)
        times = sql.execute(
            "SELECT extract(epoch FROM (SELECT elected_at FROM notifyq.leader) - %(k)s), "
            "       extract(epoch FROM max(claimed_at) - %(k)s) "
            "FROM notifyq.job_run WHERE id = ANY(%(ids)s)",
            {"k": killed_at, "ids": runs}).fetchone()
        assert times is not None
        takeover_s, back_s = times
        print(f"[leader failover, ttl {ttl_s:g} s] SIGKILL -> new leader {takeover_s:.2f} s, "
              f"-> its {RUNS} runs claimed again {back_s:.2f} s")
        assert workers.stop_all() == [-9, 0], workers.logs()  # the kill, and a clean stop
    assert takeover_s <= ttl_s + SLACK_S
    assert back_s <= ttl_s + SLACK_S


def _leader_pid(conn: Conn, pid: int) -> None:
    leader = scalar(conn, "SELECT leader_id FROM notifyq.leader WHERE expires_at > now()")
    assert leader is not None
    assert pid_of(leader) == pid, leader


def _held_by(conn: Conn, runs: list[Any], pid: int, *, attempts: int) -> None:
    rows = conn.execute("SELECT status, leased_by, attempts FROM notifyq.job_run "
                        "WHERE id = ANY(%s)", (runs,)).fetchall()
    assert [(s, pid_of(by) if by else None, a) for s, by, a in rows] == [
        ("running", pid, attempts)] * len(runs), rows
