"""Running one claimed run: the handler under its timeout, inside a cancel scope that the
worker can cancel (cancel request, lease lost, shutdown); then decide and write the outcome."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

import anyio
from psycopg_pool import AsyncConnectionPool

from notifyq._clock import Clock
from notifyq._context import JobContext
from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._dispatch.completer import Completer
from notifyq._dispatch.outcome import (
    Canceled,
    Outcome,
    Raised,
    Released,
    Result,
    Succeeded,
    Suspended,
    TimedOut,
    decide,
)
from notifyq._durable.session import DurableSession, Suspend
from notifyq._errors import LeaseLost, UnknownJobType
from notifyq._policies import RetryPolicy
from notifyq._registry import HandlerSpec, Registry
from notifyq._run import RunInfo
from notifyq._tracing import Claimed, finished, processing

log = logging.getLogger("notifyq.executor")

StopReason = Literal["canceled", "lost", "shutdown"]


@dataclass(eq=False)
class Execution:
    """One claimed run in this worker, from claim to write-back."""

    run: RunInfo
    fence: int
    input: Any
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    reason: StopReason | None = None
    db_offset: timedelta | None = None
    """The database clock minus this host's clock, measured at claim (None: unknown)."""
    settled: bool = False
    """Its write-back is done (or there was nothing to write): it has left the worker."""
    freed: bool = False
    """Its claim slot was given back when the handler returned, before the write settled."""
    claimed_at: datetime | None = None
    handler_s: float = 0.0
    """How long its handler ran, in seconds (0 until it has)."""
    trace_context: dict[str, str] | None = None
    """The enqueue's W3C trace context (OpenTelemetry), continued by the handler's spans."""

    @classmethod
    def from_claim(cls, row: dict[str, Any], *, host_now: datetime | None = None) -> Execution:
        """``host_now``: this host's time when the claim returned; with the row's
        ``claimed_at`` (the database's time) it gives :attr:`db_offset`."""
        run = RunInfo(
            id=row["id"], job_type=row["job_type"], attempt=row["attempts"],
            max_attempts=row["max_attempts"], pool=row["pool"], priority=row["priority"],
            run_at=row["run_at"], created_at=row["created_at"], tags=row["tags"],
            timeout_s=row["timeout_s"], parent_run_id=row["parent_run_id"],
            root_run_id=row["root_run_id"])
        execution = cls(run, row["fence"], row["input"])
        execution.trace_context = row.get("trace_context")
        execution.claimed_at = claimed_at = row.get("claimed_at")
        if host_now is not None and claimed_at is not None:
            execution.db_offset = claimed_at - host_now
        if row["cancel_requested_at"] is not None:
            execution.stop("canceled")
        return execution

    @property
    def id(self) -> UUID:
        return self.run.id

    @property
    def log_extra(self) -> dict[str, str]:
        """``extra`` for log lines about this run (JSON logs carry them as fields)."""
        return {"run_id": str(self.run.id), "run_type": self.run.job_type}

    def claimed(self) -> Claimed:
        """What the OpenTelemetry spans and metrics need (notifyq/_tracing.py)."""
        run = self.run
        return Claimed(run.id, run.job_type, run.pool, run.attempt, run.run_at, self.claimed_at,
                       self.db_offset, self.trace_context)

    def stop(self, reason: StopReason) -> None:
        """Interrupt the handler; the first reason given wins."""
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


_DEFAULT_POLICY = RetryPolicy()


class Executor:
    def __init__(self, registry: Registry, completer: Completer, clock: Clock, *,
                 thread_limiter: anyio.CapacityLimiter, db: AsyncConnectionPool[AsyncConn],
                 queries: Queries) -> None:
        self._db = db
        self._q = queries
        self._registry = registry
        self._completer = completer
        self._clock = clock
        self._threads = thread_limiter
        self._rng = random.Random()  # noqa: S311 - jitter, not security
        self.counts: dict[str, int] = {}
        self.observer: Callable[[Execution, str, float], None] | None = None
        """Called after each run with its outcome (a key of ``counts``) and the handler's
        duration in seconds; ``notifyq serve`` feeds its metrics from it."""

    async def execute(self, execution: Execution,
                      finished: Callable[[Execution], None] = lambda e: None) -> None:
        """Run the handler and hand its outcome to the completer, without waiting for the
        write: the slot goes on with its next run meanwhile. ``finished`` is called once the
        write-back is settled (committed, fenced out or failed), or at once when there is
        nothing to write."""
        spec = self._registry.get(execution.run.job_type)
        with processing(execution.claimed) as span:
            started = time.monotonic()
            result = await self._invoke(spec, execution)
            execution.handler_s = elapsed = time.monotonic() - started
            if result is None:
                log.debug("run %s: lease lost while running; result dropped", execution.id,
                          extra=execution.log_extra)
                self._count("lease_lost", execution, elapsed)
                finished(execution)
                return
            outcome = self._decide(execution, result, spec.retry if spec else _DEFAULT_POLICY)
            if span is not None:
                span.decided(outcome=outcome.status.value,
                             error=result.error if isinstance(result, Raised) else None,
                             timed_out=isinstance(result, TimedOut))
        self._submit(execution, outcome, result, elapsed, finished)

    def release(self, execution: Execution, finished: Callable[[Execution], None]) -> None:
        """Give back a claimed run that never started (a claimed-ahead run at shutdown): back
        to pending at once, the attempt not counted."""
        self._submit(execution, self._decide(execution, Released(), _DEFAULT_POLICY),
                     Released(), 0.0, finished)

    def _submit(self, execution: Execution, outcome: Outcome, result: Result, elapsed: float,
                finished: Callable[[Execution], None]) -> None:
        def written(ok: bool, failure: BaseException | None) -> None:
            try:
                self._written(execution, outcome, result, elapsed, ok=ok, failure=failure)
            finally:
                finished(execution)

        try:
            self._completer.submit(execution.id, execution.fence, outcome, written)
        except Exception as exc:
            written(False, exc)

    def _written(self, execution: Execution, outcome: Outcome, result: Result, elapsed: float,
                 *, ok: bool, failure: BaseException | None) -> None:
        if failure is not None:
            log.error("run %s: write-back failed (%s); the lease will expire and the run be "
                      "retried", execution.id, failure, extra=execution.log_extra)
            return
        if not ok:
            log.debug("run %s: lease taken over; write-back dropped", execution.id,
                      extra=execution.log_extra)
            self._count("lease_lost", execution, elapsed)
            return
        self._count(outcome.status.value if outcome.refund == 0 else "released", execution,
                    elapsed)
        if isinstance(result, Raised) and outcome.status.value in ("pending", "failed"):
            log.info("run %s (%s) attempt %d failed: %s -> %s", execution.id,
                     execution.run.job_type, execution.run.attempt,
                     type(result.error).__name__, outcome.status.value,
                     extra=execution.log_extra)

    def _now(self, execution: Execution) -> datetime:
        now = self._clock.now()
        if self._clock.db_now() is None and execution.db_offset is not None:
            # The database decides runnability by its own clock: a retry "in 2 s" must be 2 s
            # from its now, however far this host's clock is off.
            now += execution.db_offset
        return now

    def _decide(self, execution: Execution, result: Result, policy: RetryPolicy) -> Outcome:
        now = self._now(execution)
        try:
            return decide(execution.run, result, policy, now, self._rng)
        except TypeError as exc:  # non-JSON output
            return decide(execution.run, Raised(exc), policy, now, self._rng)

    async def _invoke(self, spec: HandlerSpec | None, execution: Execution) -> Result | None:
        if spec is None:
            return Raised(UnknownJobType(
                f"no handler registered for job type {execution.run.job_type!r} in this worker"))
        ctx = JobContext(execution.run, execution.input,
                         durable=lambda: DurableSession(
                             db=self._db, queries=self._q, run=execution.run,
                             fence=execution.fence, replay_from=spec.replay_from,
                             now=lambda: self._now(execution)))
        timeout = execution.run.timeout_s or spec.timeout_s
        with execution.scope:
            if timeout is None:
                # No deadline scope without a timeout (the default): claim-to-result CPU of a
                # no-op run 13.6 -> 9.7 us, ~4 % of the ~95 us of worker CPU per run in
                # `notifyq bench` drain (2 cores). The run's own scope still allows stop().
                return await self._result_of(spec, ctx)
            with anyio.move_on_after(timeout) as deadline:
                return await self._result_of(spec, ctx)
            if deadline.cancelled_caught:
                return TimedOut(timeout)
        ctx._cancel_requested = True
        match execution.reason:
            case "canceled":
                return Canceled()
            case "shutdown":
                return Released()
            case _:
                return None

    async def _result_of(self, spec: HandlerSpec, ctx: JobContext) -> Result | None:
        try:
            return Succeeded(await self._call(spec, ctx))
        except Suspend as wait:
            return Suspended(wait.kind, wait.until, wait.token, wait.waiting_on)
        except LeaseLost:
            return None  # a durable write found the run taken over: stop, write nothing
        except Exception as exc:
            return Raised(exc)

    async def _call(self, spec: HandlerSpec, ctx: JobContext) -> Any:
        if spec.is_async:
            return await spec.call(ctx)
        return await anyio.to_thread.run_sync(spec.call, ctx, abandon_on_cancel=True,
                                              limiter=self._threads)

    def _count(self, key: str, execution: Execution, elapsed: float) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        finished(execution.run.job_type, execution.run.pool, key, elapsed)
        if self.observer is not None:
            self.observer(execution, key, elapsed)
