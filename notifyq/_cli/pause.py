"""``notifyq pause pool|type NAME``, ``notifyq resume pool|type NAME``, ``notifyq paused`` and
``notifyq rate-limits``: what holds claimable work back."""

from __future__ import annotations

import argparse
from typing import Any

from notifyq._app import App
from notifyq._console import Parser, print_json, table, when, with_conn
from notifyq._db.pool import AsyncConn
from notifyq._pause import KINDS, PauseKind, check_target
from notifyq._rate import list_windows

_COLUMNS = ("KIND", "NAME", "PAUSED AT", "REASON")


def add_pause_commands(sub: Any) -> None:
    pause = sub.add_parser("pause", help="stop workers claiming a pool's or a job type's runs "
                           "(pending runs wait, running ones finish)")
    _target(pause)
    pause.add_argument("--reason", help="a note shown with the pause")
    pause.set_defaults(func=cmd_pause)

    resume = sub.add_parser("resume", help="let workers claim a paused pool's or type's runs")
    _target(resume)
    resume.set_defaults(func=cmd_resume)

    paused = sub.add_parser("paused", help="list the paused pools and job types")
    paused.add_argument("--json", action="store_true", help="print a JSON array")
    paused.set_defaults(func=cmd_paused)

    rates = sub.add_parser("rate-limits", help="list rate-limited keys: starts in the current "
                           "window, runnable backlog, when the next run may start")
    rates.add_argument("--json", action="store_true", help="print a JSON array")
    rates.set_defaults(func=cmd_rate_limits)


def _target(parser: Parser) -> None:
    parser.add_argument("kind", choices=KINDS, metavar="pool|type")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _checked(args: argparse.Namespace) -> tuple[PauseKind, str]:
    kind: PauseKind = "pool" if args.kind == "pool" else "type"
    check_target(kind, args.name)  # before a connection is opened
    return kind, args.name


def cmd_pause(args: argparse.Namespace) -> int:
    kind, name = _checked(args)

    async def go(app: App, conn: AsyncConn) -> int:
        paused, created = await app._pauses.pause(conn, kind, name, reason=args.reason)
        if args.json:
            print_json({**paused.to_json(), "created": created})
        elif created:
            print(f"paused {kind} {name}: workers claim none of its runs until "
                  f"`notifyq resume {kind} {name}`")
        else:
            print(f"{kind} {name} was paused already (since {when(paused.paused_at)})")
        return 0
    return with_conn(go)


def cmd_resume(args: argparse.Namespace) -> int:
    kind, name = _checked(args)

    async def go(app: App, conn: AsyncConn) -> int:
        resumed = await app._pauses.resume(conn, kind, name)
        if args.json:
            print_json({"kind": kind, "name": name, "resumed": resumed is not None})
        elif resumed is None:
            print(f"{kind} {name} was not paused")
        else:
            print(f"resumed {kind} {name}")
        return 0
    return with_conn(go)


def cmd_paused(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        items = await app._pauses.list(conn)
        if args.json:
            print_json([p.to_json() for p in items])
        elif not items:
            print("nothing paused")
        else:
            print(table(_COLUMNS, [[p.kind, p.name, when(p.paused_at), p.reason or ""]
                                   for p in items]))
        return 0
    return with_conn(go)


_RATE_COLUMNS = ("KEY", "POOL", "LIMIT", "IN WINDOW", "RUNNABLE", "NEXT START")


def cmd_rate_limits(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        items = await list_windows(conn, app._runtime.queries, app.clock)
        if args.json:
            print_json([w.to_json() for w in items])
        elif not items:
            print("no rate-limited key has started a run")
        else:
            print(table(_RATE_COLUMNS, [
                [w.key, w.pool, f"{w.limit}/{w.period_s:g}s", str(w.in_window),
                 str(w.runnable), when(w.next_start_at) if w.next_start_at else "now"]
                for w in items]))
        return 0
    return with_conn(go)
