"""The ``notifyq`` command line. Errors are one line on stderr and a non-zero exit.

Exit codes: 0 success, 1 an error (bad value, unknown run, refused transition, database
problem), 2 a usage error (unknown flag, missing argument), 124 a ``--timeout`` ran out before
what was waited for ended (it goes on), 130 interrupted.

Commands that read or change runs open one connection (no pool, no worker machinery) and check
first that the schema is migrated, so a fresh database says "run `notifyq migrate`" instead of
failing on a missing table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn
from uuid import UUID

import anyio
import psycopg

from notifyq import _embedded as embedded
from notifyq._app import App
from notifyq._control import RunDetail, Stats
from notifyq._db.pool import AsyncConn, connect_checked, require_dsn
from notifyq._enqueue.validate import parse_input
from notifyq._errors import InvalidEnqueue, NotifyqError
from notifyq._run import Run, RunStatus

EXIT_USAGE = 2
EXIT_ERROR = 1
EXIT_TIMEOUT = 124  # as timeout(1) exits

LIST_LIMIT_MAX = 1000
SHOW_LIMIT = 1000  # most steps / children `runs show` prints


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line too (and names the help to read)."""

    def error(self, message: str) -> NoReturn:
        print(f"notifyq: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


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


# -- the parser ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="notifyq", description="notifyq: a PostgreSQL-backed job queue.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="COMMAND")

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

    _add_serve(sub)

    _add_enqueue(sub)
    _add_runs(sub)

    stats = sub.add_parser("stats", help="counts by status, type and pool; queue age per pool")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=cmd_stats)

    from notifyq._keys.commands import add_keys_parser
    add_keys_parser(sub)
    from notifyq._webhooks.commands import add_webhooks_parser
    add_webhooks_parser(sub)
    from notifyq._bench import add_arguments as add_bench_arguments
    bench = sub.add_parser("bench", help="measure enqueue, drain and wake latency on this machine")
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)
    return parser


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser("serve", help="worker + maintenance + admin HTTP API in one process")
    serve.add_argument("--host", help="address to bind (default api.host: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default api.port: 8080)")
    serve.add_argument("--app", help="MODULE:ATTR of your notifyq.App")
    serve.add_argument("--no-worker", dest="worker", action="store_false",
                       help="serve the API only")
    serve.add_argument("--no-api", dest="api", action="store_false",
                       help="run the worker only")
    serve.set_defaults(func=cmd_serve)


def _add_enqueue(sub: Any) -> None:
    enqueue = sub.add_parser("enqueue", help="enqueue one run and print its id")
    enqueue.add_argument("job_type", metavar="TYPE")
    enqueue.add_argument("--input", metavar="JSON|-",
                         help="the input as a JSON object or array; - reads it from stdin")
    enqueue.add_argument("--run-at", metavar="ISO8601",
                         help="not before this time, with a UTC offset (e.g. 2030-01-01T09:00Z)")
    enqueue.add_argument("--priority", metavar="N", help="lower runs first (-1000..1000)")
    enqueue.add_argument("--pool", metavar="P")
    enqueue.add_argument("--max-attempts", metavar="N")
    enqueue.add_argument("--dedupe-key", metavar="K",
                         help="return the existing run instead when one has this key")
    enqueue.add_argument("--tag", action="append", dest="tags", metavar="T",
                         help="repeat for several tags")
    enqueue.add_argument("--allow-unknown-type", action="store_true", default=None,
                         help="enqueue even if no worker has registered TYPE yet")
    enqueue.add_argument("--json", action="store_true", help="print the run as JSON")
    enqueue.set_defaults(func=cmd_enqueue)


def _add_runs(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list, show, cancel and retry runs")
    actions = runs.add_subparsers(dest="action", required=True, parser_class=_Parser,
                                  metavar="list|show|cancel|retry")

    listing = actions.add_parser("list", help="newest runs first")
    listing.add_argument("--status", help="one of " + ", ".join(s.value for s in RunStatus))
    listing.add_argument("--type", dest="job_type", metavar="TYPE")
    listing.add_argument("--pool")
    listing.add_argument("--tag")
    listing.add_argument("--limit", default="50", metavar="N",
                         help=f"at most N runs, 1..{LIST_LIMIT_MAX} (default 50)")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    listing.set_defaults(func=cmd_runs_list)

    for name, func, text in (("show", cmd_runs_show, "one run, with input, output and error, "
                              "its step timeline and its children"),
                             ("cancel", cmd_runs_cancel,
                              "cancel a pending/waiting run; ask a running one to stop"),
                             ("retry", cmd_runs_retry,
                              "put a failed, canceled or timed-out run back in line")):
        action = actions.add_parser(name, help=text)
        action.add_argument("run_id", metavar="ID")
        action.add_argument("--json", action="store_true", help="print the run as JSON")
        action.set_defaults(func=func)


# -- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging()
    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BaseException as raised:  # every failure becomes one line, never a traceback
        exc = _unwrap(raised)
        if isinstance(exc, KeyboardInterrupt):
            return 130
        if isinstance(exc, SystemExit):
            raise
        print(f"notifyq: error: {_describe(exc)}", file=sys.stderr)
        return EXIT_ERROR
    return result


def _unwrap(exc: BaseException) -> BaseException:
    """The one error inside (nested) exception groups from anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, NotifyqError | ValueError):
        return _first_line(exc)
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction
                  | psycopg.errors.InvalidSchemaName):
        return f"the database is not migrated ({_first_line(exc)}): run `notifyq migrate`"
    if isinstance(exc, psycopg.OperationalError):
        return f"cannot reach the database: {_first_line(exc)}"
    if isinstance(exc, psycopg.Error):
        return f"database error: {_first_line(exc)}"
    if isinstance(exc, OSError):
        return _first_line(exc)
    return f"unexpected {type(exc).__name__}: {_first_line(exc)} (please report this)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _setup_logging() -> None:
    from notifyq._logs import configure
    from notifyq._settings import load_settings
    try:
        settings = load_settings()
    except NotifyqError:
        configure()
        return
    configure(settings.log_level, settings.log_format)


def run_async(fn: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(fn)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=_json_default, ensure_ascii=False))


def _json_default(value: Any) -> str:
    return str(value)


# -- migrate, worker -------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    from notifyq._db import migrate as migrations

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
    with embedded.database_for(app, migrate=False):
        return run_async(go)


def cmd_worker(args: argparse.Namespace) -> int:
    app = load_app(args.app)

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

    app = load_app(args.app)
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


# -- one connection for the run commands -----------------------------------------------------


@asynccontextmanager
async def _session(app: App) -> AsyncIterator[AsyncConn]:
    """One autocommit connection to a migrated database."""
    from notifyq._db import migrate as migrations

    conn = await connect_checked(require_dsn(app.settings.database_url),
                                 application_name="notifyq-cli")
    async with conn:
        await migrations.require_current(conn, app.settings.schema_name)
        yield conn


def _with_conn(fn: Callable[[App, AsyncConn], Awaitable[int]]) -> int:
    app = load_app(None)

    async def go() -> int:
        async with _session(app) as conn:
            return await fn(app, conn)
    return run_async(go)


# -- enqueue ---------------------------------------------------------------------------------


def cmd_enqueue(args: argparse.Namespace) -> int:
    options = _enqueue_options(args)

    async def go(app: App, conn: AsyncConn) -> int:
        # On the caller's connection the NOTIFY goes out in the enqueue's own transaction.
        run = await app.enqueue(args.job_type, **options, conn=conn)
        if args.json:
            _print_json(run.to_json())
        else:
            print(run.id)
        return 0
    return _with_conn(go)


def _enqueue_options(args: argparse.Namespace) -> dict[str, Any]:
    """Everything but the type, checked before a connection is opened."""
    return {
        "input": _read_input(args.input),
        "run_at": _parse_run_at(args.run_at),
        "priority": _parse_int("--priority", args.priority),
        "pool": args.pool,
        "max_attempts": _parse_int("--max-attempts", args.max_attempts),
        "dedupe_key": args.dedupe_key,
        "tags": args.tags,
        "allow_unknown_type": args.allow_unknown_type,
    }


def _read_input(text: str | None) -> Any:
    if text is None:
        return {}
    if text == "-":
        text = sys.stdin.read()
    try:
        return parse_input(text)
    except InvalidEnqueue as exc:
        raise InvalidEnqueue(f"--input: {exc}") from None


def _parse_run_at(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidEnqueue(f"--run-at {text!r} is not an ISO 8601 time "
                             "(e.g. 2030-01-01T09:00:00+00:00)") from None
    if value.tzinfo is None:
        raise InvalidEnqueue(f"--run-at {text!r} has no UTC offset; add one "
                             "(e.g. +00:00 or Z) so the time is unambiguous")
    return value.astimezone(UTC)


def _parse_int(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidEnqueue(f"{flag} must be an integer, got {text!r}") from None


# -- runs ------------------------------------------------------------------------------------


def cmd_runs_list(args: argparse.Namespace) -> int:
    if args.status is not None and args.status not in set(RunStatus):
        raise NotifyqError(f"--status {args.status!r} is not a status: choose from "
                           + ", ".join(s.value for s in RunStatus))
    limit = _parse_int("--limit", args.limit)
    assert limit is not None  # noqa: S101 - the flag has a default
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise NotifyqError(f"--limit must be between 1 and {LIST_LIMIT_MAX}, got {limit}")

    async def go(app: App, conn: AsyncConn) -> int:
        runs = await app.runs.list_runs(conn, status=args.status, job_type=args.job_type,
                                        pool=args.pool, tag=args.tag, limit=limit)
        if args.json:
            _print_json([r.to_json() for r in runs])
        else:
            print(_runs_table(runs, await app.webhooks.tries(runs, conn=conn)))
        return 0
    return _with_conn(go)


def cmd_runs_show(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)

    async def go(app: App, conn: AsyncConn) -> int:
        detail = await app.runs.detail(conn, run_id, limit=SHOW_LIMIT)
        if args.json:
            _print_json(detail.to_json())
        else:
            print("\n".join(_run_details(detail.run)))
            print("\n".join(_timeline(detail)))
        return 0
    return _with_conn(go)


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)

    async def go(app: App, conn: AsyncConn) -> int:
        run = await app.runs.cancel(conn, run_id)
        if args.json:
            _print_json(run.to_json())
        elif run.status is RunStatus.RUNNING:
            print(f"cancel requested: run {run.id} is running; its worker will stop it")
        else:
            print(f"canceled run {run.id}")
        return 0
    return _with_conn(go)


def cmd_runs_retry(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)

    async def go(app: App, conn: AsyncConn) -> int:
        run = await app.runs.retry(conn, run_id)
        if args.json:
            _print_json(run.to_json())
        else:
            print(f"run {run.id} is pending again (attempt {run.attempts + 1} "
                  f"of {run.max_attempts})")
        return 0
    return _with_conn(go)


def _parse_run_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise NotifyqError(f"not a run id (UUID): {text!r}") from None


_LIST_COLUMNS = ("ID", "TYPE", "STATUS", "POOL", "PRIO", "TRIES", "RUN AT", "CREATED")


def _runs_table(runs: list[Run], tries: dict[UUID, tuple[int, int]]) -> str:
    """``tries`` overrides a run's TRIES (a webhook run's delivery attempts, see
    ``Webhooks.tries``)."""
    if not runs:
        return "no runs"
    rows = [[str(r.id), r.job_type, r.status.value, r.pool, str(r.priority),
             "{}/{}".format(*tries.get(r.id, (r.attempts, r.max_attempts))), _when(r.run_at),
             _when(r.created_at)]
            for r in runs]
    return _table(_LIST_COLUMNS, rows)


def _run_details(run: Run) -> Iterator[str]:
    data = run.to_json()
    for name in ("input", "output", "error"):
        data.pop(name)
    width = max(len(k) for k in data)
    for key, value in data.items():
        if value is not None and value != []:
            yield f"{key:<{width}}  {value}"
    for name in ("input", "output", "error"):
        value = getattr(run, name)
        if value is not None:
            yield f"{name}:"
            text = json.dumps(value, indent=2, ensure_ascii=False, default=_json_default)
            yield from ("  " + line for line in text.splitlines())


_STEP_COLUMNS = ("SEQ", "STEP", "KIND", "STATUS", "TRIES", "DURATION", "MEMOIZED")
_CHILD_COLUMNS = ("ID", "TYPE", "STATUS")


def _timeline(detail: RunDetail) -> Iterator[str]:
    """The steps in execution order and the children, as tables after the run's fields."""
    if detail.steps:
        rows = [[str(s["seq"]), s["step_id"], s["kind"], s["status"], str(s["attempts"]),
                 _duration(s["duration_s"]), "yes" if s["memoized"] else "no"]
                for s in detail.steps]
        yield f"steps ({len(rows)}):"
        yield from ("  " + line for line in _table(_STEP_COLUMNS, rows).splitlines())
    if detail.children:
        rows = [[str(c.id), c.job_type, c.status.value] for c in detail.children]
        yield f"children ({len(rows)}):"
        yield from ("  " + line for line in _table(_CHILD_COLUMNS, rows).splitlines())


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f}ms" if seconds < 1 else _age(seconds)


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


# -- stats -----------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        stats = await app.runs.stats(conn)
        summary = summarize(stats)
        if args.json:
            _print_json(summary)
        else:
            print(_stats_text(summary))
        return 0
    return _with_conn(go)


def summarize(stats: Stats) -> dict[str, Any]:
    """Counts folded by status, by type and by pool, plus the per-pool queue age."""
    by_status: dict[str, int] = {}
    by_type: dict[str, dict[str, int]] = {}
    by_pool: dict[str, dict[str, int]] = {}
    for row in stats.counts:
        status, count = row["status"], int(row["count"])
        by_status[status] = by_status.get(status, 0) + count
        for key, fold in ((row["job_type"], by_type), (row["pool"], by_pool)):
            per = fold.setdefault(key, {})
            per[status] = per.get(status, 0) + count
    runnable = [{"pool": r["pool"], "runnable": int(r["runnable"]),
                 "oldest_age_s": round(float(r["oldest_age_s"]), 3)} for r in stats.runnable]
    return {"total": sum(by_status.values()), "by_status": by_status, "by_type": by_type,
            "by_pool": by_pool, "runnable": runnable}


def _stats_text(summary: dict[str, Any]) -> str:
    if not summary["total"]:
        return "no runs"
    statuses = [s.value for s in RunStatus if s.value in summary["by_status"]]
    parts = [f"{summary['total']} runs: " + ", ".join(
        f"{summary['by_status'][s]} {s}" for s in statuses)]
    for title, fold in (("TYPE", summary["by_type"]), ("POOL", summary["by_pool"])):
        rows = [[name, *(str(per.get(s, 0)) for s in statuses), str(sum(per.values()))]
                for name, per in sorted(fold.items())]
        parts.append(_table([title, *(s.upper() for s in statuses), "TOTAL"], rows))
    if summary["runnable"]:
        rows = [[r["pool"], str(r["runnable"]), _age(r["oldest_age_s"])]
                for r in summary["runnable"]]
        parts.append(_table(["POOL", "RUNNABLE NOW", "OLDEST WAITING"], rows))
    else:
        parts.append("nothing runnable now")
    return "\n\n".join(parts)


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


# -- bench -----------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    from notifyq._bench import run_bench

    return run_bench(args)
