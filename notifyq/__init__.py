"""notifyq: a PostgreSQL-backed job queue and durable-job runner.

Example::

    from notifyq import App, JobContext, RetryPolicy, Permanent

    app = App()

    @app.handler("email.send", retry=RetryPolicy(attempts=5))
    async def send_email(ctx: JobContext) -> dict:
        ...
"""

from notifyq.app import App
from notifyq.clock import Clock, ManualClock, SystemClock
from notifyq.context import JobContext
from notifyq.crypto.columns import EncryptedColumn
from notifyq.crypto.keyring import Keyring
from notifyq.dispatch.retry import RetryPolicy
from notifyq.durable.policies import ConcurrencyPolicy, DedupePolicy, Scope
from notifyq.durable.session import ChildRun
from notifyq.enqueue import EnqueueRequest
from notifyq.errors import (
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
from notifyq.run import Run, RunInfo, RunStatus
from notifyq.settings import Settings

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
