"""Retry policies: how many attempts, and how long to wait between them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failing handler is retried.

    ``delay_s(attempt)`` is ``base_s`` (fixed) or ``base_s * 2 ** (attempt - 1)`` (exponential),
    capped at ``max_s`` and spread by ±``jitter`` so a burst of failures does not retry in step.
    Exceptions of a ``non_retryable`` type go straight to dead-letter.

    Example::

        RetryPolicy(attempts=5, backoff="exponential", base_s=2, max_s=300)
    """

    attempts: int = 25
    """Total attempts including the first. Defaults to 25."""
    backoff: Literal["fixed", "exponential"] = "exponential"
    """Defaults to "exponential"."""
    base_s: float = 1.0
    """Defaults to 1.0."""
    max_s: float = 3600.0
    """Defaults to 3600.0."""
    jitter: float = 0.1
    """Fraction of the delay added or removed at random. Defaults to 0.1."""
    non_retryable: tuple[type[BaseException], ...] = field(default=())
    """Defaults to ()."""

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= 1000:
            raise ValueError(f"attempts must be between 1 and 1000, got {self.attempts}")
        if self.base_s < 0:
            raise ValueError(f"base_s must not be negative, got {self.base_s}")
        if self.max_s < self.base_s:
            raise ValueError(f"max_s ({self.max_s}) cannot be less than base_s ({self.base_s})")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.backoff not in ("fixed", "exponential"):
            raise ValueError(f"backoff must be 'fixed' or 'exponential', got {self.backoff!r}")

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if self.backoff == "fixed":
            delay = self.base_s
        else:
            delay = self.base_s * 2.0 ** min(max(attempt - 1, 0), 60)
        delay = min(delay, self.max_s)
        if self.jitter:
            delay *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        return max(delay, 0.0)

    def retryable(self, error: BaseException) -> bool:
        return not isinstance(error, self.non_retryable)

    def to_json(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "backoff": self.backoff,
            "base_s": self.base_s,
            "max_s": self.max_s,
            "jitter": self.jitter,
            "non_retryable": [f"{t.__module__}.{t.__qualname__}" for t in self.non_retryable],
        }
