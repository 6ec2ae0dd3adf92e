"""Awaiting runs: ``app.wait``, ``Run.result`` and ``GET /v1/jobs/{id}?wait=``.

A waiter is woken by a NOTIFY, not by polling. Once the listener LISTENs, the waiter marks the
run awaited (``job_run_await``); the run's change to a final status then sends ``d:<run id>`` on
the schema's channel (migration 0011's trigger), whichever statement makes it: the completer's
batch, the reaper, a cancel, a durable wait's deadline. Runs nobody awaits send nothing.
The mark is an UPDATE, so it locks the row while it commits, and a worker's claim passes over a
locked row: marking a run still pending also wakes its pool again, after the lock is gone (a
waiter marks just after the enqueue, when its NOTIFY has a worker claiming; 5 of 60 runs
awaited in their worker's process waited for its poll before, issue 31).

A notification is only a hint (invariant 3): a waiter re-reads the row every ``recheck_s``
whatever happens, and every waiter re-reads it after the listener (re)connects, so a missed
notification costs at most ``recheck_s`` and never hangs a waiter.

The listener is the process's :class:`~notifyq._notifier.Notifier`: a worker's, when this process
runs one (:meth:`Awaiter.share`: no connection of its own). Elsewhere (a script, a web app that
only enqueues) the Awaiter runs one Notifier while anybody waits, inside the task of the waiter
that started it; when that waiter is done, the next one takes the listener over (one reconnect,
after which every waiter re-reads its run). No task outlives the waits that need it.

Example::

    run = await app.enqueue("report.build", {"day": "2026-12-01"})
    output = await run.result(timeout=30)  # or: await app.wait(run.id, timeout=30)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import anyio

from notifyq._db.rows import run_row
from notifyq._errors import ResultTimeout, RunFailed, RunNotFound
from notifyq._notifier import Notifier
from notifyq._run import Run, RunStatus
from notifyq._runtime import Runtime

log = logging.getLogger("notifyq.awaiter")

RECHECK_S = 5.0
"""How often a waiter re-reads its run when no notification came (a lost NOTIFY, a listener
that is reconnecting). Defaults to 5 s. With nowhere to LISTEN (``database_transaction_pooling``
without ``listen_database_url``) waiters poll at ``worker.poll_interval_s`` instead, as the
workers do."""


@dataclass(eq=False)
class _Waiter:
    run_id: UUID
    woken: anyio.Event = field(default_factory=anyio.Event)
    marked: bool = False


class Awaiter:
    """Waits for runs to reach a final status; one per App."""

    def __init__(self, runtime: Runtime, *, recheck_s: float = RECHECK_S) -> None:
        if recheck_s <= 0:
            raise ValueError(f"recheck_s must be positive, got {recheck_s}")
        self._runtime = runtime
        self._recheck_s = recheck_s
        self._waiters: dict[UUID, list[_Waiter]] = {}
        self._shared: Notifier | None = None
        self._own: Notifier | None = None
        self._listening = False
        self.notified = 0
        """Wake-ups by a run's notification (tests read it)."""
        self.rechecks = 0
        """Re-reads after ``recheck_s`` without a notification."""

    def share(self, notifier: Notifier) -> None:
        """Use a worker's listener while it is connected instead of a connection of our own."""
        if self._shared is not notifier:
            notifier.subscribe(self._on_notification)
            notifier.on_connect(self._wake_all)
            self._shared = notifier

    async def wait(self, run_id: UUID, timeout: float | None) -> Any:  # noqa: ASYNC109
        """The run's output once it completed; :class:`RunFailed` when it ended failed,
        timed_out or canceled; :class:`ResultTimeout` after ``timeout`` seconds (None: none)."""
        return result_of(await self.finished(run_id, timeout))

    async def finished(self, run_id: UUID, timeout: float | None) -> Run:  # noqa: ASYNC109
        """The run once its status is final; :class:`ResultTimeout` after ``timeout`` s."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must not be negative, got {timeout}")
        waiter = _Waiter(run_id)
        self._waiters.setdefault(run_id, []).append(waiter)
        try:
            with anyio.move_on_after(timeout):
                return await self._until_final(waiter)
            raise ResultTimeout(f"run {run_id} did not finish within {timeout:g} s; it goes on "
                                "running (wait again, or cancel it)")
        finally:
            waiters = self._waiters[run_id]
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[run_id]

    async def _until_final(self, waiter: _Waiter) -> Run:
        while True:
            url = self._runtime.listen_url()
            if not self._listening and not (self._shared and self._shared.connected) and (
                    url is not None):
                return await self._listen_while(waiter, url)
            run = await self._check(waiter)
            if run.status.terminal:
                return run
            await self._sleep(waiter)

    async def _listen_while(self, waiter: _Waiter, url: str) -> Run:
        """Run the listener for every waiter of this process until ``waiter``'s run is done."""
        self._listening = True
        try:
            failure: Exception | None = None
            async with anyio.create_task_group() as tg:
                await tg.start(self._notifier(url).run)
                try:
                    run = await self._watch(waiter)
                except Exception as exc:  # raised below as it is, not in an ExceptionGroup
                    failure = exc
                tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            return run
        finally:
            self._listening = False
            self._wake_all()  # one of the others takes the listener over

    async def _watch(self, waiter: _Waiter) -> Run:
        while True:
            run = await self._check(waiter)
            if run.status.terminal:
                return run
            await self._sleep(waiter)

    def _notifier(self, url: str) -> Notifier:
        if self._own is None:
            self._own = Notifier(url, self._runtime.queries)
            self._own.subscribe(self._on_notification)
            self._own.on_connect(self._wake_all)
        return self._own

    async def _check(self, waiter: _Waiter) -> Run:
        """The run as it is now (marked awaited the first time it is not final). Re-arms the
        wake-up first, so a notification that lands during the read is not lost."""
        waiter.woken = anyio.Event()
        q = self._runtime.queries
        async with self._runtime.connection() as conn, conn.cursor(row_factory=run_row) as cur:
            await cur.execute(q.job_run_get, {"id": waiter.run_id})
            run = await cur.fetchone()
            if run is not None and not run.status.terminal and not waiter.marked:
                await cur.execute(q.job_run_await, {"id": waiter.run_id, "channel": q.schema})
                run = await cur.fetchone()
                waiter.marked = True
        if run is None:
            raise RunNotFound(f"no run {waiter.run_id}")
        return run

    async def _sleep(self, waiter: _Waiter) -> None:
        settings = self._runtime.settings
        recheck_s = self._recheck_s if settings.listen_url is not None else min(
            self._recheck_s, settings.worker.poll_interval_s)
        with anyio.move_on_after(recheck_s):
            await waiter.woken.wait()
            return
        self.rechecks += 1

    def _on_notification(self, payload: str) -> None:
        kind, _, value = payload.partition(":")
        if kind != "d":
            return
        try:
            waiters = self._waiters.get(UUID(value), ())
        except ValueError:
            return
        for waiter in waiters:
            self.notified += 1
            waiter.woken.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.woken.set()


def result_of(run: Run) -> Any:
    """A finished run's output, or its failure raised as :class:`RunFailed`."""
    if run.status == RunStatus.COMPLETED:
        return run.output
    raise RunFailed(run.id, run.job_type, run.status.value, run.error)
