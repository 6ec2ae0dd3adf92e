"""The Batcher: concurrent single items become batches, results go back to their callers, a bad
item fails alone, and cancellation neither loses nor stalls anyone."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from notifyq._db.batcher import Batcher

pytestmark = pytest.mark.anyio


class Doubler:
    """Doubles each item after a checkpoint; records the batches it was given."""

    def __init__(self, gate: anyio.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.gate = gate

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        await anyio.lowlevel.checkpoint()
        if 13 in items:
            raise ValueError("13 is unlucky")
        return [i * 2 for i in items]


async def settle() -> None:
    """Let every started task run until it blocks (all waits here are on in-memory events)."""
    for _ in range(20):
        await anyio.lowlevel.checkpoint()


async def gather(batcher: Batcher[int, int], items: list[int]) -> dict[int, object]:
    results: dict[int, object] = {}

    async def one(item: int) -> None:
        try:
            results[item] = await batcher.submit(item)
        except Exception as exc:
            results[item] = exc

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(one, item)
    return results


async def test_an_item_alone_goes_at_once_and_concurrent_ones_share_a_batch() -> None:
    execute = Doubler()
    batcher = Batcher(execute, batch_max=100)
    assert await batcher.submit(5) == 10
    results = await gather(batcher, list(range(1, 11)))
    assert results == {i: i * 2 for i in range(1, 11)}
    # The first caller leads alone; the nine queued behind it go together.
    assert execute.batches == [[5], [1], list(range(2, 11))]


async def test_with_gather_the_callers_ready_together_share_one_batch() -> None:
    execute = Doubler()
    batcher = Batcher(execute, gather=True)
    assert await batcher.submit(5) == 10
    first = await gather(batcher, list(range(1, 11)))  # after a lone batch: no gathering
    again = await gather(batcher, list(range(21, 31)))  # after a batch of 9: gathered
    assert first | again == {i: i * 2 for i in [*range(1, 11), *range(21, 31)]}
    assert execute.batches == [[5], [1], list(range(2, 11)), list(range(21, 31))]


async def test_a_caller_cancelled_while_gathering_passes_the_lead_on() -> None:
    execute = Doubler()
    batcher = Batcher(execute, gather=True)
    await gather(batcher, [7, 8, 9])  # [7], then [8, 9]: the next leader gathers
    results: dict[int, int] = {}

    async with anyio.create_task_group() as tg:
        first = anyio.CancelScope()
        tg.start_soon(_cancellable, first, batcher, 1)
        tg.start_soon(_submit, batcher, results, 2)
        first.cancel()
    assert results == {2: 4}
    assert execute.batches[2:] == [[2]]


async def test_batches_are_capped_at_batch_max() -> None:
    execute = Doubler()
    results = await gather(Batcher(execute, batch_max=4), list(range(1, 11)))
    assert results == {i: i * 2 for i in range(1, 11)}
    assert [len(b) for b in execute.batches] == [1, 4, 4, 1]


async def test_an_error_fails_the_whole_batch_unless_it_is_one_to_split_on() -> None:
    whole = await gather(Batcher(Doubler()), [1, 2, 13, 4])
    assert whole[1] == 2  # led alone, before the others queued
    assert all(isinstance(whole[i], ValueError) for i in (2, 13, 4))

    execute = Doubler()
    split = await gather(Batcher(execute, split_on=(ValueError,)), [1, 2, 13, 4])
    assert (split[1], split[2], split[4]) == (2, 4, 8)
    assert isinstance(split[13], ValueError)
    assert execute.batches == [[1], [2, 13, 4], [2], [13], [4]]


async def test_a_cancelled_leader_still_finishes_the_batch_for_the_others() -> None:
    gate = anyio.Event()
    execute = Doubler(gate)
    batcher = Batcher(execute)
    results: dict[int, int] = {}

    async with anyio.create_task_group() as tg:
        leader = anyio.CancelScope()
        tg.start_soon(_cancellable, leader, batcher, 1)
        await settle()
        tg.start_soon(_submit, batcher, results, 2)
        tg.start_soon(_submit, batcher, results, 3)
        await settle()
        leader.cancel()
        gate.set()
    assert results == {2: 4, 3: 6}
    assert execute.batches == [[1], [2, 3]]


async def test_without_shield_alone_a_cancelled_lone_leader_stops_and_the_queue_moves_on(
        ) -> None:
    gate = anyio.Event()
    execute = Doubler(gate)
    batcher = Batcher(execute, shield_alone=False, timeout_s=None)
    results: dict[int, int] = {}

    async with anyio.create_task_group() as tg:
        leader = anyio.CancelScope()
        tg.start_soon(_cancellable, leader, batcher, 1)  # leads alone; held at the gate
        await settle()
        tg.start_soon(_submit, batcher, results, 2)
        await settle()
        leader.cancel()  # not shielded: its batch stops at the gate, and 2 leads next
        await settle()
        gate.set()
    assert results == {2: 4}
    assert execute.batches == [[1], [2]]


async def _submit(batcher: Batcher[int, int], results: dict[int, int], item: int) -> None:
    results[item] = await batcher.submit(item)


async def _cancellable(scope: anyio.CancelScope, batcher: Batcher[int, int], item: int) -> None:
    with scope:
        await batcher.submit(item)


async def test_a_caller_cancelled_while_queued_is_not_run_and_the_queue_moves_on() -> None:
    gate = anyio.Event()
    execute = Doubler(gate)
    batcher = Batcher(execute)
    results: dict[int, int] = {}

    async with anyio.create_task_group() as tg:
        tg.start_soon(_submit, batcher, results, 1)  # leads; held at the gate
        await settle()
        queued = anyio.CancelScope()
        tg.start_soon(_cancellable, queued, batcher, 99)  # queued behind the gate
        await settle()
        queued.cancel()
        await settle()
        tg.start_soon(_submit, batcher, results, 7)
        await settle()
        gate.set()
    assert results == {1: 2, 7: 14}
    assert execute.batches == [[1], [7]]


async def test_batch_max_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_max must be at least 1, got 0"):
        Batcher(Doubler(), batch_max=0)


async def test_items_queued_together_go_out_as_one_batch_whoever_awaits_first() -> None:
    doubler = Doubler()
    batcher = Batcher(doubler)
    tickets = [batcher.queue(i) for i in (1, 2, 3, 4)]
    assert doubler.batches == []  # queued, not sent
    assert await batcher.result(tickets[2]) == 6  # the third leads the batch of all four
    assert doubler.batches == [[1, 2, 3, 4]]
    assert [await batcher.result(t) for t in tickets] == [2, 4, 6, 8]
    assert await batcher.submit(5) == 10
    assert doubler.batches == [[1, 2, 3, 4], [5]]
