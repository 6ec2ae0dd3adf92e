"""What a handler receives: ``ctx.input``, ``ctx.run`` and a logger bound to the run."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from notifyq.run import RunInfo


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the run id and type to every record (as ``extra`` and in the message)."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = self.extra or {}
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[{extra['run_type']} {extra['run_id']}] {msg}", kwargs


class JobContext:
    """The handler's view of the run it executes.

    Example::

        @app.handler("email.send")
        async def send_email(ctx: JobContext) -> dict:
            ctx.log.info("sending to %s", ctx.input["to"])
            return {"sent": True, "attempt": ctx.run.attempt}
    """

    __slots__ = ("_cancel_requested", "input", "log", "run")

    def __init__(self, run: RunInfo, input: Any) -> None:
        self.run = run
        self.input = input
        self.log = RunLogger(logging.getLogger("notifyq.run"),
                             {"run_id": str(run.id), "run_type": run.job_type})
        self._cancel_requested = False

    @property
    def cancel_requested(self) -> bool:
        """True once a cancel was asked for; sync handlers can poll it to stop early."""
        return self._cancel_requested
