"""RetryPolicy: validation and the delay between attempts."""

from __future__ import annotations

import random

import pytest

from notifyq import RetryPolicy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts must be between 1 and 1000"),
        ({"attempts": 1001}, "attempts must be between 1 and 1000"),
        ({"base_s": -1}, "base_s must not be negative"),
        ({"base_s": 10, "max_s": 5}, r"max_s \(5\) cannot be less than base_s \(10\)"),
        ({"jitter": 1.0}, r"jitter must be in \[0, 1\)"),
        ({"jitter": -0.1}, r"jitter must be in \[0, 1\)"),
        ({"backoff": "linear"}, "backoff must be 'fixed' or 'exponential'"),
    ],
)
def test_retry_policy_refuses_invalid_values_naming_them(kwargs: dict[str, object],
                                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_fixed_backoff_waits_base_s_after_every_attempt() -> None:
    policy = RetryPolicy(backoff="fixed", base_s=7, jitter=0)
    assert [policy.delay_s(n) for n in (1, 2, 10)] == [7, 7, 7]


def test_exponential_backoff_doubles_from_base_s() -> None:
    policy = RetryPolicy(backoff="exponential", base_s=2, max_s=10_000, jitter=0)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4, 5)] == [2, 4, 8, 16, 32]


def test_exponential_backoff_is_capped_at_max_s() -> None:
    policy = RetryPolicy(backoff="exponential", base_s=1, max_s=60, jitter=0)
    assert policy.delay_s(7) == 60
    assert policy.delay_s(1000) == 60  # no overflow on huge attempt numbers


def test_jitter_spreads_delays_within_its_bounds() -> None:
    policy = RetryPolicy(backoff="fixed", base_s=10, jitter=0.2)
    rng = random.Random(42)
    delays = [policy.delay_s(1, rng) for _ in range(500)]
    assert all(8.0 <= d <= 12.0 for d in delays)
    assert min(delays) < 8.5
    assert max(delays) > 11.5


def test_jitter_applies_around_the_cap() -> None:
    policy = RetryPolicy(backoff="exponential", base_s=1, max_s=10, jitter=0.1)
    rng = random.Random(7)
    delays = [policy.delay_s(30, rng) for _ in range(200)]
    assert all(9.0 <= d <= 11.0 for d in delays)


def test_zero_base_retries_immediately() -> None:
    assert RetryPolicy(base_s=0, jitter=0.5).delay_s(3) == 0


def test_non_retryable_matches_subclasses() -> None:
    policy = RetryPolicy(non_retryable=(LookupError,))
    assert not policy.retryable(KeyError("k"))
    assert policy.retryable(ValueError("v"))


def test_policy_serializes_for_the_job_table() -> None:
    policy = RetryPolicy(attempts=3, backoff="fixed", base_s=5, max_s=5, jitter=0,
                         non_retryable=(KeyError,))
    assert policy.to_json() == {"attempts": 3, "backoff": "fixed", "base_s": 5, "max_s": 5,
                                "jitter": 0, "non_retryable": ["builtins.KeyError"]}
