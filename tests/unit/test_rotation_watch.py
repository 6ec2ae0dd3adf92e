"""The arithmetic and drawing of ``notifyq keys rotate --wait`` (notifyq._keys.watch)."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from notifyq._keys.watch import (
    BarReport,
    LineReport,
    Poll,
    Rate,
    Snapshot,
    bar_line,
    duration,
    measure,
    totals_of,
)
from notifyq._run import RunStatus

RUNNING = RunStatus.RUNNING


def _column(name: str, reencrypted: int = 0, *, conflicts: int = 0, undecryptable: int = 0,
            passes: int = 1, finished: bool = False) -> dict[str, Any]:
    return {"column": name, "pass": passes, "reencrypted": reencrypted, "conflicts": conflicts,
            "finished": finished, "undecryptable": undecryptable}


def _poll(*columns: dict[str, Any]) -> Poll:
    return Poll(RUNNING, "default", 1, 25, None, None, None, list(columns))


def test_done_counts_handled_rows_capped_at_the_total_and_a_finished_column_in_full() -> None:
    totals = {"a": 100, "b": 50, "c": 10}
    columns = [_column("a", 60, conflicts=2, undecryptable=3),
               _column("b", 55, conflicts=1, passes=2),   # pass 2 re-encrypts lost swaps again
               _column("c", 0, finished=True)]             # nothing moved: all on the target
    assert measure(totals, columns) == (65 + 50 + 10, 160, True)


def test_a_column_this_process_does_not_know_makes_the_total_unknown() -> None:
    assert measure({"a": 10}, [_column("a", 4), _column("elsewhere", 7)]) == (11, None, False)


def test_totals_add_what_a_resumed_run_had_already_handled() -> None:
    first = _poll(_column("a", 400, conflicts=1, undecryptable=2))
    assert totals_of({"a": 600, "b": 30}, first) == {"a": 1003, "b": 30}


def test_rate_follows_the_last_ten_seconds() -> None:
    rate = Rate()
    assert rate.observe(0.0, 0) is None
    assert rate.observe(1.0, 100) == 100
    for t in range(2, 21):
        speed = rate.observe(float(t), 100 * t if t <= 10 else 1000)  # stalls at t = 10
    assert speed == 0


def test_eta_is_what_is_left_at_the_current_rate_and_unknown_while_verifying() -> None:
    assert Snapshot(RUNNING, 250, 1000, False, 50.0, 5.0).eta_s == 15
    assert Snapshot(RUNNING, 1000, 1000, True, 50.0, 5.0).eta_s is None
    assert Snapshot(RUNNING, 0, 0, False, None, 5.0).percent == 100
    assert [duration(s) for s in (4.6, 65, 3725)] == ["5s", "1m05s", "1h02m"]


SNAPSHOTS = [Snapshot(RUNNING, 114_400, 220_000, False, 14_300.0, 8.0),
             Snapshot(RUNNING, 220_000, 220_000, True, 0.0, 16.0),
             Snapshot(RunStatus.PENDING, 0, 220_000, False, None, 1.0),
             Snapshot(RunStatus.PENDING, 1_000, 2_000, False, None, 1.0),
             Snapshot(RUNNING, 5, None, False, 1.5, 1.0)]


@pytest.mark.parametrize("width", [1, 12, 20, 30, 43, 60, 79, 200])
def test_the_bar_line_never_outgrows_the_terminal(width: int) -> None:
    for snap in SNAPSHOTS:
        assert len(bar_line(snap, width)) <= width


def test_a_wide_line_has_a_bar_rows_eta_and_rate_and_a_narrow_one_keeps_percent_and_rows(
        ) -> None:
    snap = SNAPSHOTS[0]
    assert bar_line(snap, 79) == ("[##############--------------] 52%  114,400/220,000 rows  "
                                  "ETA 7s  14,300 rows/s")
    assert bar_line(snap, 43) == "[#######--------] 52%  114,400/220,000 rows"
    assert bar_line(snap, 30) == "52%  114,400/220,000 rows"


def test_the_bar_is_redrawn_in_place_and_notes_go_above_it() -> None:
    stream = io.StringIO()
    report = BarReport(stream)
    report.show(SNAPSHOTS[0])
    report.note("a note")
    report.show(SNAPSHOTS[1])
    report.close(Snapshot(RunStatus.COMPLETED, 220_000, 220_000, False, 14_000.0, 16.0))
    text = stream.getvalue()
    assert text.count("\n") == 2  # after the note and at the end
    assert text.endswith("in 16s  14,000 rows/s\n")
    assert "\ra note\n" in text


def _lines(seconds: float, total_s: float) -> list[tuple[float, int]]:
    """(time, percent) of the lines printed over ``seconds`` of polls every 0.5 s while a
    rotation of 60,000 rows takes ``total_s``."""
    stream = io.StringIO()
    report = LineReport(stream)
    printed: list[tuple[float, int]] = []
    for tick in range(int(seconds * 2)):
        t = tick / 2
        report.show(Snapshot(RUNNING, min(int(60_000 * t / total_s), 60_000), 60_000, False,
                             60_000 / total_s, t))
        if stream.getvalue():
            match = re.match(r"^rotation: (\d+)%, [\d,]+/60,000 rows", stream.getvalue())
            assert match, stream.getvalue()
            printed.append((t, int(match[1])))
            stream.seek(0)
            stream.truncate()
    return printed


def test_plain_lines_come_every_five_percent_or_thirty_seconds() -> None:
    lines = _lines(120, total_s=60)  # 100 % over the first minute, then a stall
    assert [p for _, p in lines] == [*range(0, 101, 5), 100]
    assert [t for t, _ in lines][-2:] == [60, 90]


def test_plain_lines_of_a_fast_rotation_come_every_two_seconds() -> None:
    lines = _lines(10, total_s=10)  # 5 % per half second
    assert [t for t, _ in lines] == [0, 2, 4, 6, 8]
