"""The policies a handler is registered with: how it is retried (:class:`RetryPolicy`), and
for durable runs its concurrency, dedupe and scope keys, stored on the job definition so every
enqueuer (other processes, the SQL function, the HTTP API) applies them.

Keys are either a callable of the input or a template such as ``"order:{order_id}"`` (filled
from the input's top-level fields). Templates are stored and applied by the SQL function too;
callables only by Python enqueuers that registered the handler.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from notifyq._errors import InvalidEnqueue
from notifyq._limits import MAX_ATTEMPTS_RANGE, MAX_KEY_LEN, RATE_LIMIT_RANGE, RATE_PERIOD_MAX_S
from notifyq._run import DEDUPE_STATES, RUN_STATUSES


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
        low, high = MAX_ATTEMPTS_RANGE
        if not low <= self.attempts <= high:
            raise ValueError(f"attempts must be between {low} and {high}, got {self.attempts}")
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


KeyFn = Callable[[Any], str] | str
Collision = Literal["queue", "reject", "replace"]
ReplayFrom = Literal["scratch", "last_step", "last_checkpoint"]
ClosePolicy = Literal["terminate", "cancel", "abandon"]


@dataclass(frozen=True, slots=True)
class ConcurrencyPolicy:
    """At most ``limit`` runs with the same key run at once.

    ``collision`` decides what an enqueue does when the key is busy: ``queue`` (default) waits
    its turn as ``pending``; ``reject`` raises :class:`~notifyq._errors.ConcurrencyRejected`;
    ``replace`` cancels the key's pending/waiting runs (and asks running ones to stop), then
    queues the new run.

    Example::

        ConcurrencyPolicy(key=lambda i: f"account:{i['account_id']}", collision="replace")
    """

    key: KeyFn
    collision: Collision = "queue"
    limit: int = 1

    def __post_init__(self) -> None:
        if self.collision not in ("queue", "reject", "replace"):
            raise ValueError(f"collision must be queue, reject or replace, got {self.collision!r}")
        if self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")


@dataclass(frozen=True, slots=True)
class DedupePolicy:
    """An enqueue whose key matches an existing run returns that run instead of a new one.

    A run matches when its status is one of ``states``: a live one (pending, running, waiting)
    whatever its age, a finished one (completed, failed, timed_out, canceled) only if it was
    created within ``window_s``. By default a failed or canceled run does not match, so the key
    can be enqueued again after a failure.

    Example::

        DedupePolicy(key="invoice:{invoice_id}", window_s=3600)
        DedupePolicy(key="import:{file}", states=("pending", "running", "completed", "failed"))
    """

    key: KeyFn
    window_s: float | None = None
    """How long a finished run keeps matching. None: until it is purged."""
    states: Sequence[str] = DEDUPE_STATES
    """The run statuses that match. Defaults to pending, running, waiting and completed."""

    def __post_init__(self) -> None:
        if self.window_s is not None and self.window_s <= 0:
            raise ValueError(f"window_s must be positive, got {self.window_s}")
        check_dedupe_states(self.states, ValueError)
        object.__setattr__(self, "states", tuple(self.states))


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` runs start per ``period_s`` seconds, across every worker.

    The limit counts per key: by default the job type; with ``key``, a template filled from
    the input (``"api:{account_id}"``: a limit per account), or a constant shared by every type
    that names it (``"pool:emails"``: one limit for all of them). Keys are templates, not
    callables, so every enqueuer (other processes, plain SQL, the HTTP API) applies them. The
    window slides: no ``period_s``-long interval sees more than ``limit`` starts (a retry is a
    start too). Runs over the limit wait ``pending``; the rest of the pool is not held up.
    Types that share a key should declare the same limit (a run's own type's limit applies).

    Example::

        RateLimit(limit=100, period_s=60, key="smtp:{tenant}")
    """

    limit: int
    period_s: float = 1.0
    """Defaults to 1.0."""
    key: str | None = None
    """Defaults to None (the job type)."""

    def __post_init__(self) -> None:
        low, high = RATE_LIMIT_RANGE
        if not low <= self.limit <= high:
            raise ValueError(f"limit must be between {low} and {high}, got {self.limit}")
        if not 0 < self.period_s <= RATE_PERIOD_MAX_S:
            raise ValueError(f"period_s must be in (0, {RATE_PERIOD_MAX_S:g}], "
                             f"got {self.period_s}")
        if self.key is not None and (not isinstance(self.key, str)
                                     or not 0 < len(self.key) <= MAX_KEY_LEN):
            raise ValueError(f"key must be a template string of 1 to {MAX_KEY_LEN} characters, "
                             f"got {self.key!r}")


@dataclass(frozen=True, slots=True)
class Scope:
    """The business entity a run is about, for ``app.runs_for_scope(entity, id)``.

    Example::

        Scope(entity="order", id_from=lambda i: str(i["order_id"]))
    """

    entity: str
    id_from: KeyFn


def template_of(key: KeyFn) -> str | None:
    return key if isinstance(key, str) else None


def key_for(key: KeyFn, input_: Any, what: str) -> str:
    """Compute a key from the input; a failure is the enqueuer's error, named."""
    try:
        value = key(input_) if callable(key) else _fill(key, input_)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise InvalidEnqueue(f"cannot compute the {what} key from the input: {exc!r}") from None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LEN:
        raise InvalidEnqueue(f"the {what} key must be a string of 1 to {MAX_KEY_LEN} characters, "
                             f"got {value!r}")
    return value


def _fill(template: str, input_: Any) -> str:
    if not isinstance(input_, Mapping):
        raise TypeError("a key template needs an object input")
    return template.format_map({k: v for k, v in input_.items() if isinstance(k, str)})


def check_dedupe_states(states: Sequence[str] | None, error: type[Exception]) -> None:
    """Dedupe states are a non-empty list of run statuses (``DedupePolicy(states=...)``)."""
    if states is None:
        return
    if isinstance(states, str) or not states or not set(states) <= set(RUN_STATUSES):
        raise error(f"dedupe states must be a non-empty list of run statuses "
                    f"({', '.join(RUN_STATUSES)}), got {states!r}")

