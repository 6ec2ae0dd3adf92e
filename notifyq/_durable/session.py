"""The durable side of one execution: memoized steps, checkpoints, child runs, sleeps, signals.

Every durable operation is recorded in ``job_step`` under the run's fence. When the run executes
again — a retry after a failure, or a resume after a durable wait — the handler is replayed from
the top and each operation returns its recorded result instead of running again.

What a replay reuses:

* after a durable wait (sleep, children, signal) the run resumes in the *same* attempt (waits do
  not use up attempts) and every completed step is reused, whatever ``replay_from`` says;
* on a retry (a later attempt) ``replay_from`` decides for plain steps:
  ``last_step`` reuses every completed step, ``scratch`` none, and ``last_checkpoint`` those up
  to the last ``ctx.checkpoint(...)`` that an earlier attempt reached;
* child spawns, sleeps and received signals are always reused: they are facts, not
  computations (a replayed parent never spawns a child twice).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import anyio
from psycopg_pool import AsyncConnectionPool

from notifyq._db.pool import AsyncConn
from notifyq._db.queries import Queries
from notifyq._enqueue.ids import new_run_id
from notifyq._enqueue.refusals import translated_errors
from notifyq._enqueue.validate import encode_input
from notifyq._errors import ChildFailed, LeaseLost, StepError, WaitTimeout
from notifyq._limits import MAX_STEP_ID_LEN
from notifyq._policies import ClosePolicy, ReplayFrom, RetryPolicy
from notifyq._run import RunInfo, RunStatus, error_json
from notifyq._tracing import child_span

FOREVER = datetime(2999, 12, 31, tzinfo=UTC)
"""The run_at of a wait without a deadline (woken by its children or its signal)."""

_TERMINAL = {s.value for s in RunStatus if s.terminal}
_ONCE = RetryPolicy(attempts=1)


class Suspend(BaseException):
    """Parks the run durably; the executor turns it into a ``waiting`` outcome.

    A BaseException so that a handler's ``except Exception`` cannot swallow it.
    """

    def __init__(self, kind: str, *, until: datetime = FOREVER, token: str | None = None,
                 waiting_on: tuple[UUID, ...] = ()) -> None:
        super().__init__(kind)
        self.kind = kind
        self.until = until
        self.token = token
        self.waiting_on = waiting_on


@dataclass(frozen=True, slots=True)
class ChildRun:
    """A child run started by ``ctx.spawn_child``; pass it to ``ctx.wait_for``."""

    id: UUID
    job_type: str


class DurableSession:
    def __init__(self, *, db: AsyncConnectionPool[AsyncConn], queries: Queries, run: RunInfo,
                 fence: int, replay_from: ReplayFrom, now: Callable[[], datetime]) -> None:
        self._db = db
        self._q = queries
        self._run = run
        self._fence = fence
        self._replay_from = replay_from
        self._now = now
        self._memo: dict[str, dict[str, Any]] | None = None
        self._checkpoint_seq = 0
        self._seen: set[str] = set()
        self._seq = 0
        self._auto: dict[str, int] = {}

    # -- steps --------------------------------------------------------------------------------

    async def step(self, step_id: str, fn: Callable[[], Any], *, retry: RetryPolicy | None,
                   timeout_s: float | None) -> Any:
        with child_span(f"step {step_id}", {"notifyq.step.id": step_id,
                                            "messaging.message.id": str(self._run.id)}) as span:
            return await self._step(step_id, fn, retry=retry, timeout_s=timeout_s, span=span)

    async def _step(self, step_id: str, fn: Callable[[], Any], *, retry: RetryPolicy | None,
                    timeout_s: float | None, span: Any) -> Any:
        seq = self._next(step_id)
        memo = await self._recorded(step_id)
        if memo is not None and self._reusable(memo):
            if span is not None:
                span.set_attribute("notifyq.step.memoized", True)
            return memo["output"]
        started = self._now()
        policy = retry or _ONCE
        attempt = 0
        while True:
            attempt += 1
            try:
                with anyio.fail_after(timeout_s) if timeout_s else nullcontext():
                    value = await _call(fn)
                break
            except Exception as exc:
                if attempt >= policy.attempts or not policy.retryable(exc):
                    await self._record(step_id, seq, kind="step", status="failed", output=None,
                                       error=error_json(exc, attempt, False), attempts=attempt,
                                       started=started)
                    raise
                await anyio.sleep(policy.delay_s(attempt))
        if span is not None:
            span.set_attribute("notifyq.step.attempts", attempt)
        text = _dump(step_id, value)
        await self._record(step_id, seq, kind="step", status="completed", output=text,
                           error=None, attempts=attempt, started=started)
        return json.loads(text) if text is not None else None

    async def checkpoint(self, name: str) -> None:
        step_id = f"checkpoint:{name}"
        seq = self._next(step_id)
        if await self._recorded(step_id) is None:
            await self._mark(step_id, seq, "checkpoint", "completed", None)

    # -- children -----------------------------------------------------------------------------

    async def spawn_child(self, job_type: str, input_: Any, *, close_policy: ClosePolicy,
                          run_at: datetime | None, priority: int | None,
                          tags: list[str] | None, step_id: str | None) -> ChildRun:
        step_id = step_id or self._auto_id("child")
        seq = self._next(step_id)
        memo = await self._recorded(step_id)
        if memo is not None:
            return ChildRun(UUID(memo["output"]["run_id"]), job_type)
        if close_policy not in ("terminate", "cancel", "abandon"):
            raise StepError(f"close_policy must be terminate, cancel or abandon, "
                            f"got {close_policy!r}")
        with translated_errors():  # an unknown child type: UnknownJobType
            async with self._db.connection() as conn:
                row = await (await conn.execute(self._q.job_run_spawn_child, {
                    "run_id": self._run.id, "fence": self._fence, "job_type": job_type,
                    "input": encode_input(input_), "run_at": run_at, "priority": priority,
                    "tags": tags, "child_id": new_run_id(), "close_policy": close_policy,
                    "step_id": step_id, "seq": seq, "attempt": self._run.attempt})).fetchone()
        if row is None:
            raise LeaseLost(f"run {self._run.id} lost its lease before spawning {step_id}")
        self._memo_put(step_id, {"status": "completed", "kind": "child",
                                 "output": {"run_id": str(row["id"])}})
        return ChildRun(row["id"], job_type)

    async def wait_for(self, children: tuple[ChildRun, ...]) -> list[Any]:
        ids = [c.id for c in children]
        async with self._db.connection() as conn:
            rows = await (await conn.execute(self._q.job_run_status_many, {"ids": ids})).fetchall()
        found = {r["id"]: r for r in rows}
        if any(found.get(i, {}).get("status") not in _TERMINAL for i in ids):
            raise Suspend("children", waiting_on=tuple(ids))
        outputs = []
        for child in children:
            row = found[child.id]
            if row["status"] != RunStatus.COMPLETED:
                raise ChildFailed(child.id, row["job_type"], row["status"], row["error"])
            outputs.append(row["output"])
        return outputs

    # -- waits --------------------------------------------------------------------------------

    async def sleep(self, delay: timedelta) -> None:
        step_id = self._auto_id("sleep")
        seq = self._next(step_id)
        memo = await self._recorded(step_id)
        if memo is None:
            until = self._now() + delay
            await self._mark(step_id, seq, "sleep", "completed",
                             json.dumps({"until": until.isoformat()}))
        else:
            until = datetime.fromisoformat(memo["output"]["until"])
        if self._now() < until:
            raise Suspend("sleep", until=until)

    async def wait_for_signal(self, token: str, timeout: timedelta | None) -> Any:  # noqa: ASYNC109
        step_id = f"signal:{token}"
        seq = self._next(step_id)
        memo = await self._recorded(step_id)
        if memo is not None and memo["status"] == "completed":
            return memo["output"]["payload"]  # delivered by notifyq.signal, or taken before
        received = await self._take_signal(step_id, seq, token)
        if received is not None:
            return received["payload"]
        if memo is None:
            deadline = self._now() + timeout if timeout is not None else None
            text = json.dumps({"deadline": deadline.isoformat() if deadline else None})
            await self._mark(step_id, seq, "signal", "running", text)
        else:
            stored = memo["output"]["deadline"]
            deadline = datetime.fromisoformat(stored) if stored else None
        if deadline is not None and self._now() >= deadline:
            raise WaitTimeout(f"no signal {token!r} before the deadline {deadline.isoformat()}")
        raise Suspend("signal", token=token, until=deadline or FOREVER)

    async def _take_signal(self, step_id: str, seq: int, token: str) -> dict[str, Any] | None:
        """The oldest signal queued for ``token`` (sent while no run waited), taken from the
        queue and recorded as this wait's completed step in one fenced statement."""
        async with self._db.connection() as conn:
            row = await (await conn.execute(self._q.job_signal_consume, {
                "run_id": self._run.id, "fence": self._fence, "token": token,
                "step_id": step_id, "seq": seq, "attempt": self._run.attempt,
                "started_at": self._now()})).fetchone()
        if row is not None:
            self._memo_put(step_id, {"status": "completed", "kind": "signal", "seq": seq,
                                     "attempt": self._run.attempt,
                                     "output": {"payload": row["payload"]}})
        return row

    # -- the memo -----------------------------------------------------------------------------

    def _next(self, step_id: str) -> int:
        if not step_id or len(step_id) > MAX_STEP_ID_LEN:
            raise StepError(f"step id must be 1 to {MAX_STEP_ID_LEN} characters, got {step_id!r}")
        if step_id in self._seen:
            raise StepError(f"step id {step_id!r} used twice in one execution of run "
                            f"{self._run.id}: give each step its own id")
        self._seen.add(step_id)
        self._seq += 1
        return self._seq

    def _auto_id(self, kind: str) -> str:
        n = self._auto.get(kind, 0) + 1
        self._auto[kind] = n
        return f"{kind}:{n}"

    async def _recorded(self, step_id: str) -> dict[str, Any] | None:
        if self._memo is None:
            async with self._db.connection() as conn:
                rows = await (await conn.execute(self._q.job_step_list,
                                                 {"run_id": self._run.id})).fetchall()
            self._memo = {r["step_id"]: r for r in rows}
            self._checkpoint_seq = max(
                (r["seq"] for r in rows if r["kind"] == "checkpoint"
                 and r["attempt"] < self._run.attempt), default=0)
        return self._memo.get(step_id)

    def _memo_put(self, step_id: str, row: dict[str, Any]) -> None:
        if self._memo is not None:
            self._memo[step_id] = row

    def _reusable(self, memo: dict[str, Any]) -> bool:
        if memo["status"] != "completed":
            return False
        if memo["kind"] != "step" or memo["attempt"] == self._run.attempt:
            return True  # facts, or a resume within the same attempt
        match self._replay_from:
            case "last_step":
                return True
            case "last_checkpoint":
                return bool(memo["seq"] <= self._checkpoint_seq)
            case _:
                return False

    async def _mark(self, step_id: str, seq: int, kind: str, status: str,
                    output: str | None) -> None:
        """Record a durable fact (checkpoint, sleep, signal): no error, one attempt, now."""
        await self._record(step_id, seq, kind=kind, status=status, output=output, error=None,
                           attempts=1, started=self._now())

    async def _record(self, step_id: str, seq: int, *, kind: str, status: str,
                      output: str | None, error: str | None, attempts: int,
                      started: datetime) -> None:
        async with self._db.connection() as conn:
            row = await (await conn.execute(self._q.job_step_record, {
                "run_id": self._run.id, "fence": self._fence, "step_id": step_id, "seq": seq,
                "kind": kind, "status": status, "output": output, "error": error,
                "attempts": attempts, "attempt": self._run.attempt, "started_at": started,
                "now": None})).fetchone()
        if row is None:
            raise LeaseLost(f"run {self._run.id} lost its lease while recording {step_id}")
        self._memo_put(step_id, {"status": status, "kind": kind, "seq": seq,
                                 "attempt": self._run.attempt,
                                 "output": json.loads(output) if output else None})


async def _call(fn: Callable[[], Any]) -> Any:
    value = fn()
    if inspect.isawaitable(value):
        return await value
    return value


def _dump(step_id: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepError(f"step {step_id!r} returned a value that is not JSON: {exc}") from None


StepFn = Callable[[], Awaitable[Any] | Any]
