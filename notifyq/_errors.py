"""Errors raised by notifyq.

The tree, rooted at :class:`NotifyqError`::

    NotifyqError
    ├── ConfigError            a setting is missing or invalid (names the setting)
    ├── DatabaseUnavailable    the first connection failed (says why: refused, no such database…)
    ├── SchemaError            the database schema is missing, behind or ahead of this notifyq
    ├── InvalidEnqueue         refused at the edge; nothing was written
    │   ├── PayloadTooLarge    the serialized input exceeds the limit
    │   └── UnknownJobType     no worker has registered the type (also: a run's type has no
    │                          handler in the worker that claimed it)
    ├── ConcurrencyRejected    the concurrency key is busy and its policy is "reject"
    ├── RunFailed              an awaited run ended failed, timed_out or canceled
    │   └── ChildFailed        a child run awaited by ctx.wait_for did not complete
    ├── ResultTimeout          an awaited run did not finish in time (also a TimeoutError)
    ├── StepError              a step was misused (id used twice, output not JSON)
    ├── WaitTimeout            a durable wait (signal or children) passed its deadline
    ├── RunNotFound            no run with that id
    ├── UnknownStep            a replay names a step the run has not recorded
    ├── InvalidTransition      the run (or key version) is not in a state that allows it
    │   └── PromotionRefused   a live process does not hold the key version to promote
    ├── DecryptionFailed       a ciphertext does not decrypt (corrupted, or another row's)
    │   ├── UnknownKeyVersion  its key version is not configured here
    │   └── RetiredKeyVersion  its key version was retired
    ├── RotationInProgress     a key rotation to another version is still pending or running
    ├── InvalidEndpoint        a webhook endpoint (URL, headers, event types, secret) is refused
    ├── WebhookNotFound        no webhook endpoint or message with that id
    ├── ScheduleNotFound       no periodic schedule with that name
    │
    │   internal: raised and handled inside notifyq, never exported
    ├── LeaseLost              a fenced write-back matched no row (dropped, never retried)
    ├── CompleterClosedError   the worker stopped before a write-back was made
    ├── StaleWriters           a rotation keeps finding old key versions (its run retries)
    ├── BlockedAddress         a webhook destination is not public (an attempt's error kind)
    ├── ResolutionFailed       a webhook destination did not resolve (an attempt's error kind)
    └── BenchError             `notifyq bench` could not run, or lost or doubled a run

Handlers raise :class:`Permanent` (dead-letter at once) or :class:`Snooze` (run later, attempt
not counted); those are signals, not errors of notifyq.
"""

from __future__ import annotations


class NotifyqError(Exception):
    """Base class of every error notifyq raises."""


class ConfigError(NotifyqError):
    """A setting is missing or invalid; the message names it."""


class DatabaseUnavailable(NotifyqError):
    """The first connection to the database failed: the server is down or unreachable, the
    database or role does not exist, the password is wrong. The message gives the server's
    reason and never the password. A worker that is already running keeps reconnecting
    instead."""


class SchemaError(NotifyqError):
    """The database schema does not match this notifyq; the message says what to run."""


class InvalidEnqueue(NotifyqError, ValueError):
    """An enqueue was refused (at the edge, or by the SQL function); nothing was written."""


class PayloadTooLarge(InvalidEnqueue):
    """The input, serialized as JSON, is larger than the limit.

    Split the work into smaller runs, or store the data elsewhere and enqueue a reference.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"input is {size} bytes serialized; the limit is {limit} bytes")
        self.size = size
        self.limit = limit


class ConcurrencyRejected(NotifyqError):
    """The run's concurrency key already has its limit of active runs and the handler's
    ConcurrencyPolicy says ``collision="reject"``; nothing was enqueued."""


class RunFailed(NotifyqError):
    """An awaited run (``app.wait``, ``Run.result``) ended ``failed``, ``timed_out`` or
    ``canceled`` instead of completing.

    ``run_id``, ``job_type``, ``status`` and ``error`` (the stored ``{message, type, stack,
    retryable, attempt}``, or None) say what happened.
    """

    def __init__(self, run_id: object, job_type: str, status: str,
                 error: dict[str, object] | None, *, what: str = "run") -> None:
        reason = (error or {}).get("message", status)
        super().__init__(f"{what} {run_id} ({job_type}) ended {status}: {reason}")
        self.run_id = run_id
        self.job_type = job_type
        self.status = status
        self.error = error


class ChildFailed(RunFailed):
    """A child run that the parent waited for ended ``failed``, ``timed_out`` or ``canceled``.

    Catch it in the parent to decide what to do; ``child_id``, ``status`` and ``error`` say
    what happened.
    """

    def __init__(self, child_id: object, job_type: str, status: str,
                 error: dict[str, object] | None) -> None:
        super().__init__(child_id, job_type, status, error, what="child run")
        self.child_id = child_id


class ResultTimeout(NotifyqError, TimeoutError):
    """The awaited run did not finish within the timeout. It goes on running: wait again, or
    cancel it."""


class StepError(NotifyqError):
    """A durable step was misused: the same step id twice in one execution, or an output
    that is not JSON. Fix the handler; retrying would fail the same way."""


class WaitTimeout(NotifyqError):
    """A durable wait (signal or children) passed its deadline; the run ends ``timed_out``."""


class UnknownJobType(InvalidEnqueue):
    """No handler is registered for the job type.

    Raised by an enqueue once some worker has registered handlers (rows in ``notifyq.job``) but
    none for this type: check the type's spelling, or deploy its worker first. To enqueue it
    anyway (a producer deployed before its workers), pass ``allow_unknown_type=True`` or set
    ``NOTIFYQ_ENQUEUE__ALLOW_UNKNOWN_TYPES=true``. Also the error of a run claimed by a worker
    that has no handler for its type.
    """


class RunNotFound(NotifyqError, LookupError):
    """No run has that id (it may have been purged)."""


class UnknownStep(NotifyqError, LookupError):
    """The run has no recorded step with that id; the message lists the ones it has."""


class InvalidTransition(NotifyqError):
    """The run's current status does not allow the operation."""


class PromotionRefused(InvalidTransition):
    """A key version cannot be promoted: live processes do not hold it (``processes``: their
    id, role, host, pid and versions). Deploy the key to them and restart them, or wait until
    stopped ones expire; ``--force`` (``force=True``) promotes anyway, and those processes then
    refuse to encrypt and cannot read what is written under the new version."""

    def __init__(self, message: str, processes: list[dict[str, object]]) -> None:
        super().__init__(message)
        self.processes = processes


class LeaseLost(NotifyqError):
    """A fenced write-back matched no row: another worker owns the run now.

    Raised and handled inside notifyq; the write is dropped, never retried.
    """


class DecryptionFailed(NotifyqError):
    """A ciphertext did not decrypt: it was corrupted, truncated, or copied from another row or
    column (the associated data binds it to where it lives). Messages name the table, column and
    row, never key bytes or plaintext."""


class UnknownKeyVersion(DecryptionFailed):
    """The ciphertext names a key version this keyring does not hold: add that version to
    NOTIFYQ_KEYS (or the key file) as decrypt-only."""


class RetiredKeyVersion(DecryptionFailed):
    """The ciphertext names a key version that was retired (`notifyq keys retire`)."""


class RotationInProgress(NotifyqError):
    """A key rotation to another version is still pending or running; wait for it to finish
    (`notifyq keys rotate --wait`) or cancel its run first."""


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


class InvalidEndpoint(NotifyqError, ValueError):
    """A webhook endpoint was refused before anything was written; the message names the field
    (url, headers, event_types, secret) and why."""


class WebhookNotFound(NotifyqError, LookupError):
    """No webhook endpoint or message has that id."""


class ScheduleNotFound(NotifyqError, LookupError):
    """No periodic schedule has that name: ``notifyq schedules list`` shows the names (a
    schedule exists once a worker that declares it has started)."""


# -- internal ------------------------------------------------------------------------------


class CompleterClosedError(NotifyqError):
    """The completer stopped before this write could be made (the run's lease will expire)."""


class StaleWriters(NotifyqError):
    """Rows keep reappearing under old key versions: some writer still encrypts with an old
    version (a process that does not take the promoted version from the database, e.g. one of
    an older notifyq). The run's retry resumes."""


class BenchError(NotifyqError):
    """The benchmark could not run, or a drain did not complete every run exactly once."""


class BlockedAddress(NotifyqError):
    """A webhook destination resolves to an address that is not public. Allow its range
    explicitly with ``webhooks.allowed_networks`` if it is yours."""


class ResolutionFailed(NotifyqError):
    """The destination's hostname did not resolve."""
