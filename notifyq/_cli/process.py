"""The commands that run notifyq itself: ``migrate``, ``worker``, ``serve`` and ``bench``.
Without ``NOTIFYQ_DATABASE_URL`` the first three run on the embedded PostgreSQL."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

import anyio

from notifyq import _embedded as embedded
from notifyq._app import App
from notifyq._console import (
    EXIT_ERROR,
    load_app,
    run_async,
)


def add_process_commands(sub: Any) -> None:
    migrate = sub.add_parser("migrate", help="apply pending migrations")
    migrate.add_argument("--check", action="store_true",
                         help="exit 1 when the database is behind (or ahead), apply nothing")
    _add_data_dir(migrate)
    migrate.set_defaults(func=cmd_migrate)

    worker = sub.add_parser("worker", help="run a worker until SIGTERM/SIGINT")
    worker.add_argument("--app", help="MODULE:ATTR of your notifyq.App")
    worker.add_argument("--concurrency", type=int)
    worker.add_argument("--pool", action="append", dest="pools")
    worker.add_argument("--burst", action="store_true",
                        help="drain what is runnable now, then exit 0")
    _add_data_dir(worker)
    worker.set_defaults(func=cmd_worker)
    _add_serve(sub)


def add_bench_command(sub: Any) -> None:
    from notifyq._bench import add_arguments  # the bench's own imports load only for it

    bench = sub.add_parser("bench", help="measure enqueue, drain and wake latency on this machine")
    add_arguments(bench)
    bench.set_defaults(func=cmd_bench)


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser("serve", help="worker + maintenance + admin HTTP API in one process")
    serve.add_argument("--host", help="address to bind (default api.host: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default api.port: 8080)")
    serve.add_argument("--app", help="MODULE:ATTR of your notifyq.App")
    serve.add_argument("--no-worker", dest="worker", action="store_false",
                       help="serve the API only")
    serve.add_argument("--no-api", dest="api", action="store_false",
                       help="run the worker only")
    _add_data_dir(serve)
    serve.set_defaults(func=cmd_serve)


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="where the embedded PostgreSQL keeps its data when no "
                        "database URL is set (embedded.data_dir; the other commands find the "
                        "server there through NOTIFYQ_EMBEDDED__DATA_DIR)")


def _load(args: argparse.Namespace, target: str | None) -> App:
    """The App of a command that may start the embedded PostgreSQL, with ``--data-dir``."""
    app = load_app(target)
    if args.data_dir:
        embedded_settings = app.settings.embedded.model_copy(update={"data_dir": args.data_dir})
        app.settings = app.settings.model_copy(update={"embedded": embedded_settings})
    return app


def cmd_migrate(args: argparse.Namespace) -> int:
    from notifyq._db import migrate as migrations

    app = _load(args, None)

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
    with embedded.database_for(app, migrate=False):
        return run_async(go)


def cmd_worker(args: argparse.Namespace) -> int:
    app = _load(args, args.app)

    async def go() -> int:
        async with app, anyio.create_task_group() as tg:
            with anyio.CancelScope() as worker_scope:
                tg.start_soon(_stop_on_signal, worker_scope)
                await app.run_worker(concurrency=args.concurrency, pools=args.pools,
                                     burst=args.burst)
            tg.cancel_scope.cancel()
        return 0
    with embedded.database_for(app):
        code = run_async(go)
    return _exit_past_hung_threads(code)


def cmd_serve(args: argparse.Namespace) -> int:
    from notifyq._service import ServeOptions, serve

    app = _load(args, args.app)
    with embedded.database_for(app) as server:
        # A generated admin token lives beside the embedded PostgreSQL's data directory.
        options = ServeOptions(host=args.host, port=args.port, worker=args.worker,
                               api=args.api, token_dir=server.data_dir.parent if server else None)
        code = run_async(lambda: serve(app, options))
    return _exit_past_hung_threads(code)


def _exit_past_hung_threads(code: int) -> int:
    """A sync handler that ignored its timeout or shutdown keeps its (non-daemon) thread;
    Python would wait for it at exit forever and the worker would never stop. Its run was
    already written back or released, so leave without waiting."""
    hung = [t for t in threading.enumerate()
            if t is not threading.current_thread() and t.is_alive() and not t.daemon]
    if not hung:
        return code
    logging.getLogger("notifyq").warning(
        "%d handler thread(s) still running after shutdown; exiting without them", len(hung))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    """The first SIGTERM/SIGINT starts the graceful shutdown; later ones are only logged, so an
    impatient second signal cannot kill the worker before it releases its runs."""
    log = logging.getLogger("notifyq")
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if scope.cancel_called:
                log.warning("received %s again: still shutting down (releasing runs)",
                            signal.Signals(signum).name)
                continue
            log.info("received %s: shutting down", signal.Signals(signum).name)
            scope.cancel()


def cmd_bench(args: argparse.Namespace) -> int:
    from notifyq._bench import run_bench

    return run_bench(args)
