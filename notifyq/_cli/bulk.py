"""The run filter of the command line (``--status``, ``--type``, ``--pool``, ``--tag``,
``--tenant``, ``--created-after``, ``--created-before``), shared by ``runs list`` and the bulk
actions: ``notifyq runs cancel|retry|delete|reschedule`` with filter flags instead of a run id
count the matching runs first (``--dry-run`` stops there), then change them in batches, one
transaction each, printing progress on stderr."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from notifyq._app import App
from notifyq._console import print_json, with_conn
from notifyq._control import (
    BULK_BATCH,
    BULK_BATCH_MAX,
    BULK_STATUSES,
    COUNT_CAP,
    BulkAction,
    BulkOptions,
    BulkResult,
    RunFilter,
)
from notifyq._db.pool import AsyncConn
from notifyq._errors import InvalidTransition, NotifyqError
from notifyq._run import RunStatus

PAST = {"cancel": "canceled", "retry": "put back in line", "delete": "deleted",
        "reschedule": "rescheduled"}
FILTER_FLAGS = ("status", "job_type", "pool", "tag", "tenant", "created_after",
                 "created_before")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", help="one of " + ", ".join(s.value for s in RunStatus))
    parser.add_argument("--type", dest="job_type", metavar="TYPE")
    parser.add_argument("--pool")
    parser.add_argument("--tag")
    parser.add_argument("--tenant", metavar="ID")
    parser.add_argument("--created-after", metavar="ISO8601",
                        help="runs created at or after this time (with a UTC offset)")
    parser.add_argument("--created-before", metavar="ISO8601",
                        help="runs created before this time (with a UTC offset)")


def add_bulk_arguments(parser: argparse.ArgumentParser, action: BulkAction) -> None:
    """``[ID]`` plus the filter flags: one run, or every run the filter matches."""
    parser.add_argument("run_id", metavar="ID", nargs="?",
                        help="one run; without it, every run matching the filter flags")
    add_filter_arguments(parser)
    parser.add_argument("--all", action="store_true",
                        help="with no filter flag: every run the action applies to")
    parser.add_argument("--dry-run", action="store_true",
                        help="only count the runs the action applies to")
    parser.add_argument("--batch-size", default=str(BULK_BATCH), metavar="N",
                        help=f"runs per transaction, 1..{BULK_BATCH_MAX} (default {BULK_BATCH})")
    if action == "reschedule":
        parser.add_argument("--run-at", metavar="ISO8601",
                            help="the new run_at, with a UTC offset (e.g. 2030-01-01T09:00Z); "
                                 "required but with --dry-run")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_time(flag: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise NotifyqError(f"{flag} {text!r} is not an ISO 8601 time "
                           "(e.g. 2030-01-01T09:00:00+00:00)") from None
    if value.tzinfo is None:
        raise NotifyqError(f"{flag} {text!r} has no UTC offset; add one "
                           "(e.g. +00:00 or Z) so the time is unambiguous")
    return value.astimezone(UTC)


def filter_of(args: argparse.Namespace) -> RunFilter:
    """The filter flags as a :class:`RunFilter` (an error naming a bad flag)."""
    if args.status is not None and args.status not in set(RunStatus):
        raise NotifyqError(f"--status {args.status!r} is not a status: choose from "
                           + ", ".join(s.value for s in RunStatus))
    return RunFilter(status=args.status, job_type=args.job_type, pool=args.pool, tag=args.tag,
                     tenant_id=args.tenant,
                     created_after=parse_time("--created-after", args.created_after),
                     created_before=parse_time("--created-before", args.created_before))


def bulk_command(action: BulkAction, args: argparse.Namespace, run_id: UUID | None) -> int:
    """``runs ACTION`` by filter, or by one id for delete and reschedule (``run_id``)."""
    options = _options(action, args)
    filtered = any(getattr(args, name) is not None for name in FILTER_FLAGS)
    if run_id is not None and (filtered or args.all):
        raise NotifyqError("give a run ID or filter flags, not both")
    if run_id is None and not filtered and not args.all:
        raise NotifyqError(f"runs {action}: give a run ID, filter flags (--status, --type, "
                           "--pool, --tag, --tenant, --created-after, --created-before), or "
                           "--all")
    where = filter_of(args) if run_id is None else None

    async def go(app: App, conn: AsyncConn) -> int:
        control = app._control
        if run_id is not None:
            result = await control.bulk(conn, action, ids=[run_id],
                                        options=replace(options, progress=None))
            if not result.changed:
                run = await control.get(conn, run_id)
                raise InvalidTransition(f"cannot {action} run {run_id}: it is "
                                        f"{run.status.value} ({action} takes "
                                        f"{', '.join(BULK_STATUSES[action])} runs)")
            return _done(args, result, 1)
        assert where is not None  # noqa: S101 - no id: a filter
        matched = await control.count(conn, where, action)
        if args.dry_run or not matched:
            return _counted(args, action, matched)
        if not args.json:
            print(f"{_matched(matched)} to be {PAST[action]}", file=sys.stderr)
        result = await control.bulk(conn, action, where=where, options=options)
        return _done(args, result, matched)
    return with_conn(go)


def _options(action: BulkAction, args: argparse.Namespace) -> BulkOptions:
    try:
        size = int(args.batch_size)
    except ValueError:
        raise NotifyqError(f"--batch-size must be an integer, got {args.batch_size!r}") from None
    run_at = parse_time("--run-at", getattr(args, "run_at", None))
    progress = None if args.json else _progress(action)
    options = BulkOptions(run_at=run_at, batch_size=size, limit=None, progress=progress)
    if args.dry_run:
        return options  # a count takes no run_at
    try:
        options.check(action)
    except ValueError as exc:
        raise NotifyqError(str(exc).replace("batch size", "--batch-size")
                           .replace("needs run_at", "needs --run-at")) from None
    return options


def _progress(action: BulkAction) -> Any:
    def report(done: int) -> None:
        print(f"{PAST[action]} {done}", file=sys.stderr)
    return report


def _matched(n: int) -> str:
    return f"{COUNT_CAP} or more runs" if n >= COUNT_CAP else f"{n} run{'s' * (n != 1)}"


def _counted(args: argparse.Namespace, action: BulkAction, matched: int) -> int:
    if args.json:
        print_json({"action": action, "dry_run": True, "matched": matched})
    elif args.dry_run:
        print(f"{_matched(matched)} would be {PAST[action]}")
    else:
        print(f"no runs to {action}")
    return 0


def _done(args: argparse.Namespace, result: BulkResult, matched: int) -> int:
    if args.json:
        print_json({**result.to_json(), "dry_run": False, "matched": matched})
        return 0
    text = f"{PAST[result.action]} {result.changed} run{'s' * (result.changed != 1)}"
    if result.requested:
        text += f"; {result.requested} running asked to stop"
    print(f"{text} ({result.batches} batch{'es' * (result.batches != 1)})")
    return 0
