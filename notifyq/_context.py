"""What a handler receives: ``ctx.input``, ``ctx.run`` and a logger bound to the run."""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from datetime import datetime, timedelta
from typing import Any

from notifyq._durable.session import ChildRun, DurableSession
from notifyq._policies import ClosePolicy, RetryPolicy
from notifyq._run import RunInfo


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the run id and type to every record (as ``extra`` and in the message)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = self.extra or {}
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[{extra['run_type']} {extra['run_id']}] {msg}", kwargs


class JobContext:
    """The handler's view of the run it executes.

    Example::

        @app.handler("email.send")
        async def send_email(ctx: JobContext) -> dict:
            ctx.log.info("sending to %s", ctx.input["to"])
            return {"sent": True, "attempt": ctx.run.attempt}
    """

    __slots__ = ("_cancel_requested", "_durable", "_log", "_session", "input", "run")

    def __init__(self, run: RunInfo, input: Any,
                 durable: Callable[[], DurableSession] | None = None) -> None:
        self.run = run
        self.input = input
        self._log: RunLogger | None = None
        self._cancel_requested = False
        self._durable = durable
        self._session: DurableSession | None = None

    @property
    def log(self) -> RunLogger:
        """A logger (``notifyq.run``) that adds the run's id and type to every line."""
        # Made on first use: most handlers never log, and building it for every run (a logger
        # lookup, an adapter, the id as text) was ~1.2 us of a no-op run's ~2 us context.
        if self._log is None:
            self._log = RunLogger(logging.getLogger("notifyq.run"),
                                  {"run_id": str(self.run.id), "run_type": self.run.job_type})
        return self._log

    @property
    def cancel_requested(self) -> bool:
        """True once a cancel was asked for; sync handlers can poll it to stop early."""
        return self._cancel_requested

    # -- durable runs (async handlers) ---------------------------------------------------------

    async def step(self, step_id: str, fn: Callable[[], Any], *,
                   retry: RetryPolicy | None = None, timeout_s: float | None = None) -> Any:
        """Run ``fn`` once and memoize its JSON result: on a retry or resume of the run, the
        stored result is returned without calling ``fn`` again (see ``replay_from``).

        ``fn`` takes no arguments and may be async. ``retry`` retries the step inside the run.

        Example::

            charge = await ctx.step("charge-card", lambda: payments.charge(order))
        """
        return await self._sessions().step(step_id, fn, retry=retry, timeout_s=timeout_s)

    async def checkpoint(self, name: str) -> None:
        """Mark a point that ``replay_from="last_checkpoint"`` replays up to on a retry."""
        await self._sessions().checkpoint(name)

    async def spawn_child(self, job_type: str, input: Any = None, *,
                          close_policy: ClosePolicy = "terminate", run_at: datetime | None = None,
                          priority: int | None = None, tags: list[str] | None = None,
                          step_id: str | None = None) -> ChildRun:
        """Start a child run (once: a replayed parent gets the same child back).

        ``close_policy`` applies when this run finishes first: ``terminate`` cancels the child
        at once, ``cancel`` asks it to stop, ``abandon`` lets it run on.
        """
        return await self._sessions().spawn_child(
            job_type, {} if input is None else input, close_policy=close_policy, run_at=run_at,
            priority=priority, tags=tags, step_id=step_id)

    async def wait_for(self, *children: ChildRun) -> Any:
        """The outputs of ``children`` once they have all completed (one child: its output).

        Until then the run waits durably without holding a worker slot, and resumes by replay
        when the last one finishes. A child that failed, timed out or was canceled raises
        :class:`~notifyq._errors.ChildFailed`.
        """
        outputs = await self._sessions().wait_for(children)
        return outputs[0] if len(children) == 1 else outputs

    async def sleep(self, delay: timedelta) -> None:
        """Sleep durably: the run waits without a worker slot and resumes after ``delay``."""
        await self._sessions().sleep(delay)

    async def wait_for_signal(
        self, token: str, *, timeout: timedelta | None = None  # noqa: ASYNC109 - durable
    ) -> Any:
        """Wait durably for ``app.signal(token, payload)`` (or SQL ``notifyq.signal``) and
        return the payload; past ``timeout`` the run ends ``timed_out``."""
        return await self._sessions().wait_for_signal(token, timeout)

    def _sessions(self) -> DurableSession:
        if self._session is None:
            if self._durable is None:
                raise RuntimeError("durable operations need a run executed by a worker")
            self._session = self._durable()
        return self._session
