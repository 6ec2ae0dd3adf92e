"""Per-handler policies for durable runs, stored on the job definition so every enqueuer (other
processes, the SQL function, the HTTP API) sees them.

Keys are either a callable of the input or a template such as ``"order:{order_id}"`` (filled
from the input's top-level fields). Templates are stored and applied by the SQL function too;
callables only by Python enqueuers that registered the handler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from notifyq._enqueue.validate import DEDUPE_STATES, check_dedupe_states
from notifyq._errors import InvalidEnqueue

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
    if not isinstance(value, str) or not 0 < len(value) <= 512:
        raise InvalidEnqueue(f"the {what} key must be a string of 1 to 512 characters, "
                             f"got {value!r}")
    return value


def _fill(template: str, input_: Any) -> str:
    if not isinstance(input_, Mapping):
        raise TypeError("a key template needs an object input")
    return template.format_map({k: v for k, v in input_.items() if isinstance(k, str)})
