"""A worker's app for the dashboard's operations tests, in pool ``gated`` (which ``serve``
does not claim from): runs that block until a file exists."""

from __future__ import annotations

import time
from pathlib import Path

from notifyq import App, JobContext

app = App()


@app.handler("ui.gate", pool="gated")
def gate(ctx: JobContext) -> None:  # sync: runs in a thread
    while not Path(ctx.input["gate"]).exists():
        time.sleep(0.05)
