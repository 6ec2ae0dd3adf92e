"""``notifyq keys status|rotate|retire``: the command line of key rotation.

Each command loads the app (``--app MODULE:ATTR`` for columns registered in code; otherwise a
bare App from the environment), checks the configured keys against the database, and prints
text or, with ``--json``, JSON. ``rotate`` prints the run id alone on stdout (for scripts) and
says what it did on stderr; ``rotate --wait`` reports progress on stderr while it waits (see
:mod:`notifyq.crypto.watch`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from notifyq._app import App
from notifyq._console import (
    EXIT_TIMEOUT,
    Parser,
    load_app,
    print_json,
    run_async,
    session,
    table,
)
from notifyq._db.pool import AsyncConn
from notifyq._errors import NotifyqError
from notifyq._keys.watch import RotationWatch, report_for
from notifyq._run import Run, RunStatus


def add_keys_parser(sub: Any) -> None:
    keys = sub.add_parser("keys", help="master keys: status, rotate, retire")
    actions = keys.add_subparsers(dest="action", required=True, parser_class=Parser,
                                  metavar="status|rotate|retire")
    status = actions.add_parser("status", help="key versions, rows per version per column, "
                                               "and the latest rotation")
    rotate = actions.add_parser("rotate", help="re-encrypt every registered column under the "
                                               "active key version (prints the run id)")
    rotate.add_argument("--wait", action="store_true",
                        help="wait for the rotation to finish, showing progress on stderr; "
                             "exit 1 unless every row moved")
    rotate.add_argument("--timeout", metavar="S", type=_seconds,
                        help="with --wait: stop waiting after S seconds, exit 124 (the "
                             "rotation is not canceled)")
    rotate.add_argument("--batch-size", metavar="N", type=int, help="rows per batch (500)")
    rotate.add_argument("--pause-s", metavar="S", type=float,
                        help="pause between batches to spare a busy database (0)")
    retire = actions.add_parser("retire", help="stop decrypting a version no row uses any more")
    retire.add_argument("version", metavar="VERSION", type=int)
    for parser, func in ((status, cmd_keys_status), (rotate, cmd_keys_rotate),
                         (retire, cmd_keys_retire)):
        parser.add_argument("--app", help="MODULE:ATTR of your notifyq.App (for columns "
                                          "registered in code)")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(func=func)


def _with_app(args: argparse.Namespace, fn: Any) -> int:
    app = load_app(args.app)

    async def go() -> int:
        async with session(app) as conn:
            result: int = await fn(app, conn)
            return result
    return run_async(go)


def cmd_keys_status(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        status = await app.keys.status(conn)
        _emit(args, status, lambda: status_text(status))
        return 0
    return _with_app(args, go)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.wait:
        raise NotifyqError("--timeout only applies with --wait")

    async def go(app: App, conn: AsyncConn) -> int:
        run, created = await app.keys.rotate(conn, batch_size=args.batch_size,
                                             pause_s=args.pause_s)
        target = app.keyring.active_version
        _say(f"{'started' if created else 'already under way:'} rotation to key version "
             f"{target}, {run.job_type} run {run.id} (pool {run.pool})")
        if not args.wait:
            _emit(args, {"run_id": str(run.id), "created": created,
                         "target_version": target}, lambda: str(run.id))
            return 0
        watch = RotationWatch(app._runtime, app.keys, conn, run.id, report_for(sys.stderr),
                              start_hint=_worker_command(args))
        if not await watch.follow(args.timeout):
            _say(f"notifyq: error: {watch.timeout_message(args.timeout)}")
            return EXIT_TIMEOUT
        run = await app._control.get(conn, run.id)
        status = await app.keys.status(conn)
        failures = await app.keys.failures(conn, run.id)
        _emit(args, {"run": run.to_json(), "status": status, "undecryptable": failures},
              lambda: _wait_text(run, status, failures))
        rotation = status["rotation"] or {}
        ok = run.status is RunStatus.COMPLETED and not rotation.get("undecryptable")
        return 0 if ok else 1
    return _with_app(args, go)


def cmd_keys_retire(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        result = await app.keys.retire(conn, args.version)
        _emit(args, result, lambda: f"retired key version {args.version}: it no longer "
                                    "decrypts; remove it from NOTIFYQ_KEYS when convenient")
        return 0
    return _with_app(args, go)


def _worker_command(args: argparse.Namespace) -> str:
    return "notifyq worker" + (f" --app {args.app}" if args.app else "")


def _say(text: str) -> None:
    """What a command did, on stderr: stdout stays the value scripts read."""
    print(text, file=sys.stderr, flush=True)


def _emit(args: argparse.Namespace, data: Any, text: Any) -> None:
    if args.json:
        print_json(data)
    else:
        print(text())


def status_text(status: dict[str, Any]) -> str:
    lines = []
    versions = [[str(v["version"]), _flags(v), v["first_seen_at"] or "-"]
                for v in status["versions"]]
    lines.append(table(["VERSION", "STATE", "FIRST SEEN"], versions) if versions
                 else "no key versions")
    if status["columns"]:
        rows = [[c["column"], str(c["rows"]),
                 ", ".join(f"v{v}: {n}" for v, n in c["by_version"].items()) or "-",
                 str(c["remaining"])] for c in status["columns"]]
        lines.append(table(["COLUMN", "ROWS", "BY VERSION", "NOT ON ACTIVE"], rows))
    else:
        lines.append("no encrypted columns registered")
    rotation = status["rotation"]
    if rotation:
        head = (f"latest rotation: run {rotation['run_id']} to version "
                f"{rotation['target_version']}, {rotation['status']}")
        if rotation["undecryptable"]:
            head += f", {rotation['undecryptable']} rows could not be decrypted"
        lines.append(head)
        for c in rotation["columns"]:
            lines.append(f"  {c['column']}: pass {c['pass']}, {c['reencrypted']} re-encrypted, "
                         f"{c['conflicts']} changed concurrently"
                         + (", finished" if c["finished"] else ""))
    return "\n\n".join(lines)


def _flags(version: dict[str, Any]) -> str:
    if version["retired"]:
        return "retired"
    if version["active"]:
        return "active"
    if version["decrypt_only"]:
        return "decrypt-only"
    return "not configured"


def _wait_text(run: Run, status: dict[str, Any], failures: list[dict[str, Any]]) -> str:
    if run.status is not RunStatus.COMPLETED:
        message = (run.error or {}).get("message", "")
        raise NotifyqError(f"rotation run {run.id} ended {run.status.value}: {message}")
    parts = [f"rotation run {run.id} completed", status_text(status)]
    if failures:
        parts.append("rows that could not be decrypted (left as they are):\n" + "\n".join(
            f"  {f['column_name']} pk {f['row_pk']}: {f['reason']}" for f in failures))
    return "\n\n".join(parts)
