"""What happens after an attempt: one pure function of (result, attempt number, settings, now).

The webhook schedule decides, not the generic retry policy: the handler turns a ``retry``
decision into :class:`~notifyq._errors.Snooze` (the run's own attempt counter is not used) and
``failed`` / ``gone`` into :class:`~notifyq._errors.Permanent`.

- 2xx: ``succeeded``.
- 410 Gone: ``gone`` (the endpoint is disabled and its pending deliveries stop).
- a status in ``permanent_statuses``, a request that could not be sent at all (error kind
  ``invalid``), or the schedule is used up: ``failed``.
- anything else (3xx, other 4xx, 5xx, network errors): ``retry`` after the next delay of
  ``retry_schedule_s``, spread by ±``jitter``; never before a ``Retry-After`` (capped at
  ``retry_after_max_s``); at least ``throttled_min_s`` after a 429 or a timeout.
"""

from __future__ import annotations

import email.utils
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from notifyq._settings import WebhookSettings

if TYPE_CHECKING:
    from notifyq._webhooks.client import AttemptResult

GONE = 410
TOO_MANY_REQUESTS = 429


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Literal["succeeded", "retry", "failed", "gone"]
    delay_s: float | None = None


def decide(result: AttemptResult, attempt: int, settings: WebhookSettings, now: datetime,
           rng: random.Random) -> Decision:
    """``attempt`` is the 1-based number of the scheduled attempt that just ended."""
    status = result.status_code
    if result.succeeded:
        return Decision("succeeded")
    if status == GONE:
        return Decision("gone")
    if status is not None and status in settings.permanent_statuses:
        return Decision("failed")
    if result.error_kind == "invalid":  # the same request would be refused again
        return Decision("failed")
    schedule = settings.retry_schedule_s
    if attempt >= len(schedule):
        return Decision("failed")
    delay = schedule[attempt] * (1 + rng.uniform(-settings.jitter, settings.jitter))
    asked = parse_retry_after(result.retry_after, now)
    if asked is not None:
        delay = max(delay, min(asked, settings.retry_after_max_s))
    if status == TOO_MANY_REQUESTS or result.error_kind == "timeout":
        delay = max(delay, settings.throttled_min_s)
    return Decision("retry", max(delay, 0.0))


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from ``now`` that a ``Retry-After`` asks for: delta-seconds or an HTTP date.
    None when absent or unreadable; a date in the past is 0."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - now).total_seconds(), 0.0)
