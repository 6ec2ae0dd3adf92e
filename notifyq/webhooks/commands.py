"""``notifyq webhooks ...``: endpoints (add, list, enable, disable, rotate-secret), send,
attempts, resend and recover. Text by default, JSON with ``--json``. A secret is printed only by
``add`` and ``rotate-secret``: the one time it is shown."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from notifyq.app import App
from notifyq.db.pool import AsyncConn
from notifyq.errors import InvalidEndpoint
from notifyq.webhooks.endpoints import Endpoint


def add_webhooks_parser(sub: Any) -> None:
    from notifyq.cli import _Parser

    hooks = sub.add_parser("webhooks", help="webhook endpoints, messages and attempts")
    actions = hooks.add_subparsers(dest="action", required=True, parser_class=_Parser,
                                   metavar="endpoints|send|attempts|resend|recover")
    _add_endpoints(actions, _Parser)

    send = actions.add_parser("send", help="send a message by event type (or to one "
                                           "endpoint); prints its id")
    send.add_argument("event_type", metavar="EVENT_TYPE")
    send.add_argument("--payload", metavar="JSON|-", required=True,
                      help="the JSON body (object or array); - reads it from stdin")
    send.add_argument("--endpoint", metavar="ID", help="send to this endpoint only")
    send.add_argument("--idempotency-key", metavar="K",
                      help="a second send with this key returns the first message")
    send.set_defaults(func=cmd_send)

    attempts = actions.add_parser("attempts", help="every attempt of a message")
    attempts.add_argument("message_id", metavar="MESSAGE")
    attempts.set_defaults(func=cmd_attempts)

    resend = actions.add_parser("resend", help="a manual attempt (no retries) of a message")
    resend.add_argument("message_id", metavar="MESSAGE")
    resend.add_argument("--endpoint", metavar="ID", help="to this endpoint only")
    resend.set_defaults(func=cmd_resend)

    recover = actions.add_parser("recover", help="re-enqueue an endpoint's failed deliveries "
                                                 "since a time")
    recover.add_argument("endpoint_id", metavar="ENDPOINT")
    recover.add_argument("--since", metavar="ISO8601", required=True)
    recover.set_defaults(func=cmd_recover)
    for parser in (send, attempts, resend, recover):
        _common(parser)


def _add_endpoints(actions: Any, parser_class: Any) -> None:
    endpoints = actions.add_parser("endpoints", help="add, list, enable, disable, "
                                                     "rotate-secret")
    ops = endpoints.add_subparsers(dest="op", required=True, parser_class=parser_class,
                                   metavar="add|list|enable|disable|rotate-secret")
    add = ops.add_parser("add", help="create an endpoint; prints its id and secret (once)")
    add.add_argument("url", metavar="URL")
    add.add_argument("--description", default="")
    add.add_argument("--event-type", action="append", dest="event_types", metavar="TYPE",
                     help="subscribe to this type (repeatable; default: every type)")
    add.add_argument("--header", action="append", dest="headers", metavar="NAME:VALUE",
                     help="a custom header sent with every message (repeatable)")
    add.add_argument("--secret", help="whsec_... (default: generated)")
    add.add_argument("--disabled", action="store_true", help="create it disabled")
    add.set_defaults(func=cmd_endpoints_add)

    listing = ops.add_parser("list", help="endpoints, oldest first")
    listing.add_argument("--limit", type=int, default=100)
    listing.set_defaults(func=cmd_endpoints_list)

    enable = ops.add_parser("enable", help="enable an endpoint (its failure streak is reset)")
    enable.add_argument("endpoint_id", metavar="ID")
    enable.set_defaults(func=cmd_endpoints_enable)

    disable = ops.add_parser("disable", help="disable an endpoint; pending deliveries stop")
    disable.add_argument("endpoint_id", metavar="ID")
    disable.add_argument("--reason", default="disabled from the command line")
    disable.set_defaults(func=cmd_endpoints_disable)

    rotate = ops.add_parser("rotate-secret", help="a new secret (printed once); the old one "
                                                  "keeps signing for the grace period")
    rotate.add_argument("endpoint_id", metavar="ID")
    rotate.add_argument("--grace-s", type=float, metavar="S",
                        help="seconds the old secret stays valid (webhooks.secret_grace_s)")
    rotate.add_argument("--secret", help="whsec_... (default: generated)")
    rotate.set_defaults(func=cmd_endpoints_rotate)
    for parser in (add, listing, enable, disable, rotate):
        _common(parser)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", help="MODULE:ATTR of your notifyq.App")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace, fn: Any) -> int:
    from notifyq.cli import _session, load_app, run_async

    app = load_app(args.app)

    async def go() -> int:
        async with _session(app) as conn:
            result: int = await fn(app, conn)
            return result
    return run_async(go)


def _emit(args: argparse.Namespace, value: Any, text: str) -> None:
    if args.json:
        print(json.dumps(value, indent=2, default=str, ensure_ascii=False))
    else:
        print(text)


def _endpoint_line(e: Endpoint) -> str:
    state = "enabled" if e.enabled else f"disabled ({e.disabled_reason})"
    types = ",".join(e.event_types) if e.event_types else "*"
    return f"{e.id}  {state}  {types}  {e.url}"


def _headers(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition(":")
        if not sep:
            raise InvalidEndpoint(f"--header {pair!r} must look like NAME:VALUE")
        out[name.strip()] = value.strip()
    return out


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    headers = _headers(args.headers)

    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.create_endpoint(
            args.url, description=args.description, event_types=args.event_types,
            headers=headers, secret=args.secret, enabled=not args.disabled, conn=conn)
        _emit(args, e.to_json(), f"{e.id}\nsecret (shown once, store it now): {e.secret}")
        return 0
    return _run(args, go)


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        items = await app.webhooks.list_endpoints(limit=args.limit, conn=conn)
        _emit(args, [e.to_json() for e in items],
              "\n".join(_endpoint_line(e) for e in items) or "no endpoints")
        return 0
    return _run(args, go)


def cmd_endpoints_enable(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.enable_endpoint(args.endpoint_id, conn=conn)
        _emit(args, e.to_json(), _endpoint_line(e))
        return 0
    return _run(args, go)


def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.disable_endpoint(args.endpoint_id, args.reason, conn=conn)
        _emit(args, e.to_json(), _endpoint_line(e))
        return 0
    return _run(args, go)


def cmd_endpoints_rotate(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.rotate_secret(args.endpoint_id, secret=args.secret,
                                             grace_s=args.grace_s, conn=conn)
        _emit(args, e.to_json(), f"new secret (shown once, store it now): {e.secret}")
        return 0
    return _run(args, go)


def cmd_send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.payload == "-" else args.payload
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise InvalidEndpoint(f"--payload is not JSON: {exc}") from None

    async def go(app: App, conn: AsyncConn) -> int:
        sent = await app.webhooks.send(args.event_type, payload, endpoint_id=args.endpoint,
                                       idempotency_key=args.idempotency_key, conn=conn)
        _emit(args, sent.to_json(), sent.id)
        return 0
    return _run(args, go)


def cmd_attempts(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.attempts(args.message_id, conn=conn)
        lines = [f"{r['created_at'].isoformat()}  {r['trigger']:<9}  #{r['attempt']}  "
                 f"{r['status_code'] or r['error_kind']}  {r['duration_ms']:.1f} ms  "
                 f"{r['endpoint_id']}" for r in rows]
        _emit(args, rows, "\n".join(lines) or "no attempts")
        return 0
    return _run(args, go)


def cmd_resend(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.resend(args.message_id, endpoint_id=args.endpoint, conn=conn)
        _emit(args, rows, "\n".join(str(r["run_id"]) for r in rows))
        return 0
    return _run(args, go)


def cmd_recover(args: argparse.Namespace) -> int:
    try:
        since = datetime.fromisoformat(args.since)
    except ValueError:
        raise InvalidEndpoint(f"--since {args.since!r} is not an ISO 8601 time") from None
    if since.tzinfo is None:
        raise InvalidEndpoint("--since needs a UTC offset (e.g. 2030-01-01T09:00Z)")

    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.recover(args.endpoint_id, since, conn=conn)
        _emit(args, rows, f"recovered {len(rows)} deliveries")
        return 0
    return _run(args, go)
