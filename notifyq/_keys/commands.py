"""``notifyq keys status|promote|rotate|pause|resume|retire``: the command line of key
rotation.

Each command loads the app (``--app MODULE:ATTR`` for columns registered in code; otherwise a
bare App from the environment), checks the configured keys against the database where it
encrypts or counts, and prints text or, with ``--json``, JSON. ``status``, ``promote``,
``pause`` and ``resume`` need no keys (an admin box drives them). ``status`` exits
``EXIT_NOT_DONE`` (3) while a row or a live process is not on the active version, so a pipeline
can wait on it. ``rotate`` prints the run id alone on stdout (for scripts) and says what it did
on stderr; ``rotate --wait`` reports progress on stderr while it waits (see
:mod:`notifyq._keys.watch`).
"""

from __future__ import annotations

import argparse
import os
import socket
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

EXIT_NOT_DONE = 3
"""``keys status``: rows or live processes are still on another version than the active one."""


def add_keys_parser(sub: Any) -> None:
    keys = sub.add_parser("keys", help="master keys: status, promote, rotate, pause, resume, "
                                       "retire")
    actions = keys.add_subparsers(dest="action", required=True, parser_class=Parser,
                                  metavar="status|promote|rotate|pause|resume|retire")
    status = actions.add_parser("status", help="key versions, live processes and what they "
                                               "hold, rows per version per column, the latest "
                                               "rotation; exit 3 until all is on the active "
                                               "version")
    promote = actions.add_parser("promote", help="make a key version the one every process "
                                                 "encrypts under (refused while a live process "
                                                 "lacks it)")
    promote.add_argument("version", metavar="VERSION", type=int)
    promote.add_argument("--force", action="store_true",
                         help="promote although live processes lack the version: they then "
                              "refuse to encrypt and cannot read what is written under it")
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
    _add_rate(rotate, "at most R rows per second (0: no limit); applies to a rotation already "
                      "under way too")
    pause = actions.add_parser("pause", help="pause the rotation before its next batch")
    resume = actions.add_parser("resume", help="resume a paused rotation")
    _add_rate(resume, "resume at R rows per second (0: no limit)")
    retire = actions.add_parser("retire", help="stop decrypting a version no row and no live "
                                               "process uses any more")
    retire.add_argument("version", metavar="VERSION", type=int)
    for parser, func in ((status, cmd_keys_status), (promote, cmd_keys_promote),
                         (rotate, cmd_keys_rotate), (pause, cmd_keys_pause),
                         (resume, cmd_keys_resume), (retire, cmd_keys_retire)):
        parser.add_argument("--app", help="MODULE:ATTR of your notifyq.App (for columns "
                                          "registered in code)")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(func=func)


def _add_rate(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--rate", metavar="R", type=_rate, dest="rate_per_s", help=text)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be rows per second, got {text!r}") from None
    if not 0 <= value <= 10_000_000:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) to 10000000, got {text}")
    return value


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
        return 0 if status["done"] else EXIT_NOT_DONE
    return _with_app(args, go)


def cmd_keys_promote(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        by = f"notifyq keys promote on {socket.gethostname()} (pid {os.getpid()})"
        result = await app.keys.promote(conn, args.version, force=args.force, by=by)
        if result["forced"]:
            _say(f"warning: promoted although {len(result['lacking'])} live process(es) lack "
                 f"version {args.version}: they refuse to encrypt until they get it")
        _emit(args, result, lambda: _promoted_text(result))
        return 0
    return _with_app(args, go)


def _promoted_text(result: dict[str, Any]) -> str:
    version = result["version"]
    if not result["changed"]:
        return f"key version {version} is already active"
    return (f"promoted key version {version} (was {result['previous'] or 'none'}): workers "
            "encrypt under it now, other processes from their next key check; then run "
            "`notifyq keys rotate --wait`")


def cmd_keys_pause(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        result = await app.keys.pause(conn)
        _emit(args, result, lambda: f"paused rotation run {result['run_id']} (to version "
                                    f"{result['target_version']}): `notifyq keys resume` "
                                    "goes on from its last batch")
        return 0
    return _with_app(args, go)


def cmd_keys_resume(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        result = await app.keys.resume(conn, rate_per_s=args.rate_per_s)
        _emit(args, result, lambda: (f"resumed rotation run {result['run_id']}"
                                     if result["resumed"] else
                                     f"rotation run {result['run_id']} was not paused; its "
                                     "rate limit is changed"))
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
                                             pause_s=args.pause_s, rate_per_s=args.rate_per_s)
        target = run.input.get("target_version") if isinstance(run.input, dict) else None
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
    versions = [[str(v["version"]), _flags(v), str(v["held_by"]), str(v["encrypted_by"]),
                 v["first_seen_at"] or "-"] for v in status["versions"]]
    lines.append(table(["VERSION", "STATE", "HELD BY", "ENCRYPTED BY", "FIRST SEEN"], versions)
                 if versions else "no key versions")
    promotion = status["promotion"]
    if promotion:
        lines.append(f"active: version {promotion['version']}, promoted "
                     f"{promotion['promoted_at']} by {promotion['promoted_by']}"
                     + (" (forced)" if promotion["forced"] else ""))
    else:
        lines.append("active: none yet (set NOTIFYQ_ACTIVE_KEY_VERSION or run `notifyq keys "
                     "promote N`)")
    if status["processes"]:
        rows = [[p["id"], p["role"], ", ".join(map(str, p["versions"])),
                 str(p["encrypts_with"]) if p["encrypts_with"] is not None
                 else "none (lacks the active version)"] for p in status["processes"]]
        lines.append(table(["PROCESS", "ROLE", "HOLDS", "ENCRYPTS WITH"], rows))
    else:
        lines.append("no live processes hold keys")
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
                f"{rotation['target_version']}, {rotation['status']}"
                + (", paused" if rotation["paused"] else "")
                + (f", at most {rotation['rate_limit_per_s']:g} rows/s"
                   if rotation["rate_limit_per_s"] else ""))
        if rotation["undecryptable"]:
            head += f", {rotation['undecryptable']} rows could not be decrypted"
        lines.append(head)
        for c in rotation["columns"]:
            lines.append(f"  {c['column']}: pass {c['pass']}, {c['reencrypted']} re-encrypted, "
                         f"{c['conflicts']} changed concurrently"
                         + (", finished" if c["finished"] else ""))
    lines.append(_verdict(status))
    return "\n\n".join(lines)


def _verdict(status: dict[str, Any]) -> str:
    if status["done"]:
        return f"done: every row and every live process is on version {status['active_version']}"
    left = []
    if status["rows_left"]:
        left.append(f"{status['rows_left']:,} rows")
    if status["processes_left"]:
        left.append(f"{len(status['processes_left'])} process(es)")
    return "not done: " + (" and ".join(left) or "no active version") + (
        " not on the active version" if left else "")


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
