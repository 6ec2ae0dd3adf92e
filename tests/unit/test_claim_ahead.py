"""Claim-ahead sizing (notifyq/_dispatch/claim_ahead.py) and the claim slots it resizes, with
the clock moved by hand."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from notifyq._dispatch.claim_ahead import MOST_PER_SLOT, WINDOW_S, ClaimAhead
from notifyq._dispatch.producer import Slots


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def run_at(ahead: ClaimAhead, clock: FakeClock, *, rate: float, handler_s: float,
           round_trip_s: float, seconds: float = 2.0) -> int:
    """Finish runs at ``rate``, each ``handler_s`` long, for ``seconds`` with statements of
    ``round_trip_s``, asking for the slots every 10 ms as producers do; the last answer."""
    slots = ahead.slots()
    for _ in range(int(seconds / 0.01)):
        clock.t += 0.01
        for _ in range(round(rate * 0.01)):
            ahead.finished(handler_s)
        ahead.statement(round_trip_s)
        slots = ahead.slots()
    return slots


def test_a_fixed_prefetch_is_kept_whatever_the_worker_does() -> None:
    clock = FakeClock()
    ahead = ClaimAhead(10, 3, now=clock)
    assert run_at(ahead, clock, rate=8000, handler_s=1e-5, round_trip_s=0.0025) == 13
    assert ClaimAhead(10, 0, now=clock).slots() == 10


def test_until_it_has_measured_it_claims_as_many_ahead_as_it_has_slots() -> None:
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    assert ahead.slots() == 20
    clock.t += WINDOW_S / 2
    assert ahead.slots() == 20  # too short a window to estimate anything


def test_a_worker_slow_to_reach_its_first_claim_still_starts_with_as_many_as_its_slots() -> None:
    # The window opens at the first claim: a loaded machine that took a second from the
    # worker's start to its first claim has measured nothing yet.
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    clock.t += 1.0
    assert ahead.slots() == 20
    clock.t += WINDOW_S / 2
    assert ahead.slots() == 20


def test_short_runs_get_the_cap_however_slowly_they_are_seen_to_finish() -> None:
    # No-op handlers (20 us) finishing only 8,000 a second: the claim-ahead holds the worker
    # back, not the handlers, which could finish 500,000 a second; the cap is 20 a slot, at
    # most 200.
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    assert run_at(ahead, clock, rate=8000, handler_s=2e-5, round_trip_s=0.0025) == 10 + 200
    assert MOST_PER_SLOT == 20


def test_a_handler_that_returns_at_once_counts_as_a_microsecond() -> None:
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    assert run_at(ahead, clock, rate=8000, handler_s=0.0, round_trip_s=0.0025) == 10 + 200


def test_ten_millisecond_runs_get_three_round_trips_worth() -> None:
    # 10 handlers of 10 ms could finish 1,000 a second: 3 x 2 ms of them is 6.
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    assert run_at(ahead, clock, rate=1000, handler_s=0.01, round_trip_s=0.002) == 10 + 6


def test_long_runs_are_not_hoarded() -> None:
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    assert run_at(ahead, clock, rate=10, handler_s=1.0, round_trip_s=0.002, seconds=5) == 11


def test_a_worker_whose_runs_slow_down_claims_less_ahead_within_three_seconds() -> None:
    clock = FakeClock()
    ahead = ClaimAhead(10, None, now=clock)
    assert run_at(ahead, clock, rate=8000, handler_s=2e-5, round_trip_s=0.0025) == 210
    # Then handlers of 30 s: none finishes for a while, and the estimate decays.
    assert run_at(ahead, clock, rate=0, handler_s=30.0, round_trip_s=0.0025, seconds=3) == 11


@pytest.mark.anyio
async def test_slots_shrink_as_held_runs_finish_and_grow_at_once() -> None:
    sizes = iter([6, 6, 2, 2, 8, 8])
    slots = Slots(6, lambda: next(sizes))
    assert slots.take(100) == 3  # half the slots at a time
    assert slots.take(100) == 3
    assert slots.take(100) == 0  # resized to 2 with 6 held: free is -4
    assert (slots.size, slots.free, slots.busy) == (2, -4, 6)
    slots.give(5)
    assert slots.free == 1
    assert slots.take(100) == 1
    assert slots.take(100) == 4  # resized to 8: the 6 more are free at once, half taken
    assert (slots.size, slots.free) == (8, 2)


@pytest.mark.parametrize(("size", "limit", "taken"), [(1, 100, 1), (2, 100, 1), (5, 100, 3),
                                                      (10, 100, 5), (10, 2, 2)])
def test_a_claim_takes_at_most_half_the_slots(size: int, limit: int, taken: int) -> None:
    # The other half holds the batch the handlers run while the claim is in flight.
    slots = Slots(size)
    assert slots.take(limit) == taken
    assert slots.free == size - taken


@pytest.mark.anyio
async def test_a_producer_waiting_for_a_slot_wakes_when_the_slots_grow() -> None:
    slots = Slots(1)
    assert slots.take(1) == 1
    async with anyio.create_task_group() as tg:
        woke = anyio.Event()

        async def waiter() -> None:
            await slots.wait_free()
            woke.set()

        tg.start_soon(waiter)
        await anyio.lowlevel.checkpoint()
        assert not woke.is_set()
        slots.resize(3)
        with anyio.fail_after(1):
            await woke.wait()


@pytest.mark.parametrize(("concurrency", "most_ahead"), [(1, 20), (4, 80), (10, 200), (25, 200),
                                                         (500, 500)])
def test_the_most_claimed_ahead_is_twenty_per_slot_up_to_two_hundred_or_the_concurrency(
        concurrency: int, most_ahead: int) -> None:
    clock = FakeClock()
    ahead = ClaimAhead(concurrency, None, now=clock)
    assert run_at(ahead, clock, rate=1e5, handler_s=1e-6,
                  round_trip_s=0.01) == concurrency + most_ahead
