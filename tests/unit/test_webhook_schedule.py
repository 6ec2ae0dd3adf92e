"""The webhook retry schedule: a pure function of (result, attempt, settings, now)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from notifyq._settings import WebhookSettings
from notifyq._webhooks.client import AttemptResult
from notifyq._webhooks.schedule import decide, parse_retry_after

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
DEFAULT = WebhookSettings()


def _status(code: int, retry_after: str | None = None) -> AttemptResult:
    return AttemptResult(duration_ms=1.0, status_code=code, retry_after=retry_after)


def test_the_default_schedule_is_immediately_5s_5min_30min_2h_5h_10h_10h() -> None:
    assert DEFAULT.retry_schedule_s == [0, 5, 300, 1800, 7200, 18000, 36000, 36000]
    assert DEFAULT.jitter == 0.2


@pytest.mark.parametrize(("attempt", "base"), [(1, 5), (2, 300), (3, 1800), (4, 7200),
                                               (5, 18000), (6, 36000), (7, 36000)])
def test_each_failed_attempt_waits_the_next_delay_within_twenty_percent(
        attempt: int, base: float) -> None:
    rng = random.Random(attempt)
    delays = [decide(_status(500), attempt, DEFAULT, NOW, rng).delay_s for _ in range(200)]
    assert all(d is not None and base * 0.8 <= d <= base * 1.2 for d in delays)
    assert max(d or 0 for d in delays) - min(d or 0 for d in delays) > base * 0.2


def test_the_eighth_failure_ends_the_delivery() -> None:
    assert decide(_status(500), 8, DEFAULT, NOW, random.Random()).kind == "failed"


@pytest.mark.parametrize("code", [200, 201, 204, 299])
def test_only_2xx_succeeds(code: int) -> None:
    assert decide(_status(code), 1, DEFAULT, NOW, random.Random()).kind == "succeeded"


@pytest.mark.parametrize("code", [100, 301, 302, 304, 400, 401, 404, 409, 422, 500, 502, 503])
def test_redirects_client_and_server_errors_are_retried(code: int) -> None:
    assert decide(_status(code), 1, DEFAULT, NOW, random.Random()).kind == "retry"


def test_410_is_gone_and_configured_statuses_are_permanent() -> None:
    assert decide(_status(410), 1, DEFAULT, NOW, random.Random()).kind == "gone"
    strict = WebhookSettings(permanent_statuses=[400, 422])
    assert decide(_status(422), 1, strict, NOW, random.Random()).kind == "failed"
    assert decide(_status(404), 1, strict, NOW, random.Random()).kind == "retry"


def test_429_and_timeouts_wait_at_least_sixty_seconds() -> None:
    assert (decide(_status(429), 1, DEFAULT, NOW, random.Random()).delay_s or 0) >= 60
    timeout = AttemptResult(duration_ms=15000, error_kind="timeout", error="slow")
    assert (decide(timeout, 1, DEFAULT, NOW, random.Random()).delay_s or 0) >= 60
    connect = AttemptResult(duration_ms=1, error_kind="connect", error="refused")
    assert (decide(connect, 1, DEFAULT, NOW, random.Random()).delay_s or 0) <= 6


@pytest.mark.parametrize(("header", "at_least", "at_most"), [
    ("120", 120, 120),                               # delta-seconds
    (format_datetime(NOW + timedelta(minutes=10), usegmt=True), 600, 600),   # HTTP date
    (format_datetime(NOW - timedelta(minutes=10), usegmt=True), 4, 6),       # in the past
    ("soon", 4, 6),                                  # unreadable: ignored
    ("-5", 4, 6),
    (str(10 * 86_400), 86_400, 86_400),              # capped at retry_after_max_s
])
def test_retry_after_is_honoured_within_bounds(header: str, at_least: float,
                                               at_most: float) -> None:
    delay = decide(_status(503, header), 1, DEFAULT, NOW, random.Random()).delay_s
    assert delay is not None
    assert at_least <= delay <= at_most


def test_retry_after_parsing() -> None:
    assert parse_retry_after(None, NOW) is None
    assert parse_retry_after(" 7 ", NOW) == 7
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW) == 0
