"""``notifyq enqueue``, ``notifyq runs list|show|cancel|retry|replay|delete|reschedule`` and
``notifyq stats``: one connection each (no pool, no worker machinery), to a database checked
to be migrated."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

from notifyq._app import App
from notifyq._cli.bulk import (
    FILTER_FLAGS,
    add_bulk_arguments,
    add_filter_arguments,
    bulk_command,
    filter_of,
    parse_time,
)
from notifyq._console import (
    Parser,
    json_default,
    print_json,
    table,
    when,
    with_conn,
)
from notifyq._control import BulkAction, RunDetail, Stats
from notifyq._db.pool import AsyncConn
from notifyq._enqueue.validate import parse_input
from notifyq._errors import InvalidEnqueue, NotifyqError
from notifyq._run import Run, RunStatus
from notifyq._webhooks.service import delivery_tries

LIST_LIMIT_MAX = 1000


SHOW_LIMIT = 1000  # most steps / children `runs show` prints


def add_run_commands(sub: Any) -> None:
    _add_enqueue(sub)
    _add_runs(sub)
    stats = sub.add_parser("stats", help="counts by status, type and pool; queue age per pool")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=cmd_stats)
    workers = sub.add_parser("workers", help="the workers alive (the registry) and the leader")
    workers.add_argument("--json", action="store_true", help="print JSON")
    workers.set_defaults(func=cmd_workers)


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
    runs = sub.add_parser(
        "runs", help="list, show, cancel, retry, replay, delete and reschedule runs")
    actions = runs.add_subparsers(dest="action", required=True, parser_class=Parser,
                                  metavar="list|show|cancel|retry|replay|delete|reschedule")

    listing = actions.add_parser("list", help="newest runs first")
    add_filter_arguments(listing)
    listing.add_argument("--limit", default="50", metavar="N",
                         help=f"at most N runs, 1..{LIST_LIMIT_MAX} (default 50)")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    listing.set_defaults(func=cmd_runs_list)

    show = actions.add_parser("show", help="one run, with input, output and error, its step "
                              "timeline and its children")
    show.add_argument("run_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the run as JSON")
    show.set_defaults(func=cmd_runs_show)

    bulk: list[tuple[BulkAction, Callable[[argparse.Namespace], int], str]] = [
            ("cancel", cmd_runs_cancel, "cancel a pending/waiting run; ask a running one to "
             "stop (or all matching the filter flags)"),
            ("retry", cmd_runs_retry, "put a failed, canceled or timed-out run back in line "
             "(or all matching the filter flags)"),
            ("delete", cmd_runs_delete, "delete a finished run (or all matching the filter "
             "flags)"),
            ("reschedule", cmd_runs_reschedule, "move a pending run to --run-at (or all "
             "matching the filter flags)")]
    for name, func, text in bulk:
        action = actions.add_parser(name, help=text)
        add_bulk_arguments(action, name)
        action.set_defaults(func=func)

    replay = actions.add_parser("replay", help="run a finished durable run again from a step, "
                                "reusing the steps recorded before it")
    replay.add_argument("run_id", metavar="ID")
    replay.add_argument("--from-step", required=True, metavar="STEP",
                        help="the step id to run again from (see `notifyq runs show ID`)")
    replay.add_argument("--json", action="store_true", help="print the run as JSON")
    replay.set_defaults(func=cmd_runs_replay)


def cmd_enqueue(args: argparse.Namespace) -> int:
    options = _enqueue_options(args)

    async def go(app: App, conn: AsyncConn) -> int:
        # On the caller's connection the NOTIFY goes out in the enqueue's own transaction.
        run = await app.enqueue(args.job_type, **options, conn=conn)
        if args.json:
            print_json(run.to_json())
        else:
            print(run.id)
        return 0
    return with_conn(go)


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
    return parse_time("--run-at", text)


def _parse_int(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidEnqueue(f"{flag} must be an integer, got {text!r}") from None


def cmd_runs_list(args: argparse.Namespace) -> int:
    where = filter_of(args)
    limit = _parse_int("--limit", args.limit)
    assert limit is not None  # noqa: S101 - the flag has a default
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise NotifyqError(f"--limit must be between 1 and {LIST_LIMIT_MAX}, got {limit}")

    async def go(app: App, conn: AsyncConn) -> int:
        runs = await app._control.list_filtered(conn, where, limit=limit)
        if args.json:
            print_json([r.to_json() for r in runs])
        else:
            print(_runs_table(runs, await delivery_tries(app._runtime, runs, conn=conn)))
        return 0
    return with_conn(go)


def cmd_runs_show(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)

    async def go(app: App, conn: AsyncConn) -> int:
        detail = await app._control.detail(conn, run_id, limit=SHOW_LIMIT)
        if args.json:
            print_json(detail.to_json())
        else:
            print("\n".join(_run_details(detail.run)))
            print("\n".join(_timeline(detail)))
        return 0
    return with_conn(go)


def _single(args: argparse.Namespace) -> UUID | None:
    """The run id when the command is about one run and nothing else (the one-run path)."""
    if args.run_id is None or args.all or args.dry_run or any(
            getattr(args, flag) is not None for flag in FILTER_FLAGS):
        return None
    return _parse_run_id(args.run_id)


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    run_id = _single(args)
    if run_id is None:
        return bulk_command("cancel", args, _optional_id(args))

    async def go(app: App, conn: AsyncConn) -> int:
        run = await app._control.cancel(conn, run_id)
        if args.json:
            print_json(run.to_json())
        elif run.status is RunStatus.RUNNING:
            print(f"cancel requested: run {run.id} is running; its worker will stop it")
        else:
            print(f"canceled run {run.id}")
        return 0
    return with_conn(go)


def cmd_runs_retry(args: argparse.Namespace) -> int:
    run_id = _single(args)
    if run_id is None:
        return bulk_command("retry", args, _optional_id(args))

    async def go(app: App, conn: AsyncConn) -> int:
        run = await app._control.retry(conn, run_id)
        if args.json:
            print_json(run.to_json())
        else:
            print(f"run {run.id} is pending again (attempt {run.attempts + 1} "
                  f"of {run.max_attempts})")
        return 0
    return with_conn(go)


def cmd_runs_replay(args: argparse.Namespace) -> int:
    run_id = _parse_run_id(args.run_id)

    async def go(app: App, conn: AsyncConn) -> int:
        done = await app._control.replay(conn, run_id, args.from_step)
        if args.json:
            print_json(done.to_json())
        else:
            print(f"run {run_id} is pending again from step {args.from_step!r}: "
                  f"{done.kept} earlier steps reused, {done.dropped} to run again")
        return 0
    return with_conn(go)


def cmd_runs_delete(args: argparse.Namespace) -> int:
    return bulk_command("delete", args, _optional_id(args))


def cmd_runs_reschedule(args: argparse.Namespace) -> int:
    return bulk_command("reschedule", args, _optional_id(args))


def _optional_id(args: argparse.Namespace) -> UUID | None:
    return None if args.run_id is None else _parse_run_id(args.run_id)


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
             "{}/{}".format(*tries.get(r.id, (r.attempts, r.max_attempts))), when(r.run_at),
             when(r.created_at)]
            for r in runs]
    return table(_LIST_COLUMNS, rows)


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
            text = json.dumps(value, indent=2, ensure_ascii=False, default=json_default)
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
        yield from ("  " + line for line in table(_STEP_COLUMNS, rows).splitlines())
    if detail.children:
        rows = [[str(c.id), c.job_type, c.status.value] for c in detail.children]
        yield f"children ({len(rows)}):"
        yield from ("  " + line for line in table(_CHILD_COLUMNS, rows).splitlines())


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f}ms" if seconds < 1 else _age(seconds)


def cmd_stats(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        stats = await app._control.stats(conn)
        summary = summarize(stats)
        if args.json:
            print_json(summary)
        else:
            print(_stats_text(summary))
        return 0
    return with_conn(go)


def cmd_workers(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        workers = await app._control.list_workers(conn)
        if args.json:
            print_json(workers.to_json())
            return 0
        rows = [[w["id"], ",".join(w["pools"]), f"{w['running']}/{w['concurrency']}",
                 w["version"], when(w["started_at"]), when(w["heartbeat_at"])]
                for w in workers.items]
        print(table(["WORKER", "POOLS", "RUNNING", "VERSION", "STARTED", "HEARTBEAT"], rows)
              if rows else "no worker alive")
        for leader in workers.leaders:
            state = "leads" if leader["alive"] else "led (lease expired)"
            print(f"{leader['name']}: {leader['leader_id']} {state} until "
                  f"{when(leader['expires_at'])}")
        return 0
    return with_conn(go)


def summarize(stats: Stats) -> dict[str, Any]:
    """Counts folded by status, by type and by pool, plus the per-pool queue age."""
    by_status: dict[str, int] = {}
    by_type: dict[str, dict[str, int]] = {}
    by_pool: dict[str, dict[str, int]] = {}
    for row in stats.counts:
        status, count = row.status, row.count
        by_status[status] = by_status.get(status, 0) + count
        for key, fold in ((row.job_type, by_type), (row.pool, by_pool)):
            per = fold.setdefault(key, {})
            per[status] = per.get(status, 0) + count
    runnable = [{"pool": r.pool, "runnable": r.runnable,
                 "oldest_age_s": round(r.oldest_age_s, 3)} for r in stats.runnable]
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
        parts.append(table([title, *(s.upper() for s in statuses), "TOTAL"], rows))
    if summary["runnable"]:
        rows = [[r["pool"], str(r["runnable"]), _age(r["oldest_age_s"])]
                for r in summary["runnable"]]
        parts.append(table(["POOL", "RUNNABLE NOW", "OLDEST WAITING"], rows))
    else:
        parts.append("nothing runnable now")
    return "\n\n".join(parts)


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
