"""The pure parts of a throttled, pausable rotation: the pacer's waits, the batch size under a
rate, the status object's verdict, and a paused rotation in ``rotate --wait``'s line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifyq._keys.reencrypt import Pacer, batch_limit
from notifyq._keys.status import progress_json, rotation_json, status_json
from notifyq._keys.watch import Snapshot, pieces
from notifyq._run import RunStatus

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _drive(pacer: Pacer, reads: list[int], *, limit: int, rate: float,
           work_s: float = 0.0) -> list[float]:
    """Start times of batches that read ``reads`` rows each and take ``work_s``."""
    now, starts = 0.0, []
    for read in reads:
        now += pacer.wait_s(now, limit=limit, rate_per_s=rate)
        starts.append(now)
        now += work_s
        pacer.settle(read=read, rate_per_s=rate)
    return starts


@pytest.mark.parametrize("work_s", [0.0, 0.1], ids=["instant", "a-tenth-of-a-second"])
def test_full_batches_are_paid_before_they_run_so_the_average_never_exceeds_the_rate(
        work_s: float) -> None:
    starts = _drive(Pacer(), [500] * 5, limit=500, rate=500, work_s=work_s)
    assert starts == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])  # the work overlaps the wait
    for n, start in enumerate(starts, start=1):
        assert n * 500 / start <= 500  # rows done by each batch over the time since the start


def test_the_empty_batches_ending_a_pass_cost_nothing() -> None:
    starts = _drive(Pacer(), [500, 120, 0, 0, 500, 500], limit=500, rate=500)
    assert starts == pytest.approx([1.0, 2.0, 2.0, 2.0, 2.0, 4.0])  # 5 settled, then 6 paid
    pacer = Pacer()
    _drive(pacer, [500, 0], limit=500, rate=500)
    assert pacer.wait_s(2.0, limit=500, rate_per_s=500) == 0.0


def test_time_spent_slower_than_the_rate_is_not_saved_up_for_a_burst() -> None:
    starts = _drive(Pacer(), [100] * 4, limit=100, rate=100, work_s=3.0)
    assert starts == [1.0, 4.0, 7.0, 10.0]  # 3 s of work each, no wait, no catching up


def test_without_a_rate_nothing_waits_and_batches_keep_their_size() -> None:
    assert _drive(Pacer(), [500, 500], limit=500, rate=0) == [0.0, 0.0]
    assert batch_limit(500, None) == 500
    assert batch_limit(500, 120.5) == 121  # at most a second's worth of the rate
    assert batch_limit(500, 0.2) == 1


def _holder(pid: int, versions: list[int], encrypts_with: int | None) -> dict[str, Any]:
    return {"id": f"h:{pid}:x", "role": "worker", "host": "h", "pid": pid, "versions": versions,
            "encrypts_with": encrypts_with, "checked_at": T0, "expires_at": T0}


@pytest.mark.parametrize(("holders", "by_version", "done", "left"), [
    ([_holder(1, [1, 2], 2)], {"2": 5}, True, []),
    ([_holder(1, [1, 2], 2)], {"1": 1, "2": 4}, False, []),
    ([_holder(1, [1, 2], 2), _holder(2, [1, 2], 1)], {"2": 5}, False, ["h:2:x"]),
    ([_holder(1, [1], None)], {"2": 5}, False, ["h:1:x"]),
], ids=["all-on-2", "a-row-on-1", "a-process-on-1", "a-process-without-2"])
def test_done_needs_every_row_and_every_live_process_on_the_active_version(
        holders: list[dict[str, Any]], by_version: dict[str, int], done: bool,
        left: list[str]) -> None:
    status = status_json(
        versions=[], active={"version": 2, "promoted_at": T0, "promoted_by": "t", "forced": False},
        configured=[], holders=holders,
        columns=[{"column": "public.t.c", "rows": 5, "by_version": by_version}], rotation=None)
    assert (status["done"], status["processes_left"]) == (done, left)


def test_no_active_version_is_never_done() -> None:
    status = status_json(versions=[], active=None, configured=[], holders=[], columns=[],
                         rotation=None)
    assert (status["active_version"], status["done"], status["promotion"]) == (None, False, None)


def _rotation(**fields: Any) -> dict[str, Any]:
    row = {"run_id": "r", "target_version": 2, "created_at": T0, "rate_per_s": 100.0,
           "paused_at": None, "paused_s": 0.0, "status": "running", "attempts": 1,
           "started_at": T0, "finished_at": None, "input": {"target_version": 2},
           "now": T0 + timedelta(seconds=10)}
    return {**row, **fields}


def _checkpoint(reencrypted: int, at: datetime) -> dict[str, Any]:
    return {"column_name": "public.t.c", "pass": 1, "reencrypted": reencrypted, "conflicts": 0,
            "batches": 1, "finished_at": None, "updated_at": at}


def test_a_running_rotations_rate_is_measured_to_now_less_its_pauses() -> None:
    progress = [_checkpoint(800, T0 + timedelta(seconds=7))]
    running = rotation_json(_rotation(paused_s=2.0), progress, 0)
    assert running["rate_per_s"] == 100.0  # 800 rows in 10 s less 2 s paused
    paused = rotation_json(_rotation(paused_at=T0 + timedelta(seconds=8), status="pending"),
                           progress, 0)
    assert (paused["paused"], paused["rate_per_s"]) == (True, 100.0)
    assert progress_json([{"rows": 1000, "remaining": 200}], paused)["eta_s"] is None
    ended = rotation_json(_rotation(status="completed"), progress, 0)
    assert ended["rate_per_s"] == 800 / 7  # to its last checkpoint


def test_rotate_wait_says_paused_and_gives_no_eta_while_paused() -> None:
    snap = Snapshot(RunStatus.PENDING, 400, 1000, False, 50.0, 12.0, paused=True)
    assert snap.eta_s is None
    assert pieces(snap) == ["40%", "400/1,000 rows", "paused (`notifyq keys resume` goes on)",
                            "50 rows/s"]
