"""notifyq: a PostgreSQL-backed job queue and durable-job runner.

Example::

    from notifyq import App, JobContext, RetryPolicy, Permanent

    app = App()

    @app.handler("email.send", retry=RetryPolicy(attempts=5))
    async def send_email(ctx: JobContext) -> dict:
        ...
"""

from notifyq._app import App
from notifyq._clock import Clock, ManualClock, SystemClock
from notifyq._context import JobContext
from notifyq._dispatch.retry import RetryPolicy
from notifyq._durable.policies import ConcurrencyPolicy, DedupePolicy, Scope
from notifyq._durable.session import ChildRun
from notifyq._enqueue.validate import EnqueueRequest
from notifyq._errors import (
    ChildFailed,
    ConcurrencyRejected,
    ConfigError,
    DatabaseUnavailable,
    DecryptionFailed,
    InvalidEnqueue,
    InvalidTransition,
    LeaseLost,
    NotifyqError,
    PayloadTooLarge,
    Permanent,
    RetiredKeyVersion,
    RotationInProgress,
    RunNotFound,
    SchemaError,
    Snooze,
    StepError,
    UnknownJobType,
    UnknownKeyVersion,
    WaitTimeout,
)
from notifyq._keys.columns import EncryptedColumn
from notifyq._keys.keyring import Keyring
from notifyq._run import Run, RunInfo, RunStatus
from notifyq._settings import Settings

__all__ = [
    "App",
    "ChildFailed",
    "ChildRun",
    "Clock",
    "ConcurrencyPolicy",
    "ConcurrencyRejected",
    "ConfigError",
    "DatabaseUnavailable",
    "DecryptionFailed",
    "DedupePolicy",
    "EncryptedColumn",
    "EnqueueRequest",
    "InvalidEnqueue",
    "InvalidTransition",
    "JobContext",
    "Keyring",
    "LeaseLost",
    "ManualClock",
    "NotifyqError",
    "PayloadTooLarge",
    "Permanent",
    "RetiredKeyVersion",
    "RetryPolicy",
    "RotationInProgress",
    "Run",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SchemaError",
    "Scope",
    "Settings",
    "Snooze",
    "StepError",
    "SystemClock",
    "UnknownJobType",
    "UnknownKeyVersion",
    "WaitTimeout",
]
