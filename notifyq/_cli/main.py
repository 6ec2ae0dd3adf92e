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
import sys
from collections.abc import Sequence

import psycopg

from notifyq._cli.pause import add_pause_commands
from notifyq._cli.process import add_bench_command, add_process_commands
from notifyq._cli.runs import add_run_commands
from notifyq._cli.schedules import add_schedule_commands
from notifyq._console import EXIT_ERROR, Parser
from notifyq._errors import NotifyqError
from notifyq._keys.commands import add_keys_parser
from notifyq._version import VERSION
from notifyq._webhooks.commands import add_webhooks_parser

# -- the parser ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="notifyq", description="notifyq: a PostgreSQL-backed job queue.")
    parser.add_argument("--version", action="version", version=f"notifyq {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser,
                                metavar="COMMAND")
    add_process_commands(sub)
    add_run_commands(sub)
    add_schedule_commands(sub)
    add_pause_commands(sub)
    add_keys_parser(sub)
    add_webhooks_parser(sub)
    add_bench_command(sub)
    return parser


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


