"""Following a key rotation from the command line (``notifyq keys rotate --wait``).

Every ``WAIT_POLL_S`` one statement (``key_rotation_watch``) reads the run's state and its
per-column checkpoints; from them come rows done / total, the rate and the time left, drawn as
one bar redrawn in place on a terminal, or as plain lines otherwise (see :class:`BarReport` and
:class:`LineReport`). Everything goes to stderr: stdout keeps the final report (and ``--json``).

**Done and total.** A column's done rows are those the rotation has handled (re-encrypted,
changed concurrently by a writer, or undecryptable), capped at its total; a finished column is
fully done. The total is fixed when waiting starts: the rows not on the active version then,
plus those a resumed run had already handled.

**No worker.** There is no registry of workers; the run row is the signal. A run still
``pending`` ``NO_WORKER_AFTER_S`` after its ``run_at`` (due, yet nobody claimed it: workers are
woken by NOTIFY at enqueue and poll every second) or still ``running`` that long past its lease
expiry (its worker stopped, and the reaper of a live worker would have taken it back) gets one
line saying so. A live worker of that pool with every slot busy looks the same, and the line
says that too.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO
from uuid import UUID

import anyio
import psycopg
from psycopg.rows import dict_row

from notifyq._errors import NotifyqError
from notifyq._keys.admin import REENCRYPT
from notifyq._run import RunStatus

if TYPE_CHECKING:
    from notifyq._db.pool import AsyncConn
    from notifyq._keys.admin import KeyAdmin
    from notifyq._runtime import Runtime

WAIT_POLL_S = 0.5
NO_WORKER_AFTER_S = 5.0
RATE_WINDOW_S = 10.0
"""The rate is measured over the last 10 s: it follows a pause or a busy database within
seconds, yet does not jump with every batch."""
LINE_EVERY_S = 2.0
LINE_STEP_PERCENT = 5
LINE_HEARTBEAT_S = 30.0
"""Plain lines: at most one per 2 s, and only after 5 more percent or 30 s (a rotation of an
hour prints some 25 lines, one of 15 s about 7)."""
BAR_MAX = 40
BAR_MIN = 10


@dataclass(frozen=True, slots=True)
class Poll:
    """One ``key_rotation_watch`` row."""

    status: RunStatus
    pool: str
    attempts: int
    max_attempts: int
    error: str | None
    unclaimed_s: float | None
    lease_lapsed_s: float | None
    columns: list[dict[str, Any]]
    paused: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Poll:
        return cls(RunStatus(row["status"]), row["pool"], row["attempts"], row["max_attempts"],
                   row["error"], row["unclaimed_s"], row["lease_lapsed_s"], list(row["columns"]),
                   bool(row["paused"]))


def handled(column: Mapping[str, Any]) -> int:
    return int(column["reencrypted"]) + int(column["conflicts"]) + int(column["undecryptable"])


def totals_of(remaining: Mapping[str, int], first: Poll) -> dict[str, int]:
    """Rows per column this wait follows: not on the active version now, plus those the run
    has already handled (a resumed run starts part way)."""
    before = {c["column"]: handled(c) for c in first.columns}
    return {name: n + before.pop(name, 0) for name, n in remaining.items()}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """How far the rotation is. ``total`` is None when a column the worker rotates is not
    registered in this process (``--app`` missing), ``rate`` None until it can be measured."""

    status: RunStatus
    done: int
    total: int | None
    verifying: bool
    rate: float | None
    elapsed_s: float
    paused: bool = False

    @property
    def percent(self) -> int | None:
        if not self.total:
            return None if self.total is None else 100
        return min(100, self.done * 100 // self.total)

    @property
    def eta_s(self) -> float | None:
        if self.total is None or not self.rate or self.verifying or self.paused:
            return None
        return max(self.total - self.done, 0) / self.rate


def measure(totals: Mapping[str, int], columns: Iterable[Mapping[str, Any]]
            ) -> tuple[int, int | None, bool]:
    """(done, total, verifying) from the checkpoints; see the module docstring."""
    done, known, verifying = 0, True, False
    for column in columns:
        total = totals.get(column["column"])
        if total is None:
            known = False
            done += handled(column)
        else:
            done += total if column["finished"] else min(total, handled(column))
        verifying |= column["pass"] > 1 and not column["finished"]
    return done, (sum(totals.values()) if known else None), verifying


class Rate:
    """Rows per second over the last ``RATE_WINDOW_S`` of samples taken while running."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def observe(self, t: float, done: int) -> float | None:
        samples = self._samples
        samples.append((t, done))
        while len(samples) > 2 and t - samples[1][0] >= RATE_WINDOW_S:
            samples.popleft()
        t0, done0 = samples[0]
        return (done - done0) / (t - t0) if t - t0 >= WAIT_POLL_S else None


# -- what is shown ---------------------------------------------------------------------------


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def waiting(snap: Snapshot) -> bool:
    """Nothing to measure yet: the run has not been claimed."""
    return snap.status is RunStatus.PENDING and not snap.done and not snap.paused


def pieces(snap: Snapshot, *, final: bool = False) -> list[str]:
    """The parts of a progress line, most important first (a narrow terminal drops the last):
    percent and rows (always), then the state when not plainly running, the ETA, the rate."""
    if waiting(snap):
        return ["waiting for a worker to claim the run"]
    out = [f"{snap.percent}%"] if snap.percent is not None else []
    out.append(f"{snap.done:,}/{snap.total:,} rows" if snap.total is not None
               else f"{snap.done:,} rows")
    if final:
        out.append(f"in {duration(snap.elapsed_s)}")
    elif snap.paused:
        out.append("paused (`notifyq keys resume` goes on)")
    elif snap.status is not RunStatus.RUNNING:
        out.append(snap.status.value)
    elif snap.verifying:
        out.append("verifying")
    if not final and snap.eta_s is not None:
        out.append(f"ETA {duration(snap.eta_s)}")
    if snap.rate is not None:
        out.append(f"{snap.rate:,.0f} rows/s")
    return out


def bar_line(snap: Snapshot, width: int, *, final: bool = False) -> str:
    """At most ``width`` characters: percent and rows always, a bar of ``BAR_MIN`` or more
    when there is room for one, then what fits of the rest, and the bar takes what is left."""
    parts = pieces(snap, final=final)
    bar = snap.percent is not None and not waiting(snap)
    keep = 2 if bar else 1
    text = "  ".join(parts[:keep])
    reserve = BAR_MIN + 3 if bar and width - len(text) >= BAR_MIN + 3 else 0
    for part in parts[keep:]:
        if len(text) + 2 + len(part) + reserve > width:
            break
        text += "  " + part
    if reserve:
        size = min(BAR_MAX, width - len(text) - 3)
        filled = size * (snap.percent or 0) // 100
        text = "[" + "#" * filled + "-" * (size - filled) + "] " + text
    return text[:width]


def terminal_width(stream: TextIO) -> int:
    """``COLUMNS`` if set, else the terminal's width (80 when unknown)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError):
            columns = shutil.get_terminal_size().columns
    return columns if columns > 0 else 80


class BarReport:
    """On a terminal: one line redrawn in place with ``\\r``, never wider than the terminal
    (a wrapped line could not be redrawn); notes are printed above it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._drawn = 0

    def show(self, snap: Snapshot, *, final: bool = False) -> None:
        width = terminal_width(self.stream) - 1  # the last column would wrap on some terminals
        line = bar_line(snap, width, final=final)
        self.stream.write("\r" + line.ljust(min(self._drawn, width)))
        self.stream.flush()
        self._drawn = len(line)

    def note(self, text: str) -> None:
        self._erase()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, snap: Snapshot) -> None:
        self.show(snap, final=True)
        self.stop()

    def stop(self) -> None:
        """Leave the bar as it is and move below it."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self._drawn = 0


class LineReport:
    """Elsewhere (a pipe, a log): a plain line now and then, never a flood."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._last: tuple[float, int, RunStatus] | None = None

    def show(self, snap: Snapshot) -> None:
        if self._due(snap):
            self._write("rotation: " + ", ".join(pieces(snap)))
            self._last = (snap.elapsed_s, snap.percent or 0, snap.status)

    def note(self, text: str) -> None:
        self._write(text)

    def close(self, snap: Snapshot) -> None:
        self._write("rotation: " + ", ".join(pieces(snap, final=True)))

    def stop(self) -> None:
        """Nothing to tidy: every line is complete."""

    def _due(self, snap: Snapshot) -> bool:
        if self._last is None:
            return True
        at, percent, status = self._last
        if snap.elapsed_s - at < LINE_EVERY_S:
            return False
        return (status is not snap.status or (snap.percent or 0) - percent >= LINE_STEP_PERCENT
                or snap.elapsed_s - at >= LINE_HEARTBEAT_S)

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


Report = BarReport | LineReport


def report_for(stream: TextIO) -> Report:
    return BarReport(stream) if stream.isatty() else LineReport(stream)


# -- the watcher -----------------------------------------------------------------------------


class RotationWatch:
    """Polls one rotation run until it ends (or ``timeout_s`` passes), reporting as it goes.

    ``start_hint`` is how to start a worker (``notifyq worker --app …``), used in the no-worker
    line."""

    def __init__(self, runtime: Runtime, keys: KeyAdmin, conn: AsyncConn, run_id: UUID,
                 report: Report, *,
                 start_hint: str) -> None:
        self.runtime = runtime
        self.keys = keys
        self.conn = conn
        self.run_id = run_id
        self.report = report
        self.start_hint = start_hint
        self.clock = runtime.clock.monotonic
        self.last: Poll | None = None
        self._noted: str | None = None
        self._failures_noted = 0

    async def poll(self) -> Poll:
        async with self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.runtime.queries.key_rotation_watch,
                              {"run_id": self.run_id, "now": self.runtime.clock.db_now()})
            row = await cur.fetchone()
        if row is None:
            raise NotifyqError(f"rotation run {self.run_id} no longer exists (deleted or purged)")
        self.last = Poll.from_row(row)
        return self.last

    async def begin(self) -> dict[str, int]:
        """The totals (see :func:`totals_of`) and the first poll, read in one snapshot
        (REPEATABLE READ) so that rows a running worker handles meanwhile count once."""
        await self.conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        try:
            async with self.conn.transaction():
                status = await self.keys.status(self.conn)
                first = await self.poll()
        finally:
            await self.conn.set_isolation_level(None)
        return totals_of({c["column"]: c["remaining"] for c in status["columns"]}, first)

    async def follow(self, timeout_s: float | None) -> bool:
        """True when the run ended, False when ``timeout_s`` passed first."""
        start = self.clock()
        totals = await self.begin()
        poll = self.last
        assert poll is not None  # noqa: S101 - begin() polled
        rate = Rate()
        first_done = measure(totals, poll.columns)[0]
        while True:
            now = self.clock() - start
            done, total, verifying = measure(totals, poll.columns)
            if poll.status.terminal:
                average = (done - first_done) / now if now > 0 else None
                self.report.close(Snapshot(poll.status, done, total, verifying, average, now))
                return True
            moving = poll.status is RunStatus.RUNNING and not poll.paused
            speed = rate.observe(now, done) if moving else None
            self._notes(poll)
            if timeout_s is not None and now >= timeout_s:
                self.report.stop()
                return False
            self.report.show(Snapshot(poll.status, done, total, verifying, speed, now,
                                      poll.paused))
            await anyio.sleep(WAIT_POLL_S)
            poll = await self.poll()

    def _notes(self, poll: Poll) -> None:
        if (poll.status is RunStatus.PENDING and poll.error is not None
                and poll.attempts > self._failures_noted):
            self._failures_noted = poll.attempts
            self.report.note(f"attempt {poll.attempts} of {poll.max_attempts} of the "
                             f"{REENCRYPT} run failed: {poll.error or 'no reason recorded'}; "
                             "it will be retried")
        stuck = self._stuck(poll)
        if stuck is not None and stuck != self._noted:
            self.report.note(stuck)
        if stuck is not None or poll.status is RunStatus.RUNNING:
            self._noted = stuck

    def _stuck(self, poll: Poll) -> str | None:
        if poll.paused:
            return None
        where = f"the {REENCRYPT} run (pool {poll.pool})"
        start = f"start `{self.start_hint}` (or `notifyq serve`) with the same keys"
        if (poll.unclaimed_s or 0) >= NO_WORKER_AFTER_S:
            return (f"no worker has claimed {where} in {NO_WORKER_AFTER_S:.0f} s: {start}, or "
                    "free a busy worker of that pool; still waiting")
        if (poll.lease_lapsed_s or 0) >= NO_WORKER_AFTER_S:
            return (f"the worker running {where} stopped renewing its lease and no worker has "
                    f"taken the run back: {start}; still waiting")
        return None

    def timeout_message(self, timeout_s: float) -> str:
        """The one-line error when ``--timeout`` ran out: the run goes on (or stays queued)."""
        poll = self.last
        state = poll.status.value if poll else "unknown"
        nobody = poll is not None and self._stuck(poll) is not None
        return (f"rotation run {self.run_id} did not finish within {timeout_s:g} s "
                f"(still {state}{', no worker has it' if nobody else ''}); it is not canceled: "
                "`notifyq keys rotate --wait` follows it again")
