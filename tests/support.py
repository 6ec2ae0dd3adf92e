"""Helpers for tests: wait for a condition instead of sleeping; run worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]


async def eventually(check: Callable[[], Awaitable[T]], *, timeout: float = 10.0,
                     interval: float = 0.02) -> T:
    """Retry ``check`` (an async callable that raises AssertionError) until it passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await anyio.sleep(interval)


def wait_until(check: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05) -> T:
    """Synchronous ``eventually`` for tests that drive processes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(interval)


def spawn_worker(dsn: str, app: str = "tests.apps.ledger:app", *, concurrency: int = 8,
                 extra_env: dict[str, str] | None = None, args: list[str] | None = None,
                 ) -> subprocess.Popen[bytes]:
    """Start ``python -m notifyq worker`` as a real process against ``dsn``."""
    env = {
        **os.environ,
        "NOTIFYQ_DATABASE_URL": dsn,
        "NOTIFYQ_ENV": "test",
        "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.2",
        "NOTIFYQ_WORKER__LEASE_S": "2",
        "NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "2",
        "NOTIFYQ_REAPER__INTERVAL_S": "0.3",
        "NOTIFYQ_LEADER__TTL_S": "1",
        "PYTHONPATH": str(ROOT),
        **(extra_env or {}),
    }
    cmd = [sys.executable, "-m", "notifyq", "worker", "--app", app,
           "--concurrency", str(concurrency), *(args or [])]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> int:
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
