"""Running one claimed run: the handler under its timeout, inside a cancel scope that the
worker can cancel (cancel request, lease lost, shutdown); then decide and write the outcome."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

import anyio

from notifyq.clock import Clock
from notifyq.context import JobContext
from notifyq.dispatch.completer import Completer
from notifyq.dispatch.outcome import (
    Canceled,
    Outcome,
    Raised,
    Released,
    Result,
    Succeeded,
    TimedOut,
    decide,
)
from notifyq.dispatch.retry import RetryPolicy
from notifyq.errors import LeaseLost, UnknownJobType
from notifyq.registry import HandlerSpec, Registry
from notifyq.run import RunInfo

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

    @classmethod
    def from_claim(cls, row: dict[str, Any]) -> Execution:
        run = RunInfo(
            id=row["id"], job_type=row["job_type"], attempt=row["attempts"],
            max_attempts=row["max_attempts"], pool=row["pool"], priority=row["priority"],
            run_at=row["run_at"], created_at=row["created_at"], tags=row["tags"],
            timeout_s=row["timeout_s"], parent_run_id=row["parent_run_id"],
            root_run_id=row["root_run_id"])
        execution = cls(run, row["fence"], row["input"])
        if row["cancel_requested_at"] is not None:
            execution.stop("canceled")
        return execution

    @property
    def id(self) -> UUID:
        return self.run.id

    def stop(self, reason: StopReason) -> None:
        """Interrupt the handler; the first reason given wins."""
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


_DEFAULT_POLICY = RetryPolicy()


class Executor:
    def __init__(self, registry: Registry, completer: Completer, clock: Clock, *,
                 thread_limiter: anyio.CapacityLimiter) -> None:
        self._registry = registry
        self._completer = completer
        self._clock = clock
        self._threads = thread_limiter
        self._rng = random.Random()  # noqa: S311 - jitter, not security
        self.counts: dict[str, int] = {}

    async def execute(self, execution: Execution) -> None:
        spec = self._registry.get(execution.run.job_type)
        result = await self._invoke(spec, execution)
        if result is None:
            log.debug("run %s: lease lost while running; result dropped", execution.id)
            self._count("lease_lost")
            return
        policy = spec.retry if spec else _DEFAULT_POLICY
        outcome = self._decide(execution, result, policy)
        try:
            await self._completer.write(execution.id, execution.fence, outcome)
        except LeaseLost:
            log.debug("run %s: lease taken over; write-back dropped", execution.id)
            self._count("lease_lost")
            return
        self._count(outcome.status.value if outcome.refund == 0 else "released")
        if isinstance(result, Raised) and outcome.status.value in ("pending", "failed"):
            log.info("run %s (%s) attempt %d failed: %s -> %s", execution.id,
                     execution.run.job_type, execution.run.attempt,
                     type(result.error).__name__, outcome.status.value)

    def _decide(self, execution: Execution, result: Result, policy: RetryPolicy) -> Outcome:
        now = self._clock.now()
        try:
            return decide(execution.run, result, policy, now, self._rng)
        except TypeError as exc:  # non-JSON output
            return decide(execution.run, Raised(exc), policy, now, self._rng)

    async def _invoke(self, spec: HandlerSpec | None, execution: Execution) -> Result | None:
        if spec is None:
            return Raised(UnknownJobType(
                f"no handler registered for job type {execution.run.job_type!r} in this worker"))
        ctx = JobContext(execution.run, execution.input)
        timeout = execution.run.timeout_s or spec.timeout_s
        with execution.scope:
            with anyio.move_on_after(timeout) as deadline:
                try:
                    return Succeeded(await self._call(spec, ctx))
                except Exception as exc:
                    return Raised(exc)
            if deadline.cancelled_caught and timeout is not None:
                return TimedOut(timeout)
        ctx._cancel_requested = True
        match execution.reason:
            case "canceled":
                return Canceled()
            case "shutdown":
                return Released()
            case _:
                return None

    async def _call(self, spec: HandlerSpec, ctx: JobContext) -> Any:
        if spec.is_async:
            return await spec.call(ctx)
        return await anyio.to_thread.run_sync(spec.call, ctx, abandon_on_cancel=True,
                                              limiter=self._threads)

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
