"""Shares: which endpoints' shares a batch of attempts may change, and when no statement is
needed at all."""

from __future__ import annotations

import uuid
from typing import Any

from notifyq._settings import WebhookSettings
from notifyq._webhooks.shares import GROW_EVERY_S, Shares

A, B, C = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def attempt(endpoint: uuid.UUID, *, code: int | None = 200, kind: str | None = None,
            ms: float = 3.0, counted: int = 1) -> dict[str, Any]:
    return {"endpoint_id": endpoint, "status_code": code, "error_kind": kind, "duration_ms": ms,
            "counted": counted, "succeeded": code is not None and 200 <= code < 300}


class Clock:
    """Seconds that pass only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shares(clock: Clock | None = None) -> Shares:
    """By default a clock that moves ``GROW_EVERY_S`` at each reading: every fast batch may
    grow its endpoint's share at once."""
    if clock is None:
        moving = Clock()

        def tick() -> float:
            moving.now += GROW_EVERY_S
            return moving.now
        return Shares(_settings(), clock=tick)
    return Shares(_settings(), clock=clock)


def _settings() -> WebhookSettings:
    return WebhookSettings(endpoint_concurrency=5, endpoint_concurrency_max=8,
                           endpoint_slow_s=1.0)


def test_overloads_are_counted_per_endpoint_and_a_fast_success_alone_grows() -> None:
    s = shares()
    assert s.changes([attempt(A), attempt(A), attempt(B, code=429),
                      attempt(B, code=None, kind="timeout"), attempt(C, code=503),
                      attempt(C, ms=1500.0)]) == {A: 0, B: 2, C: 2}


def test_what_says_nothing_of_load_changes_nothing() -> None:
    s = shares()
    assert s.changes([attempt(A, code=500), attempt(A, code=404),
                      attempt(B, code=None, kind="timeout", counted=0)]) is None


def test_an_endpoint_seen_at_its_bound_costs_no_statement() -> None:
    s = shares()
    changing = s.changes([attempt(A), attempt(B, code=429)])
    assert changing == {A: 0, B: 1}
    s.learned(changing, [])  # nothing written: A was at the ceiling, B at 1
    assert s.changes([attempt(A), attempt(B, code=429)]) is None
    assert s.changes([attempt(A, code=429), attempt(B)]) == {A: 1, B: 0}


def test_a_share_in_between_is_not_remembered() -> None:
    s = shares()
    changing = {A: 0}
    s.learned(changing, [{"key": f"webhook:{A}", "concurrency_limit": 6}])
    assert s.changes([attempt(A)]) == {A: 0}
    s.learned(changing, [{"key": f"webhook:{A}", "concurrency_limit": 8}])
    assert s.changes([attempt(A)]) is None


def test_a_growing_share_is_written_at_most_every_grow_interval_with_the_steps_that_waited(
        ) -> None:
    clock = Clock()
    s = shares(clock)
    changing = s.changes([attempt(A)])
    assert changing == {A: 0}
    assert s.params(changing, None)["grow"] == [1]
    s.learned(changing, [{"key": f"webhook:{A}", "concurrency_limit": 6}])
    assert s.changes([attempt(A)]) is None  # within the interval: the step waits
    assert s.changes([attempt(A), attempt(A)]) is None  # one step a batch, not an attempt
    clock.now += GROW_EVERY_S
    changing = s.changes([attempt(A)])
    assert changing == {A: 0}
    assert s.params(changing, None)["grow"] == [3]
    s.learned(changing, [{"key": f"webhook:{A}", "concurrency_limit": 8}])
    clock.now += GROW_EVERY_S
    assert s.changes([attempt(A)]) is None  # at the ceiling


def test_an_overload_goes_out_at_once_and_drops_the_steps_that_waited() -> None:
    clock = Clock()
    s = shares(clock)
    changing = s.changes([attempt(A)])
    assert changing is not None
    s.learned(changing, [{"key": f"webhook:{A}", "concurrency_limit": 6}])
    assert s.changes([attempt(A)]) is None
    changing = s.changes([attempt(A, code=503)])
    assert changing == {A: 1}
    assert s.params(changing, None)["grow"] == [0]
    s.learned(changing, [{"key": f"webhook:{A}", "concurrency_limit": 3}])
    clock.now += GROW_EVERY_S
    changing = s.changes([attempt(A)])
    assert changing is not None
    assert s.params(changing, None)["grow"] == [1]
