"""``notifyq keys rotate --wait`` as a real process against real worker processes: progress on
stderr (plain lines in a pipe, one bar redrawn in place on a terminal), a line within seconds
when no worker claims the run, and ``--timeout``."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import Any

import psycopg

from notifyq._keys.watch import NO_WORKER_AFTER_S
from tests import vault
from tests.support import ROOT, Workers, scalar, wait_until

VAULT_APP = "tests.apps.vault:app"
KEYS = vault.keys_env(1, 2, active=2)
PROGRESS = re.compile(r"^rotation: (\d+)%, ([\d,]+)/([\d,]+) rows")


def _active_is(sql: psycopg.Connection[Any], version: int) -> None:
    assert scalar(sql, "SELECT version FROM notifyq.key_active") == version


def _env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NOTIFYQ_") and k != "COLUMNS"}
    return {**env, "NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_ENV": "test",
            "PYTHONPATH": str(ROOT), **KEYS}


def _rotate(*args: str) -> list[str]:
    return [sys.executable, "-m", "notifyq", "keys", "rotate", "--wait", "--app", VAULT_APP,
            *args]


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_rotate_wait_prints_rows_done_of_total_rate_and_eta_while_a_worker_rotates(
        dsn: str, sql: psycopg.Connection[Any], logs: Any) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 8000, 2000)
    with Workers(dsn, logs, app=VAULT_APP, extra_env=KEYS) as workers:
        workers.start()
        # The worker promotes version 2 at its first key check; a CLI never promotes.
        wait_until(lambda: _active_is(sql, 2))
        result = subprocess.run(_rotate("--batch-size", "100", "--pause-s", "0.05"),
                                env=_env(dsn), cwd=ROOT, capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == 0, result.stderr + workers.logs()
    assert "completed" in result.stdout.splitlines()[0]
    lines = result.stderr.splitlines()
    assert lines[0].startswith("started rotation to key version 2, secret.reencrypt run ")
    progress = [(int(m[1]), _number(m[2]), _number(m[3]), line)
                for line in lines if (m := PROGRESS.match(line))]
    assert {total for _, _, total, _ in progress} == {10_000}, lines
    done = [d for _, d, _, _ in progress]
    assert done == sorted(done), lines
    middle = [line for _, d, _, line in progress if 0 < d < 10_000]
    assert middle, f"no line while the rotation was half way: {lines}"
    assert any(re.search(r"ETA \d+s, [\d,]+ rows/s$", line) for line in middle), lines
    assert re.match(r"^rotation: 100%, 10,000/10,000 rows, in \d+s, [\d,]+ rows/s$",
                    lines[-1]), lines
    # Not a flood: a line per 2 s at most (the rotation takes ~6 s), and nothing else.
    assert len(progress) <= 10, lines
    others = [line for line in lines[1:] if not PROGRESS.match(line)]
    assert set(others) <= {"rotation: waiting for a worker to claim the run"}, lines


def test_on_a_terminal_rotate_wait_redraws_one_bar_that_fits_a_narrow_terminal(
        dsn: str, sql: psycopg.Connection[Any], logs: Any) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 4000, 0)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 44, 0, 0))
    with Workers(dsn, logs, app=VAULT_APP, extra_env=KEYS) as workers:
        workers.start()
        wait_until(lambda: _active_is(sql, 2))  # the worker promotes; a CLI never does
        proc = subprocess.Popen(_rotate("--batch-size", "100", "--pause-s", "0.05"),
                                env=_env(dsn), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=slave)
        os.close(slave)
        screen = _read_all(master)
        assert proc.wait(120) == 0, screen + workers.logs()
    head, _, bar = screen.partition("\r\n")  # the "started rotation" line, then the bar
    assert head.startswith("started rotation to key version 2")
    assert bar.endswith("\r\n"), repr(bar)
    assert "\n" not in bar[:-2], repr(bar)
    frames = [f.rstrip() for f in bar[:-2].split("\r") if f.strip()]
    assert len(frames) >= 3, frames
    assert all(len(frame) <= 43 for frame in frames), frames
    assert any(re.match(r"^\[#*-+\] \d+%  [\d,]+/4,000 rows$", f) for f in frames), frames
    assert re.match(r"^\[#+\] 100%  4,000/4,000 rows", frames[-1]), frames


def _read_all(fd: int) -> str:
    """Everything written to the terminal until its last writer closes it."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(fd)
    return out.decode()


def test_with_no_worker_rotate_wait_says_so_within_seconds_and_timeout_exits_124(
        dsn: str, sql: psycopg.Connection[Any]) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 10, 0)
    started = time.monotonic()
    seen: list[tuple[float, str]] = []
    with subprocess.Popen(_rotate("--timeout", "9"), env=_env(dsn), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                seen.append((time.monotonic() - started, line.rstrip("\n")))
        reader = threading.Thread(target=read)
        reader.start()
        try:
            code = proc.wait(60)
        finally:
            proc.kill()
            reader.join(10)
        assert proc.stdout is not None
        out = proc.stdout.read()
    lines = [line for _, line in seen]
    assert code == 124, lines
    hints = [(at, line) for at, line in seen if line.startswith("no worker has claimed")]
    assert len(hints) == 1, lines
    at, hint = hints[0]
    # Due at once, hinted NO_WORKER_AFTER_S later (plus a process start and a poll).
    assert NO_WORKER_AFTER_S <= at <= NO_WORKER_AFTER_S + 4, seen
    assert hint == ("no worker has claimed the secret.reencrypt run (pool default) in 5 s: "
                    f"start `notifyq worker --app {VAULT_APP}` (or `notifyq serve`) with the "
                    "same keys, or free a busy worker of that pool; still waiting")
    run_id = scalar(sql, "SELECT run_id FROM notifyq.key_rotation")
    assert lines[-1] == (f"notifyq: error: rotation run {run_id} did not finish within 9 s "
                         "(still pending, no worker has it); it is not canceled: "
                         "`notifyq keys rotate --wait` follows it again")
    assert [line for line in lines if line.startswith("notifyq: error")] == [lines[-1]]
    assert out == ""
    assert scalar(sql, "SELECT status FROM notifyq.job_run WHERE id = %s", (run_id,)) == "pending"


def test_timeout_without_wait_is_refused(dsn: str) -> None:
    result = subprocess.run([sys.executable, "-m", "notifyq", "keys", "rotate", "--timeout",
                             "3", "--app", VAULT_APP], env=_env(dsn), cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (
        1, "notifyq: error: --timeout only applies with --wait\n")


def test_a_failed_attempt_of_the_rotation_is_reported_while_waiting(
        dsn: str, sql: psycopg.Connection[Any], logs: Any) -> None:
    vault.fill(sql, vault.keyring(1, active=1), 10, 0)
    lacking = vault.keys_env(1, active=1)  # a worker deployed without the new key
    with Workers(dsn, logs, app=VAULT_APP, extra_env=lacking) as workers:
        workers.start()
        workers.wait_registered()
        forced = subprocess.run([sys.executable, "-m", "notifyq", "keys", "promote", "2",
                                 "--force", "--app", VAULT_APP], env=_env(dsn), cwd=ROOT,
                                capture_output=True, text=True, timeout=60, check=False)
        assert forced.returncode == 0, forced.stderr
        assert "warning: promoted although 1 live process(es) lack version 2" in forced.stderr
        result = subprocess.run(_rotate("--timeout", "6"), env=_env(dsn), cwd=ROOT,
                                capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 124, result.stderr
    failed = [line for line in result.stderr.splitlines() if line.startswith("attempt ")]
    assert failed[:1] == [
        "attempt 1 of 25 of the secret.reencrypt run failed: this worker does not hold key "
        "version 2, the rotation's target (it holds 1): add it to every worker's NOTIFYQ_KEYS; "
        "it will be retried"], result.stderr
