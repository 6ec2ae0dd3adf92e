"""A long transaction holding back vacuum (a held xmin) under load, with real worker processes.

Bounded for CI: 5 s before, a 15 s held xmin, 5 s after (``bench/soak`` runs the one-minute
hold). Throughput before/during/after is printed, not asserted (it is machine-dependent); what
is asserted is correctness: every committed run completed exactly once, nothing left running or
leased, and the queue drains once the load stops.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.apps.faults import FAULTS_DDL
from tests.chaos.held_xmin import Meter, before_during_after
from tests.support import (
    Load,
    Workers,
    assert_drained,
    backends,
    check_exactly_once,
    scalar,
    wait_until,
)

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(120)
def test_a_held_xmin_for_15_s_under_load_loses_nothing(dsn: str, sql: Conn, logs: Path) -> None:
    sql.execute(FAULTS_DDL)
    # ~500 runs/s offered (25 every 50 ms) to 2 workers.
    with Workers(dsn, logs) as workers, Load(dsn, batch=25, every_s=0.05) as load:
        workers.start()
        workers.start()
        wait_until(lambda: _ready(sql, 2), timeout=20)
        load.start()
        meter = Meter(sql)
        xmin = before_during_after(meter, dsn, before_s=5, hold_s=15, after_s=5)
        stopped = time.monotonic()
        load.stop()
        total = int(scalar(sql, "SELECT count(*) FROM notifyq.job_run"))
        assert load.committed <= total <= load.committed + load.uncertain
        try:
            wait_until(lambda: assert_drained(sql, total), timeout=60, interval=0.1)
        except AssertionError:
            print(workers.logs())
            raise
        drained = time.monotonic() - stopped
        print(f"[held xmin 15 s] xmin {xmin}; {meter.report('')}")
        print(f"[held xmin 15 s] {total} runs; drained {drained:.2f} s after the load "
              f"stopped (5 s after the xmin was released); worker problems {workers.problems()}")
        assert len(workers.alive) == 2, workers.logs()
        assert workers.stop_all() == [0, 0], workers.logs()
    check_exactly_once(sql, total)
    assert all(w.completed > 0 for w in meter.windows), meter.report("")


def _ready(conn: Conn, n: int) -> None:
    assert len(backends(conn, "notifyq-listener")) == n
    assert scalar(conn, "SELECT count(*) FROM notifyq.job WHERE type = 'faults.record'") == 1
