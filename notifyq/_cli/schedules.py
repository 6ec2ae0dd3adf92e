"""``notifyq schedules list|pause|resume|trigger``: periodic schedules as the database has them (any
worker's), one connection each."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from notifyq._app import App
from notifyq._console import Parser, print_json, table, when, with_conn
from notifyq._db.pool import AsyncConn
from notifyq._maintenance.scheduler import (
    schedule_list,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
)


def add_schedule_commands(sub: Any) -> None:
    schedules = sub.add_parser("schedules",
                               help="list, pause, resume and trigger periodic schedules")
    actions = schedules.add_subparsers(dest="action", required=True, parser_class=Parser,
                                       metavar="list|pause|resume|trigger")
    listing = actions.add_parser("list", help="every schedule with its last and next tick")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    listing.set_defaults(func=cmd_schedules_list)
    for name, func, text in (
            ("pause", cmd_schedules_pause, "stop a schedule ticking on every worker"),
            ("resume", cmd_schedules_resume,
             "let a paused schedule tick again (the ticks it was paused for are skipped)"),
            ("trigger", cmd_schedules_trigger,
             "enqueue one run of a schedule now, outside its cadence; prints the run's id")):
        action = actions.add_parser(name, help=text)
        action.add_argument("name", metavar="NAME", help="as `notifyq schedules list` shows it")
        action.add_argument("--json", action="store_true", help="print the result as JSON")
        action.set_defaults(func=func)


def cmd_schedules_list(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        items = await schedule_list(conn, app._runtime.queries, [], app.clock.now())
        if args.json:
            print_json(items)
        elif not items:
            print("no periodic schedules (a schedule appears once a worker declaring it starts)")
        else:
            print(table(["NAME", "WHEN", "STATE", "LAST TICK", "LAST RUN", "NEXT TICK"],
                        [_row(s) for s in items]))
        return 0
    return with_conn(go)


def _row(s: dict[str, Any]) -> list[str]:
    cadence = f"cron {s['cron']} {s['tz']}" if s["cron"] else f"every {s['every_s']:g}s"
    if s["catch_up"]:
        cadence += " (catch-up)"
    state = f"paused since {when(s['paused_at'])}" if s["paused"] else "active"
    last_run = f"{s['last_run_id']} {s['last_status'] or 'purged'}" if s["last_run_id"] else "-"
    return [s["name"], cadence, state, when(s["last_tick_at"]), last_run,
            when(s["next_tick_at"])]


def cmd_schedules_pause(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        row = await schedule_pause(conn, app._runtime.queries, args.name, app.clock.db_now())
        if args.json:
            print_json(row)
        else:
            print(f"paused {row['name']} (since {when(row['paused_at'])})")
        return 0
    return with_conn(go)


def cmd_schedules_resume(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        row = await schedule_resume(conn, app._runtime.queries, args.name, app.clock.db_now())
        if args.json:
            print_json(row)
        else:
            print(f"resumed {row['name']}: it ticks again from its next tick")
        return 0
    return with_conn(go)


def cmd_schedules_trigger(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        row = await schedule_trigger(conn, app._runtime.queries, args.name)
        if args.json:
            print_json(row)
        else:
            print(row["run_id"])
            print(f"triggered {row['name']}: run {row['run_id']} enqueued now; its next tick "
                  "still comes when due", file=sys.stderr)
        return 0
    return with_conn(go)
