"""Concurrent callers' single items, executed as one batch (group commit, without a task).

A caller that finds no batch in flight runs one at once, with everything queued so far (up to
``batch_max``); callers arriving meanwhile queue up, and the first of them leads the next batch
when the current one ends. At idle an item goes alone and at once; under load a batch grows
with the time the previous one took. There is no background task to start or stop: the callers
themselves take turns (structured concurrency, nothing outlives them).

A leader's batch runs shielded from its caller's cancellation (the others are waiting on it)
under ``timeout_s`` (None: no deadline). With ``shield_alone=False``, a batch of the leader's
own item alone runs like a plain call: no shield (nobody else waits on it), no event, no
deadline timer unless ``timeout_s`` (~15 us less a lone call on the 2-core VM). When a batch
raises one of ``split_on`` (errors that one bad item can cause, like a foreign key violation),
its items are run again one by one, so only the bad one fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False, slots=True)
class _Entry(Generic[T, R]):
    item: T
    turn: anyio.Event | None = None
    """Made when the caller first waits: a caller that leads at once never needs one."""
    finished: bool = False
    result: R | None = None
    error: BaseException | None = None

    def finish(self, result: R | None = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.finished = result, error, True
        if self.turn is not None:
            self.turn.set()

    def wake(self) -> None:
        """Its turn to lead (or it finished): a caller about to wait sees it finished or not
        busy, so only one that already waits needs the event set."""
        if self.turn is not None:
            self.turn.set()


class Batcher(Generic[T, R]):
    """``await batcher.submit(item)`` returns that item's result from ``execute(items)``, which
    must return one result per item, in order."""

    def __init__(self, execute: Callable[[list[T]], Awaitable[Sequence[R]]], *,
                 batch_max: int = 100, timeout_s: float | None = 30.0,
                 split_on: tuple[type[BaseException], ...] = (),
                 shield_alone: bool = True, gather: bool = False) -> None:
        if batch_max < 1:
            raise ValueError(f"batch_max must be at least 1, got {batch_max}")
        self._execute = execute
        self._batch_max = batch_max
        self._timeout_s = timeout_s
        self._split_on = split_on
        self._shield_alone = shield_alone
        self._gather = gather
        self._queue: list[_Entry[T, R]] = []
        self._busy = False
        self._gathering = False
        self._last_size = 0
        self.batches = 0

    async def submit(self, item: T) -> R:
        return await self.result(self.queue(item))

    def queue(self, item: T) -> _Entry[T, R]:
        """Queue ``item`` now, without waiting: it goes in the next batch (led by whoever
        awaits first), and :meth:`result` gives its result. Items queued together before any
        of them is awaited go out as one batch (a prefetch of everything a claim brought)."""
        entry: _Entry[T, R] = _Entry(item)
        self._queue.append(entry)
        return entry

    async def result(self, entry: _Entry[T, R]) -> R:
        """The result of a queued item: waits for its batch, or leads it."""
        try:
            while not entry.finished:
                if self._busy or self._gathering:
                    entry.turn = anyio.Event()
                    await entry.turn.wait()
                    continue
                if self._gather and self._last_size > 1:
                    await self._let_others_queue()
                await self._lead(entry)
        except BaseException:
            if entry in self._queue:  # left before its batch started: it is not run
                self._queue.remove(entry)
            self._pass_turn()
            raise
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]  # set by finish() with R

    async def _let_others_queue(self) -> None:
        """One pass of the event loop before leading, the others waiting: when a batch ends,
        its callers' next items come at about the same time, and the first would otherwise lead
        alone and the rest a round trip later. Only after a batch of several: a lone caller
        does not pay for it."""
        self._gathering = True
        try:
            await anyio.lowlevel.checkpoint()
        finally:
            self._gathering = False

    def _pass_turn(self) -> None:
        if not self._busy and self._queue:
            self._queue[0].wake()

    async def _lead(self, own: _Entry[T, R]) -> None:
        self._busy = True
        batch, self._queue = self._queue[:self._batch_max], self._queue[self._batch_max:]
        self._last_size = len(batch)
        try:
            if self._shield_alone or batch != [own]:
                with anyio.CancelScope(shield=True):
                    await self._run(batch)
            else:
                await self._run(batch)
        finally:
            for entry in batch:
                if not entry.finished:  # only a BaseException escaping _run gets here
                    entry.finish(error=RuntimeError("the batch was interrupted"))
            self._busy = False
            self._pass_turn()

    async def _run(self, batch: list[_Entry[T, R]]) -> None:
        try:
            results = await self._call([e.item for e in batch])
        except self._split_on as exc:
            if len(batch) == 1:
                batch[0].finish(error=exc)
                return
            for entry in batch:
                try:
                    entry.finish((await self._call([entry.item]))[0])
                except Exception as alone:  # handed to that item's caller
                    entry.finish(error=alone)
            return
        except Exception as exc:  # handed to every caller
            for entry in batch:
                entry.finish(error=exc)
            return
        for entry, result in zip(batch, results, strict=True):
            entry.finish(result)

    async def _call(self, items: list[T]) -> Sequence[R]:
        if self._timeout_s is None:  # a deadline's timer costs ~9 us a batch here
            results = await self._execute(items)
        else:
            with anyio.fail_after(self._timeout_s):
                results = await self._execute(items)
        self.batches += 1
        if len(results) != len(items):
            raise RuntimeError(f"a batch of {len(items)} returned {len(results)} results")
        return results
