"""What every ``notifyq`` command shares: exit codes, the one-line-usage-error parser, loading
the user's App, one database session, and the way tables, times and JSON are printed.

Feature packages (``_keys``, ``_webhooks``) add their commands with these; the entry point in
``notifyq._cli.main`` assembles them. Nothing here imports a command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn

import anyio

from notifyq._app import App
from notifyq._db.pool import AsyncConn, connect_checked
from notifyq._errors import NotifyqError

EXIT_USAGE = 2
EXIT_ERROR = 1
EXIT_TIMEOUT = 124  # as timeout(1) exits


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line too (and names the help to read)."""

    def error(self, message: str) -> NoReturn:
        print(f"notifyq: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def load_app(target: str | None) -> App:
    """``MODULE:ATTR`` → the App it names; without one, a bare App from the environment.

    A command is not counted among the key holders (it lives a second; ``worker`` and
    ``serve`` set their role when they start)."""
    app = _import_app(target) if target else App()
    app._runtime.key_holder.role = None
    return app


def _import_app(target: str) -> App:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise NotifyqError(f"--app must look like MODULE:ATTR, got {target!r}")
    sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise NotifyqError(f"--app: cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise NotifyqError(f"--app: {target} is not a notifyq.App (got {type(app).__name__})")
    return app


def run_async(fn: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(fn)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=json_default, ensure_ascii=False))


def json_default(value: Any) -> str:
    return str(value)


@asynccontextmanager
async def session(app: App) -> AsyncIterator[AsyncConn]:
    """One autocommit connection to a migrated database."""
    from notifyq._db import migrate as migrations

    conn = await connect_checked(app._runtime.dsn(),
                                 application_name="notifyq-cli")
    async with conn:
        await migrations.require_current(conn, app.settings.schema_name)
        yield conn


def with_conn(fn: Callable[[App, AsyncConn], Awaitable[int]]) -> int:
    app = load_app(None)

    async def go() -> int:
        async with session(app) as conn:
            return await fn(app, conn)
    return run_async(go)


def when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])
