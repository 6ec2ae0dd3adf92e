"""Errors raised by notifyq.

The tree, rooted at :class:`NotifyqError`::

    NotifyqError
    ├── ConfigError            a setting is missing or invalid (names the setting)
    ├── SchemaError            the database schema is missing, behind or ahead of this notifyq
    ├── InvalidEnqueue         refused at the edge; nothing was written
    │   └── PayloadTooLarge    the serialized input exceeds the limit
    ├── UnknownJobType         no handler is registered for a run's type
    ├── RunNotFound            no run with that id
    ├── InvalidTransition      the run is not in a state that allows the operation
    └── LeaseLost              internal: a fenced write-back matched no row

Handlers raise :class:`Permanent` (dead-letter at once) or :class:`Snooze` (run later, attempt
not counted); those are signals, not errors of notifyq.
"""

from __future__ import annotations


class NotifyqError(Exception):
    """Base class of every error notifyq raises."""


class ConfigError(NotifyqError):
    """A setting is missing or invalid; the message names it."""


class SchemaError(NotifyqError):
    """The database schema does not match this notifyq; the message says what to run."""


class InvalidEnqueue(NotifyqError, ValueError):
    """An enqueue was refused before anything reached the database."""


class PayloadTooLarge(InvalidEnqueue):
    """The input, serialized as JSON, is larger than the limit.

    Split the work into smaller runs, or store the data elsewhere and enqueue a reference.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"input is {size} bytes serialized; the limit is {limit} bytes")
        self.size = size
        self.limit = limit


class UnknownJobType(NotifyqError):
    """A run's type has no registered handler in this worker."""


class RunNotFound(NotifyqError, LookupError):
    """No run has that id (it may have been purged)."""


class InvalidTransition(NotifyqError):
    """The run's current status does not allow the operation."""


class LeaseLost(NotifyqError):
    """A fenced write-back matched no row: another worker owns the run now.

    Raised and handled inside notifyq; the write is dropped, never retried.
    """


class Permanent(Exception):
    """Raise from a handler to dead-letter the run at once, without retrying.

    Example::

        raise Permanent(ValueError("no such customer"))
    """

    def __init__(self, error: BaseException | str) -> None:
        self.error = error if isinstance(error, BaseException) else ValueError(error)
        super().__init__(str(self.error))


class Snooze(Exception):
    """Raise from a handler to run again after ``seconds`` without using up an attempt.

    Example::

        if not upstream_ready():
            raise Snooze(30)
    """

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"snooze seconds must not be negative, got {seconds}")
        self.seconds = seconds
        super().__init__(f"snoozed for {seconds} s")
