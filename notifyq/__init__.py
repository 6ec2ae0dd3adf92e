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
from notifyq.dispatch.retry import RetryPolicy
from notifyq.enqueue import EnqueueRequest
from notifyq.errors import (
    ConfigError,
    InvalidEnqueue,
    InvalidTransition,
    LeaseLost,
    NotifyqError,
    PayloadTooLarge,
    Permanent,
    RunNotFound,
    SchemaError,
    Snooze,
    UnknownJobType,
)
from notifyq.run import Run, RunInfo, RunStatus
from notifyq.settings import Settings

__all__ = [
    "App",
    "Clock",
    "ConfigError",
    "EnqueueRequest",
    "InvalidEnqueue",
    "InvalidTransition",
    "JobContext",
    "LeaseLost",
    "ManualClock",
    "NotifyqError",
    "PayloadTooLarge",
    "Permanent",
    "RetryPolicy",
    "Run",
    "RunInfo",
    "RunNotFound",
    "RunStatus",
    "SchemaError",
    "Settings",
    "Snooze",
    "SystemClock",
    "UnknownJobType",
]
