"""The ``notifyq`` command line. Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import psycopg

from notifyq.app import App
from notifyq.errors import NotifyqError

EXIT_USAGE = 2
EXIT_ERROR = 1


def load_app(target: str | None) -> App:
    """``MODULE:ATTR`` → the App it names; without one, a bare App from the environment."""
    if not target:
        return App()
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="notifyq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    migrate = sub.add_parser("migrate", help="apply pending migrations")
    migrate.add_argument("--check", action="store_true",
                         help="exit 1 when the database is behind (or ahead), apply nothing")
    migrate.set_defaults(func=cmd_migrate)

    worker = sub.add_parser("worker", help="run a worker until SIGTERM/SIGINT")
    worker.add_argument("--app", help="MODULE:ATTR of your notifyq.App")
    worker.add_argument("--concurrency", type=int)
    worker.add_argument("--pool", action="append", dest="pools")
    worker.add_argument("--burst", action="store_true",
                        help="drain what is runnable now, then exit 0")
    worker.set_defaults(func=cmd_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging()
    try:
        result: int = args.func(args)
    except (NotifyqError, ValueError) as exc:
        print(f"notifyq: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"notifyq: error: cannot reach the database: {first}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return result


def _setup_logging() -> None:
    from notifyq.settings import load_settings
    try:
        level = load_settings().log_level
    except NotifyqError:
        level = "INFO"
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_async(fn: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(fn)


def cmd_migrate(args: argparse.Namespace) -> int:
    from notifyq.db import migrate as migrations

    app = load_app(None)

    async def go() -> int:
        async with app:
            async with (await app.pool()).connection() as conn:
                if args.check:
                    state = await migrations.state(conn, app.settings.schema_name)
                    if state.current:
                        print("schema is current")
                        return 0
                    await migrations.require_current(conn, app.settings.schema_name)
                    return EXIT_ERROR
            applied = await app.migrate()
        print("applied: " + ", ".join(applied) if applied else "nothing to apply")
        return 0
    return run_async(go)


def cmd_worker(args: argparse.Namespace) -> int:
    app = load_app(args.app)

    async def go() -> int:
        async with app, anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            await app.run_worker(concurrency=args.concurrency, pools=args.pools,
                                 burst=args.burst)
            tg.cancel_scope.cancel()
        return 0
    return run_async(go)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            logging.getLogger("notifyq").info("received %s: shutting down",
                                              signal.Signals(signum).name)
            scope.cancel()
            return


def _json_default(value: Any) -> str:
    return str(value)
