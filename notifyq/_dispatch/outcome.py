"""Deciding what happens to a run after its handler returns: one pure function.

``decide(run, result, policy, now, rng)`` maps what the handler did to a frozen
:class:`Outcome`; the completer persists it with one fenced statement. Nothing here does I/O.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from notifyq._enqueue.validate import jsonb_problem
from notifyq._errors import ChildFailed, Permanent, Snooze, StepError, WaitTimeout
from notifyq._policies import RetryPolicy
from notifyq._run import RunInfo, RunStatus, error_json, stored_json


@dataclass(frozen=True, slots=True)
class Succeeded:
    output: Any


@dataclass(frozen=True, slots=True)
class Raised:
    error: BaseException


@dataclass(frozen=True, slots=True)
class TimedOut:
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Canceled:
    """Someone asked for the run to be canceled and the handler was interrupted."""


@dataclass(frozen=True, slots=True)
class Released:
    """The worker shut down before the handler finished: the run goes back unharmed."""


@dataclass(frozen=True, slots=True)
class Suspended:
    """The handler parked the run durably (sleep, children, signal); it resumes by replay."""

    kind: str
    until: datetime
    token: str | None = None
    waiting_on: tuple[Any, ...] = ()


Result = Succeeded | Raised | TimedOut | Canceled | Released | Suspended


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to write about a finished execution."""

    status: RunStatus
    output: str | None = None
    error: str | None = None
    run_at: datetime | None = None
    refund: int = 0
    """Attempts given back (1 for snooze, release and durable waits: they do not count)."""
    snoozed: bool = False
    wait_kind: str | None = None
    wait_token: str | None = None
    waiting_on: str | None = None
    """The awaited child run ids, as a PostgreSQL array literal."""

    @property
    def kind(self) -> str:
        if self.status is RunStatus.PENDING:
            if self.snoozed:
                return "snoozed"
            return "released" if self.refund else "retried"
        return self.status.value


_COMPLETED = Outcome(RunStatus.COMPLETED)
"""A handler that returned None (the usual no-op): frozen, so one instance serves every run
(a frozen dataclass's __init__ costs ~1 us)."""


def decide(
    run: RunInfo, result: Result, policy: RetryPolicy, now: datetime, rng: random.Random
) -> Outcome:
    match result:
        case Succeeded(output):
            return _COMPLETED if output is None else Outcome(RunStatus.COMPLETED,
                                                             output=_dump_output(output))
        case Raised(Snooze(seconds=seconds)):
            return Outcome(RunStatus.PENDING, run_at=now + timedelta(seconds=seconds), refund=1,
                           snoozed=True)
        case Raised(Permanent() as perm):
            return Outcome(RunStatus.FAILED, error=error_json(perm.error, run.attempt, False))
        case Raised(WaitTimeout() as late):
            return Outcome(RunStatus.TIMED_OUT, error=error_json(late, run.attempt, False))
        case Raised(StepError() | ChildFailed() as fatal):
            # Replaying cannot change these: a misused step, or a child that already failed.
            return Outcome(RunStatus.FAILED, error=error_json(fatal, run.attempt, False))
        case Suspended(kind, until, token, waiting_on):
            members = ",".join(str(i) for i in waiting_on)
            return Outcome(RunStatus.WAITING, run_at=until, refund=1, wait_kind=kind,
                           wait_token=token, waiting_on="{" + members + "}" if waiting_on
                           else None)
        case Raised(error) if not policy.retryable(error) or run.last_attempt:
            return Outcome(RunStatus.FAILED, error=error_json(error, run.attempt, False))
        case Raised(error):
            return _retry(run, policy, now, rng, error_json(error, run.attempt, True))
        case TimedOut(timeout_s) if run.last_attempt:
            return Outcome(RunStatus.TIMED_OUT, error=_timeout_json(run, timeout_s, False))
        case TimedOut(timeout_s):
            return _retry(run, policy, now, rng, _timeout_json(run, timeout_s, True))
        case Canceled():
            return Outcome(RunStatus.CANCELED, error=stored_json({
                "message": "canceled while running", "type": "Canceled",
                "retryable": False, "attempt": run.attempt}))
        case Released():
            return Outcome(RunStatus.PENDING, run_at=now, refund=1)
    raise AssertionError(f"unhandled result {result!r}")  # pragma: no cover


def _retry(
    run: RunInfo, policy: RetryPolicy, now: datetime, rng: random.Random, error: str
) -> Outcome:
    delay = policy.delay_s(run.attempt, rng)
    return Outcome(RunStatus.PENDING, error=error, run_at=now + timedelta(seconds=delay))




def _timeout_json(run: RunInfo, timeout_s: float, retryable: bool) -> str:
    return stored_json({"message": f"timed out after {timeout_s:g} s", "type": "TimeoutError",
                  "retryable": retryable, "attempt": run.attempt})


def _dump_output(output: Any) -> str | None:
    if output is None:
        return None
    try:
        text = json.dumps(output, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"handler output is not JSON-serializable: {exc}") from exc
    # Written as is, what jsonb refuses would fail the whole completer batch, other runs too.
    problem = jsonb_problem(text)
    if problem:
        raise TypeError(f"handler output contains {problem}, which PostgreSQL's jsonb "
                        "cannot store")
    return text


