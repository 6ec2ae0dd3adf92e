"""notifyq: a PostgreSQL-backed job queue and durable-job runner.

Example::

    from notifyq import App, JobContext, RetryPolicy, Permanent

    app = App()

    @app.handler("email.send", retry=RetryPolicy(attempts=5))
    async def send_email(ctx: JobContext) -> dict:
        ...

Everything a user needs is imported from here; the modules behind it (``notifyq._*``) are
private and may change in any release.
"""


from notifyq._app import App
from notifyq._clock import Clock, ManualClock, SystemClock
from notifyq._context import JobContext
from notifyq._control import Stats
from notifyq._crypto.keyring import Keyring
from notifyq._durable.session import ChildRun
from notifyq._enqueue.request import EnqueueRequest
from notifyq._errors import (
    ChildFailed,
    ConcurrencyRejected,
    ConfigError,
    DatabaseUnavailable,
    DecryptionFailed,
    InvalidEndpoint,
    InvalidEnqueue,
    InvalidTransition,
    NotifyqError,
    PayloadTooLarge,
    Permanent,
    PromotionRefused,
    ResultTimeout,
    RetiredKeyVersion,
    RotationInProgress,
    RunFailed,
    RunNotFound,
    ScheduleNotFound,
    SchemaError,
    Snooze,
    StepError,
    UnknownJobType,
    UnknownKeyVersion,
    UnknownStep,
    WaitTimeout,
    WebhookNotFound,
)
from notifyq._keys.columns import EncryptedColumn
from notifyq._policies import ConcurrencyPolicy, DedupePolicy, RateLimit, RetryPolicy, Scope
from notifyq._run import Run, RunInfo, RunStatus
from notifyq._settings import Settings
from notifyq._version import VERSION as _VERSION
from notifyq._webhooks.endpoints import Endpoint
from notifyq._webhooks.service import SentMessage, WebhookMessage

__version__ = _VERSION

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
    "Endpoint",
    "EnqueueRequest",
    "InvalidEndpoint",
    "InvalidEnqueue",
    "InvalidTransition",
    "JobContext",
    "Keyring",
    "ManualClock",
    "NotifyqError",
    "PayloadTooLarge",
    "Permanent",
    "PromotionRefused",
    "RateLimit",
    "ResultTimeout",
    "RetiredKeyVersion",
    "RetryPolicy",
    "RotationInProgress",
    "Run",
    "RunFailed",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "ScheduleNotFound",
    "SchemaError",
    "Scope",
    "SentMessage",
    "Settings",
    "Snooze",
    "Stats",
    "StepError",
    "SystemClock",
    "UnknownJobType",
    "UnknownKeyVersion",
    "UnknownStep",
    "WaitTimeout",
    "WebhookMessage",
    "WebhookNotFound",
    "__version__",
]
