"""``notifyq webhooks ...``: endpoints (add, update, list, enable, disable, rotate-secret), the
event-type catalog (define, list, delete), send, attempts, resend, give-up, recover,
replay-missing, the operator events (``events``) and portal-link (a one-time sign-in link to the
customer portal). Text by default, JSON with ``--json``. A secret is printed only by ``add`` and
``rotate-secret``: the one time it is shown.

Every command that changes something says what it did in one line. Those that create something
(``endpoints add``, ``send``, ``resend``) print what scripts read on stdout (the id, the run
ids) and that line on stderr; the others print it on stdout. ``endpoints add`` shows the new
secret on stderr too (``--json`` has it on stdout with the rest), so ``ID=$(...)`` captures the
id alone."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from notifyq._app import App
from notifyq._console import Parser, load_app, run_async, session, table, when
from notifyq._db.pool import AsyncConn
from notifyq._errors import InvalidEndpoint
from notifyq._settings import Settings
from notifyq._webhooks.endpoints import Endpoint
from notifyq._webhooks.rows import Attempt, Delivery
from notifyq._webhooks.service import OPERATOR_EVENT_KINDS, SentMessage


def add_webhooks_parser(sub: Any) -> None:
    hooks = sub.add_parser("webhooks", help="webhook endpoints, messages and attempts")
    actions = hooks.add_subparsers(dest="action", required=True, parser_class=Parser,
                                   metavar="endpoints|event-types|send|attempts|resend|"
                                           "give-up|recover|replay-missing|events|portal-link")
    _add_endpoints(actions, Parser)
    _add_event_types(actions, Parser)

    send = actions.add_parser("send", help="send a message by event type (or to one "
                                           "endpoint); prints its id")
    send.add_argument("event_type", metavar="EVENT_TYPE")
    send.add_argument("--payload", metavar="JSON|-", required=True,
                      help="the JSON body (object or array); - reads it from stdin")
    send.add_argument("--endpoint", metavar="ID", help="send to this endpoint only")
    send.add_argument("--payload-retention-s", type=float, metavar="S",
                      help="drop the payload this long after sending (default: "
                           "webhooks.payload_retention_s)")
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

    give_up = actions.add_parser("give-up", help="give up a message's pending delivery to one "
                                 "endpoint (it fails; an ordered endpoint's next message goes)")
    give_up.add_argument("message_id", metavar="MESSAGE")
    give_up.add_argument("--endpoint", metavar="ID", required=True)
    give_up.add_argument("--reason", default="given up from the command line")
    give_up.set_defaults(func=cmd_give_up)

    recover = actions.add_parser("recover", help="re-enqueue an endpoint's failed deliveries "
                                                 "since a time")
    recover.add_argument("endpoint_id", metavar="ENDPOINT")
    recover.add_argument("--since", metavar="ISO8601", required=True)
    recover.set_defaults(func=cmd_recover)

    replay = actions.add_parser("replay-missing", help="send an endpoint the messages since a "
                                                       "time that it never got")
    replay.add_argument("endpoint_id", metavar="ENDPOINT")
    replay.add_argument("--since", metavar="ISO8601", required=True)
    replay.add_argument("--limit", type=int, default=10_000,
                        help="at most this many messages (default 10000)")
    replay.add_argument("--dry-run", action="store_true", help="count them; send nothing")
    replay.set_defaults(func=cmd_replay_missing)

    portal = actions.add_parser("portal-link", help="mint a one-time sign-in link to the "
                                                    "customer portal for a tenant; prints it")
    portal.add_argument("tenant_id", metavar="TENANT")
    portal.add_argument("--ttl-s", type=float, metavar="S",
                        help="seconds it stays valid (webhooks.portal_link_ttl_s)")
    portal.add_argument("--read-only", action="store_true",
                        help="the customer sees, but changes nothing")
    portal.add_argument("--url", metavar="BASE", help="where customers reach this server "
                        "(webhooks.portal_url; default http://API_HOST:API_PORT)")
    portal.set_defaults(func=cmd_portal_link)

    events = actions.add_parser("events", help="operator events, newest first: endpoints "
                                "disabled, circuits opened and closed, endpoints failing "
                                "for long, purge passes")
    events.add_argument("--kind", choices=OPERATOR_EVENT_KINDS, help="only this kind")
    events.add_argument("--endpoint", metavar="ID", help="only about this endpoint")
    events.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    events.set_defaults(func=cmd_events)
    for parser in (send, attempts, resend, give_up, recover, replay, events, portal):
        _common(parser)


def _add_endpoints(actions: Any, parser_class: Any) -> None:
    endpoints = actions.add_parser("endpoints", help="add, update, list, enable, disable, "
                                                     "rotate-secret")
    ops = endpoints.add_subparsers(dest="op", required=True, parser_class=parser_class,
                                   metavar="add|update|list|enable|disable|rotate-secret")
    add = ops.add_parser("add", help="create an endpoint; prints its id (its secret, shown once, "
                                "on stderr; both with --json)")
    add.add_argument("url", metavar="URL")
    add.add_argument("--description", default="")
    add.add_argument("--event-type", action="append", dest="event_types", metavar="TYPE",
                     help="subscribe to this type (repeatable; default: every type)")
    add.add_argument("--header", action="append", dest="headers", metavar="NAME:VALUE",
                     help="a custom header sent with every message (repeatable)")
    add.add_argument("--secret", help="whsec_... (default: generated)")
    add.add_argument("--disabled", action="store_true", help="create it disabled")
    add.add_argument("--ordered", action="store_true",
                     help="one delivery at a time, in send order")
    add.add_argument("--tenant", dest="tenant_id", metavar="TENANT",
                     help="the tenant it belongs to, for good (default: none)")
    add.add_argument("--rate-limit", type=_rate_limit, metavar="N",
                     help="at most N deliveries per second, across all workers (default: "
                          "unlimited)")
    add.set_defaults(func=cmd_endpoints_add)

    update = ops.add_parser("update", help="change an endpoint's URL, description, order or "
                                           "rate limit")
    update.add_argument("endpoint_id", metavar="ID")
    update.add_argument("--url")
    update.add_argument("--description")
    update.add_argument("--ordered", action=argparse.BooleanOptionalAction, default=None,
                        help="one delivery at a time, in send order (--no-ordered: in "
                             "parallel again)")
    update.add_argument("--rate-limit", type=_rate_limit, metavar="N|none", default=...,
                        help="at most N deliveries per second; none: unlimited")
    update.set_defaults(func=cmd_endpoints_update)

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
    for parser in (add, update, listing, enable, disable, rotate):
        _common(parser)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", help="MODULE:ATTR of your notifyq.App")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace, fn: Any) -> int:
    app = load_app(args.app)

    async def go() -> int:
        async with session(app) as conn:
            result: int = await fn(app, conn)
            return result
    return run_async(go)


def _emit(args: argparse.Namespace, value: Any, text: str) -> None:
    if args.json:
        print(json.dumps(value, indent=2, default=str, ensure_ascii=False))
    else:
        print(text)


def _say(text: str) -> None:
    """What a creating command did, on stderr: stdout stays the value scripts read."""
    print(text, file=sys.stderr, flush=True)


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def _types(e: Endpoint) -> str:
    return ("event types " + ", ".join(e.event_types) if e.event_types is not None
            else "every event type")


def _endpoint_line(e: Endpoint) -> str:
    state = "enabled" if e.enabled else f"disabled ({e.disabled_reason})"
    circuit = e.circuit_state()
    if circuit != "closed" and e.circuit_open_until is not None:
        state += (f", circuit {circuit.replace('_', '-')} after "
                  f"{_plural(e.consecutive_failures, 'failure')}"
                  + (f" until {e.circuit_open_until.isoformat(timespec='seconds')}"
                     if circuit == "open" else ""))
    if e.ordered:
        state += ", ordered"
    if e.rate_limit is not None:
        state += f", at most {e.rate_limit}/s"
    types = ",".join(e.event_types) if e.event_types else "*"
    return f"{e.id}  {state}  {types}  {e.url}"


def _rate_limit(text: str) -> int | None:
    """``--rate-limit``: a whole number of deliveries per second, or ``none``."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of deliveries per second (or none)") from None


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
            headers=headers, secret=args.secret, enabled=not args.disabled,
            tenant_id=args.tenant_id, rate_limit=args.rate_limit, ordered=args.ordered,
            conn=conn)
        _say(f"created endpoint {e.id} for {e.url} ({_types(e)}, "
             f"{'enabled' if e.enabled else 'disabled'}{', ordered' if e.ordered else ''})")
        if not args.json:  # stdout is the id alone (ID=$(...)); --json has the secret
            _say(f"secret (shown once, store it now): {e.secret}")
        _emit(args, e.to_json(), str(e.id))
        return 0
    return _run(args, go)


def cmd_endpoints_update(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.update_endpoint(args.endpoint_id, url=args.url,
                                               description=args.description,
                                               ordered=args.ordered,
                                               rate_limit=args.rate_limit, conn=conn)
        order = ("ordered: one delivery at a time, in send order" if e.ordered
                 else "not ordered")
        rate = (f", at most {e.rate_limit} deliveries per second" if e.rate_limit is not None
                else "")
        _emit(args, e.to_json(), f"updated endpoint {e.id} ({e.url}), {order}{rate}")
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
        _emit(args, e.to_json(), f"enabled endpoint {e.id} ({e.url}): new messages go to it "
                                 "again and its failure streak starts from zero")
        return 0
    return _run(args, go)


def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.disable_endpoint(args.endpoint_id, args.reason, conn=conn)
        _emit(args, e.to_json(), f"disabled endpoint {e.id} ({e.url}): {e.disabled_reason}; "
                                 "its pending deliveries are canceled")
        return 0
    return _run(args, go)


def cmd_endpoints_rotate(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        e = await app.webhooks.rotate_secret(args.endpoint_id, secret=args.secret,
                                             grace_s=args.grace_s, conn=conn)
        grace = app.webhooks.settings.secret_grace_s if args.grace_s is None else args.grace_s
        old = (f"the previous one keeps signing for {grace:g} s" if grace
               else "the previous one no longer signs")
        _emit(args, e.to_json(), f"rotated the signing secret of endpoint {e.id}: {old}\n"
                                 f"new secret (shown once, store it now): {e.secret}")
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
                                       idempotency_key=args.idempotency_key,
                                       payload_retention_s=args.payload_retention_s,
                                       conn=conn)
        _say(_sent_text(sent, args.event_type))
        _emit(args, sent.to_json(), sent.id)
        return 0
    return _run(args, go)


def _sent_text(sent: SentMessage, event_type: str) -> str:
    if not sent.created:
        return (f"the idempotency key matched message {sent.id}, sent earlier to "
                f"{_plural(sent.deliveries, 'endpoint')}: nothing new was sent")
    if not sent.deliveries:
        return (f"stored message {sent.id}, but no enabled endpoint subscribes to {event_type}: "
                "nothing will be delivered")
    return f"sent message {sent.id} ({event_type}) to {_plural(sent.deliveries, 'endpoint')}"


def cmd_attempts(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.attempts(args.message_id, conn=conn)
        if args.json:
            _emit(args, rows, "")
            return 0
        message = await app.webhooks.message(args.message_id, conn=conn)
        print(attempts_text(rows, message["deliveries"]))
        return 0
    return _run(args, go)


def attempts_text(rows: list[Attempt], deliveries: list[Delivery]) -> str:
    """A table of the attempts, then one line per delivery: where it stands."""
    parts = []
    if rows:
        parts.append(table(["WHEN", "ATTEMPT", "RESULT", "DURATION", "ENDPOINT"], [
            [when(r["created_at"]), attempt_label(r),
             str(r["status_code"] or r["error_kind"]), f"{r['duration_ms']:.1f} ms",
             str(r["endpoint_id"])] for r in rows]))
    else:
        parts.append("no attempts")
    parts.append("\n".join(_delivery_line(d, rows) for d in deliveries))
    return "\n\n".join(p for p in parts if p)


def attempt_label(row: Attempt) -> str:
    """``scheduled 2/8``: the second attempt of a delivery's schedule of 8; ``manual 1``: its
    first manual resend."""
    if row["trigger"] == "manual":
        return f"manual {row['attempt']}"
    return f"scheduled {row['attempt']}/{row['max_attempts']}"


def _delivery_line(delivery: Delivery, rows: list[Attempt]) -> str:
    mine = [r for r in rows if r["endpoint_id"] == delivery["endpoint_id"]]
    manual = sum(1 for r in mine if r["trigger"] == "manual")
    status, made, limit = delivery["status"], delivery["attempts"], delivery["max_attempts"]
    line = f"endpoint {delivery['endpoint_id']}: " + (
        f"{status} after {made} of {limit} scheduled attempts" if made
        else f"pending, no scheduled attempt yet (at most {limit})" if status == "pending"
        else f"{status} before any scheduled attempt")
    scheduled = [r for r in mine if r["trigger"] == "scheduled"]
    if delivery["status"] == "pending" and scheduled and scheduled[-1]["next_attempt_at"]:
        line += f", next at {when(scheduled[-1]['next_attempt_at'])}"
    if manual:
        line += f", and {_plural(manual, 'manual resend')}"
    return line


def cmd_resend(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.resend(args.message_id, endpoint_id=args.endpoint, conn=conn)
        _say(f"resending message {args.message_id} to {_plural(len(rows), 'endpoint')}: one "
             "manual attempt each, no retries (see `notifyq webhooks attempts "
             f"{args.message_id}`)")
        _emit(args, rows, "\n".join(str(r["run_id"]) for r in rows))
        return 0
    return _run(args, go)


def cmd_give_up(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        run_id = await app.webhooks.give_up(args.message_id, args.endpoint,
                                            reason=args.reason, conn=conn)
        _emit(args, {"message_id": args.message_id, "endpoint_id": args.endpoint,
                     "run_id": str(run_id)},
              f"gave up the delivery of message {args.message_id} to endpoint "
              f"{args.endpoint}: it failed ({args.reason}) and its run {run_id} is canceled")
        return 0
    return _run(args, go)


def _since(given: str) -> datetime:
    try:
        since = datetime.fromisoformat(given)
    except ValueError:
        raise InvalidEndpoint(f"--since {given!r} is not an ISO 8601 time") from None
    if since.tzinfo is None:
        raise InvalidEndpoint("--since needs a UTC offset (e.g. 2030-01-01T09:00Z)")
    return since


def cmd_recover(args: argparse.Namespace) -> int:
    since = _since(args.since)

    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.recover(args.endpoint_id, since, conn=conn)
        _emit(args, rows, _recovered_text(len(rows), args.endpoint_id, since))
        return 0
    return _run(args, go)


def _recovered_text(n: int, endpoint_id: str, since: datetime) -> str:
    what = f"of endpoint {endpoint_id} last attempted since {since.isoformat()}"
    if not n:
        return f"no failed delivery {what}: nothing to recover"
    return (f"recovered {_plural(n, 'failed delivery', 'failed deliveries')} {what}: each "
            "starts a new series of scheduled attempts")


# -- the event-type catalog ------------------------------------------------------------------

def _add_event_types(actions: Any, parser_class: Any) -> None:
    types = actions.add_parser("event-types", help="the event-type catalog: define, list, "
                                                   "delete")
    ops = types.add_subparsers(dest="op", required=True, parser_class=parser_class,
                               metavar="define|list|delete")
    define = ops.add_parser("define", help="add an event type (or change its description "
                                           "and schema)")
    define.add_argument("name", metavar="EVENT_TYPE")
    define.add_argument("--description", default="", help="for the people who subscribe")
    define.add_argument("--schema", metavar="FILE|JSON|-",
                        help="a JSON Schema (draft 2020-12) its payloads must match: a file, "
                             "the JSON itself, or - for stdin; without it, any JSON")
    define.set_defaults(func=cmd_event_types_define)
    listing = ops.add_parser("list", help="the catalog, by name")
    listing.set_defaults(func=cmd_event_types_list)
    delete = ops.add_parser("delete", help="remove an event type from the catalog")
    delete.add_argument("name", metavar="EVENT_TYPE")
    delete.set_defaults(func=cmd_event_types_delete)
    for parser in (define, listing, delete):
        _common(parser)


def _schema_arg(given: str | None) -> Any:
    if given is None:
        return None
    if given == "-":
        text = sys.stdin.read()
    elif given.lstrip().startswith("{"):
        text = given
    else:
        try:
            with open(given, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise InvalidEndpoint(f"--schema: cannot read {given}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidEndpoint(f"--schema is not JSON: {exc}") from None


def cmd_event_types_define(args: argparse.Namespace) -> int:
    schema = _schema_arg(args.schema)

    async def go(app: App, conn: AsyncConn) -> int:
        t = await app.webhooks.define_event_type(args.name, description=args.description,
                                                 schema=schema, conn=conn)
        _emit(args, t.to_json(), f"defined event type {t.name} "
                                 f"({'with a schema' if t.schema else 'any JSON payload'})")
        return 0
    return _run(args, go)


def cmd_event_types_list(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        items = await app.webhooks.event_types(conn=conn)
        _emit(args, [t.to_json() for t in items], "\n".join(
            f"{t.name}  {'schema' if t.schema else 'any JSON'}  {t.description}".rstrip()
            for t in items) or "no event types: the catalog is empty, so any type is sent")
        return 0
    return _run(args, go)


def cmd_event_types_delete(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        await app.webhooks.delete_event_type(args.name, conn=conn)
        _emit(args, {"deleted": args.name}, f"deleted event type {args.name} from the catalog")
        return 0
    return _run(args, go)


def cmd_replay_missing(args: argparse.Namespace) -> int:
    since = _since(args.since)

    async def go(app: App, conn: AsyncConn) -> int:
        r = await app.webhooks.replay_missing(args.endpoint_id, since, limit=args.limit,
                                              dry_run=args.dry_run, conn=conn)
        what = f"{_plural(r.count, 'message')} since {since.isoformat()}"
        if args.dry_run:
            text = (f"endpoint {args.endpoint_id} missed {'at least ' if r.more else ''}{what} "
                    "(dry run: nothing sent)")
        elif r.count:
            text = (f"replayed {what} to endpoint {args.endpoint_id}: each has a new delivery"
                    + ("; more are left: run it again" if r.more else ""))
        else:
            text = f"endpoint {args.endpoint_id} missed nothing since {since.isoformat()}"
        _emit(args, r.to_json(), text)
        return 0
    return _run(args, go)


def _portal_base(args: argparse.Namespace, settings: Settings) -> str:
    if args.url:
        return str(args.url)
    if settings.webhooks.portal_url:
        return settings.webhooks.portal_url
    return f"http://{settings.api.host}:{settings.api.port}"


def cmd_portal_link(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        del conn  # the link is written on a connection of its own
        link = await app.webhooks.portal.mint(args.tenant_id, ttl_s=args.ttl_s,
                                              read_only=args.read_only,
                                              base_url=_portal_base(args, app.settings))
        _say(f"portal link for tenant {link.tenant_id!r}"
             f"{' (read-only)' if link.read_only else ''}: opens once, until "
             f"{link.expires_at.isoformat(timespec='seconds')}")
        _emit(args, link.to_json(), link.url)
        return 0
    return _run(args, go)


def cmd_events(args: argparse.Namespace) -> int:
    async def go(app: App, conn: AsyncConn) -> int:
        rows = await app.webhooks.operator_events(kind=args.kind, endpoint_id=args.endpoint,
                                                  limit=args.limit, conn=conn)
        _emit(args, rows, "\n".join(_event_line(r) for r in rows) or "no operator events")
        return 0
    return _run(args, go)


def _event_line(row: dict[str, Any]) -> str:
    about = f"endpoint {row['endpoint_id']}" if row["endpoint_id"] else "retention"
    detail = ", ".join(f"{k}={v}" for k, v in sorted(row["detail"].items()) if v is not None)
    sent = "" if row["emitted_at"] else "  (not emitted yet)"
    return (f"{row['id']}  {when(row['created_at'])}  {row['kind']}  {about}  {detail}"
            f"{sent}")
