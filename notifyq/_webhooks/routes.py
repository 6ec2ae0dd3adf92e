"""The ``/v1/webhooks`` routes: endpoints (CRUD, rotate secret, recover), messages (send, get,
attempts, resend, give-up). Thin calls into ``app.webhooks``; refusals are problem details like
every other route (422 naming the field, 404 for an unknown id, 409 without a keyring or for a
delivery that cannot be given up now).

Tenants: an endpoint belongs to the tenant it was created for (``tenant_id``, for good), a
message to the tenant of the one endpoint it was sent to. A token limited to tenants lists
only theirs (filtered in SQL), meets 404 for any other (the same answer as for an unknown
id, checked in SQL before the call: an endpoint's tenant never changes), creates endpoints
for its tenants and sends messages to one endpoint of theirs (``endpoint_id`` required)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from notifyq._app import App
from notifyq._errors import (
    ConfigError,
    InvalidEndpoint,
    InvalidEnqueue,
    InvalidTransition,
    WebhookNotFound,
)
from notifyq._http.auth import tenant_for, token_tenants
from notifyq._http.problems import problem
from notifyq._http.schemas import Text, responses_for
from notifyq._limits import MAX_PAGE
from notifyq._webhooks.endpoints import (
    MAX_DESCRIPTION_LEN,
    MAX_EVENT_TYPE_LEN,
    MAX_EVENT_TYPES,
    MAX_HEADER_NAME_LEN,
    MAX_HEADER_VALUE_LEN,
    MAX_IDEMPOTENCY_KEY_LEN,
    MAX_RATE_LIMIT,
    MAX_SECRET_LEN,
    MAX_URL_LENGTH,
)
from notifyq._webhooks.portal import MAX_LINK_TTL_S, MIN_LINK_TTL_S
from notifyq._webhooks.rows import Message
from notifyq._webhooks.service import (
    MAX_PAYLOAD_RETENTION_S,
    MAX_REPLAY,
    OPERATOR_EVENT_KINDS,
    WebhookMessage,
)

MESSAGE_ID = r"^[A-Za-z0-9_-]{1,64}$"
Header = dict[Annotated[str, Field(max_length=MAX_HEADER_NAME_LEN)],
              Annotated[Text, Field(max_length=MAX_HEADER_VALUE_LEN)]]
EventTypes = Annotated[list[Annotated[Text, Field(max_length=MAX_EVENT_TYPE_LEN)]],
                       Field(max_length=MAX_EVENT_TYPES)]
Description = Annotated[Text, Field(max_length=MAX_DESCRIPTION_LEN)]
Secret = Annotated[str, Field(max_length=MAX_SECRET_LEN)]
Tenants = Annotated[list[str] | None, Depends(token_tenants)]
TenantId = Annotated[Text, Field(min_length=1, max_length=512)]
RateLimit = Annotated[int, Field(ge=1, le=MAX_RATE_LIMIT, strict=True, description=(
    "deliveries per second at most, across all workers; null: unlimited"))]
ORDERED = ("one delivery at a time, in send order, each after the one before succeeded or was "
           "given up (POST /v1/webhooks/messages/{id}/give-up)")




class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointIn(_In):
    url: Annotated[Text, Field(min_length=1, max_length=MAX_URL_LENGTH)]
    description: Description = ""
    event_types: EventTypes | None = Field(None, description="null: every event type")
    headers: Header | None = None
    secret: Secret | None = Field(
        None, description="whsec_ + base64 of 24-64 bytes; generated when absent")
    enabled: bool = True
    tenant_id: TenantId | None = Field(None, description=(
        "the tenant it belongs to, for good; a token limited to one tenant sets its own"))
    rate_limit: RateLimit | None = None
    ordered: bool = Field(False, description=ORDERED)


class EndpointPatch(_In):
    url: Annotated[Text, Field(min_length=1, max_length=MAX_URL_LENGTH)] | None = None
    description: Description | None = None
    event_types: EventTypes | None = None
    headers: Header | None = None
    enabled: bool | None = None
    rate_limit: RateLimit | None = Field(None, description=(
        "deliveries per second at most; null: unlimited; absent: unchanged"))
    ordered: bool | None = Field(None, description=ORDERED)


class CircuitOut(BaseModel):
    state: Literal["closed", "open", "half_open"] = Field(description=(
        "open: deliveries are parked until open_until; half_open: the next delivery is a "
        "probe that closes or reopens it"))
    consecutive_failures: int
    open_until: datetime | None


class EndpointOut(BaseModel):
    id: UUID
    url: str
    description: str
    event_types: list[str] | None
    headers: dict[str, str]
    enabled: bool
    disabled_at: datetime | None
    disabled_reason: str | None
    failing_since: datetime | None
    created_at: datetime
    updated_at: datetime
    valid_secrets: int
    tenant_id: str | None = None
    rate_limit: int | None = Field(None, description="deliveries per second at most; null: "
                                                     "unlimited")
    ordered: bool = Field(False, description=ORDERED)
    circuit: CircuitOut
    secret: str | None = Field(None, description="only in the answer to create and "
                                                 "rotate-secret: store it now")


class EndpointPage(BaseModel):
    items: list[EndpointOut]
    next_cursor: UUID | None = None


class RotateIn(_In):
    secret: Secret | None = None
    grace_s: Annotated[float, Field(ge=0, le=30 * 86_400)] | None = None


class RecoverIn(_In):
    since: AwareDatetime


class ReplayIn(_In):
    since: AwareDatetime
    limit: Annotated[int, Field(ge=1, le=MAX_REPLAY)] = 10_000
    dry_run: bool = Field(False, description="count what would be sent; change nothing")


class MessageIn(_In):
    event_type: Annotated[Text, Field(min_length=1, max_length=MAX_EVENT_TYPE_LEN)]
    payload: dict[str, Any] | list[Any]
    endpoint_id: UUID | None = None
    idempotency_key: Annotated[Text, Field(min_length=1,
                                           max_length=MAX_IDEMPOTENCY_KEY_LEN)] | None = None
    payload_retention_s: Annotated[float, Field(gt=0, le=MAX_PAYLOAD_RETENTION_S)] | None = Field(
        None, description="drop this message's payload this long after it is sent (default: "
                          "webhooks.payload_retention_s)")


class MessageOut(BaseModel):
    id: str
    created: bool
    deliveries: int


MAX_BATCH_MESSAGES = 1000


class MessageBatchIn(_In):
    messages: Annotated[list[MessageIn], Field(min_length=1, max_length=MAX_BATCH_MESSAGES)]


class MessageBatchOut(BaseModel):
    items: list[MessageOut]


class ResendIn(_In):
    endpoint_id: UUID | None = None


class GiveUpIn(_In):
    endpoint_id: UUID
    reason: Annotated[Text, Field(min_length=1, max_length=MAX_DESCRIPTION_LEN)] = (
        "given up by hand")


class GiveUpOut(BaseModel):
    message_id: str
    endpoint_id: UUID
    run_id: UUID = Field(description="the delivery's run, now canceled")


def _endpoint_field(message: str) -> str:
    head = message.split(":", 1)[0]
    return head if head in ("url", "headers", "event_types", "secret", "grace_s", "schema",
                            "description", "endpoint", "limit", "reason", "ttl_s",
                            "tenant_id", "rate_limit") else "body"


async def _answer(call: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await call()
    except InvalidEndpoint as exc:
        return problem(422, str(exc), field=_endpoint_field(str(exc)))
    except WebhookNotFound as exc:
        return problem(404, str(exc), field="id")
    except InvalidEnqueue as exc:
        return problem(422, str(exc), field="body")
    except ConfigError as exc:
        return problem(409, str(exc), field="keys")
    except InvalidTransition as exc:
        return problem(409, str(exc), field="id")


async def _endpoint_in(app: App, endpoint_id: UUID, tenants: list[str] | None) -> None:
    """WebhookNotFound (404) unless the endpoint is one of ``tenants``' (None: any)."""
    if tenants is not None and not await _row_in(
            app, app._runtime.queries.webhook_endpoint_in_tenants, endpoint_id, tenants):
        raise WebhookNotFound(f"no webhook endpoint {endpoint_id}")


async def _message_in(app: App, message_id: str, tenants: list[str] | None) -> None:
    """WebhookNotFound (404) unless the message is one of ``tenants``' (None: any)."""
    if tenants is not None and not await _row_in(
            app, app._runtime.queries.webhook_message_in_tenants, message_id, tenants):
        raise WebhookNotFound(f"no webhook message {message_id}")


async def _row_in(app: App, query: Any, key: Any, tenants: list[str]) -> bool:
    async with (await app.pool()).connection() as conn:
        cur = await conn.execute(query, {"id": key, "tenant_ids": tenants})
        return await cur.fetchone() is not None


def add_webhook_routes(router: APIRouter, app: App, read: list[Any], admin: list[Any],
                       admin_all: list[Any]) -> None:
    _add_endpoint_routes(router, app, read, admin)
    _add_message_routes(router, app, read, admin)
    _add_event_type_routes(router, app, read, admin_all)
    _add_portal_routes(router, app, admin)
    _add_operator_event_routes(router, app, read)


class PortalLinkIn(_In):
    tenant_id: TenantId | None = Field(None, description=(
        "the tenant whose endpoints the link opens; a token limited to one tenant may leave "
        "it out"))
    ttl_s: Annotated[float, Field(ge=MIN_LINK_TTL_S, le=MAX_LINK_TTL_S)] | None = Field(
        None, description="seconds the link stays valid (default webhooks.portal_link_ttl_s)")
    read_only: bool = Field(False, description="the customer sees, but changes nothing")


class PortalLinkOut(BaseModel):
    url: str = Field(description="opens the customer portal once; the code is in the fragment "
                                 "(never sent to a server, so in no log)")
    tenant_id: str
    read_only: bool
    expires_at: datetime


def _add_portal_routes(router: APIRouter, app: App, admin: list[Any]) -> None:
    @router.post("/portal/links", dependencies=admin, status_code=201,
                 response_model=PortalLinkOut, responses=responses_for(409, 422, 401, 403),
                 tags=["webhooks"],
                 summary="Mint a one-time, short-lived sign-in link to the customer portal "
                         "for one tenant")
    async def mint_portal_link(body: PortalLinkIn, tenants: Tenants, request: Request) -> Any:
        tenant_id = tenant_for(body.tenant_id, tenants)
        if tenant_id is None:
            return problem(422, "tenant_id: required (the portal shows one tenant's "
                           "endpoints)", field="tenant_id")

        async def go() -> Any:
            link = await app.webhooks.portal.mint(
                tenant_id, ttl_s=body.ttl_s, read_only=body.read_only,
                base_url=app.settings.webhooks.portal_url or str(request.base_url))
            return JSONResponse(link.to_json(), status_code=201)
        return await _answer(go)



OperatorEventKind = Literal["endpoint.disabled", "endpoint.circuit_opened",
                            "endpoint.circuit_closed", "endpoint.failing", "retention.purged"]
assert set(get_args(OperatorEventKind)) == set(OPERATOR_EVENT_KINDS)  # noqa: S101


class OperatorEventOut(BaseModel):
    id: int
    kind: OperatorEventKind
    endpoint_id: UUID | None
    tenant_id: str | None
    detail: dict[str, Any] = Field(description=(
        "endpoint.disabled: reason, cause (gone, failing, operator), failing_since; "
        "endpoint.circuit_opened: open_until, consecutive_failures, failing_since; "
        "endpoint.circuit_closed: cause (success, enabled), failing_since; endpoint.failing: "
        "failing_since, failing_for_s, consecutive_failures; retention.purged: runs_deleted, "
        "signals_expired and the retentions"))
    created_at: datetime
    emitted_at: datetime | None = Field(description="when the leader logged, counted and sent "
                                        "it; null: within webhooks.operator_events_interval_s")
    message_id: str | None = Field(description="the message it was sent as to "
                                   "webhooks.operator_endpoint_id; null: none configured")


class OperatorEventList(BaseModel):
    items: list[OperatorEventOut]
    next_cursor: int | None


def _add_operator_event_routes(router: APIRouter, app: App, read: list[Any]) -> None:
    @router.get("/webhooks/operator-events", dependencies=read,
                response_model=OperatorEventList, responses=responses_for(422, 401, 403),
                tags=["webhooks"],
                summary="Operator events, newest first: endpoints disabled, circuits opened "
                        "and closed, endpoints failing for long, purge passes")
    async def list_operator_events(
        tenants: Tenants,
        kind: OperatorEventKind | None = None,
        endpoint_id: UUID | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: Annotated[int | None, Query(ge=1)] = None,
    ) -> Any:
        rows = await app.webhooks.operator_events(kind=kind, endpoint_id=endpoint_id,
                                                  before=cursor, limit=limit,
                                                  tenant_ids=tenants)
        return {"items": [_plain(r) for r in rows],
                "next_cursor": rows[-1]["id"] if len(rows) == limit else None}


class EventTypeIn(_In):
    description: Description = ""
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="a JSON Schema (draft 2020-12) its payloads must "
        "match; null: any JSON")


class EventTypeOut(BaseModel):
    name: str
    description: str
    schema_: dict[str, Any] | None = Field(alias="schema")
    created_at: datetime
    updated_at: datetime


class EventTypeList(BaseModel):
    items: list[EventTypeOut]


EventTypeName = Annotated[str, PathParam(max_length=MAX_EVENT_TYPE_LEN)]


def _add_event_type_routes(router: APIRouter, app: App, read: list[Any],
                           admin_all: list[Any]) -> None:
    auth = (401, 403)

    @router.get("/webhooks/event-types", dependencies=read, response_model=EventTypeList,
                responses=responses_for(*auth), tags=["webhooks"],
                summary="The event-type catalog: each type's description and schema")
    async def list_event_types(tenants: Tenants) -> Any:
        del tenants  # one catalog for every tenant: what an application sends its customers
        return {"items": [t.to_json() for t in await app.webhooks.event_types()]}

    @router.put("/webhooks/event-types/{name}", dependencies=admin_all,
                response_model=EventTypeOut, responses=responses_for(422, *auth),
                tags=["webhooks"],
                summary="Add an event type to the catalog, or change its description and "
                        "schema (a token limited to tenants may not)")
    async def define_event_type(name: EventTypeName, body: EventTypeIn) -> Any:
        async def go() -> Any:
            return (await app.webhooks.define_event_type(
                name, description=body.description, schema=body.schema_)).to_json()
        return await _answer(go)

    @router.delete("/webhooks/event-types/{name}", dependencies=admin_all, status_code=204,
                   response_model=None, response_class=Response,
                   responses=responses_for(404, *auth), tags=["webhooks"],
                   summary="Remove an event type from the catalog")
    async def delete_event_type(name: EventTypeName) -> Response:
        async def go() -> Any:
            await app.webhooks.delete_event_type(name)
            return Response(status_code=204)
        answer: Response = await _answer(go)
        return answer


def _add_endpoint_routes(router: APIRouter, app: App, read: list[Any],
                         admin: list[Any]) -> None:
    auth = (401, 403)

    @router.post("/webhooks/endpoints", dependencies=admin, status_code=201,
                 response_model=EndpointOut, responses=responses_for(409, 422, *auth),
                 tags=["webhooks"], summary="Create an endpoint (its secret is shown once)")
    async def create_endpoint(body: EndpointIn, tenants: Tenants) -> Any:
        tenant_id = tenant_for(body.tenant_id, tenants)

        async def go() -> Any:
            endpoint = await app.webhooks.create_endpoint(
                body.url, description=body.description, event_types=body.event_types,
                headers=body.headers, secret=body.secret, enabled=body.enabled,
                tenant_id=tenant_id, rate_limit=body.rate_limit, ordered=body.ordered)
            return JSONResponse(endpoint.to_json(), status_code=201)
        return await _answer(go)

    @router.get("/webhooks/endpoints", dependencies=read, response_model=EndpointPage,
                responses=responses_for(422, *auth), tags=["webhooks"], summary="Endpoints")
    async def list_endpoints(
        tenants: Tenants,
        enabled: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: UUID | None = None,
    ) -> Any:
        items = await app.webhooks.list_endpoints(enabled=enabled, limit=limit, after=cursor,
                                                  tenant_ids=tenants)
        return {"items": [e.to_json() for e in items],
                "next_cursor": str(items[-1].id) if len(items) == limit else None}

    @router.get("/webhooks/health", dependencies=read, responses=responses_for(422, *auth),
                tags=["webhooks"],
                summary="Per endpoint: attempts and success rate in the last day, the last "
                        "attempt and the last failure")
    async def health(tenants: Tenants,
                     window_s: Annotated[float, Query(gt=0, le=30 * 86_400)] = 86_400.0,
                     ) -> Any:
        rows = await app.webhooks.health(window_s=window_s, tenant_ids=tenants)
        return {"items": [_plain(r) for r in rows]}

    @router.get("/webhooks/endpoints/{id}", dependencies=read, response_model=EndpointOut,
                responses=responses_for(404, 422, *auth), tags=["webhooks"], summary="An endpoint")
    async def get_endpoint(id: UUID, tenants: Tenants) -> Any:
        async def go() -> Any:
            await _endpoint_in(app, id, tenants)
            return (await app.webhooks.get_endpoint(id)).to_json()
        return await _answer(go)

    @router.patch("/webhooks/endpoints/{id}", dependencies=admin, response_model=EndpointOut,
                  responses=responses_for(404, 422, *auth), tags=["webhooks"],
                  summary="Change an endpoint; enabled=false disables it (pending deliveries "
                          "stop), true enables it")
    async def patch_endpoint(id: UUID, body: EndpointPatch, tenants: Tenants) -> Any:
        async def go() -> Any:
            await _endpoint_in(app, id, tenants)
            given = body.model_fields_set
            changes: dict[str, Any] = {k: getattr(body, k) for k in
                                       ("url", "description", "headers") if k in given}
            for field in ("event_types", "rate_limit"):  # null means something: sent as is
                if field in given:
                    changes[field] = getattr(body, field)
            if body.ordered is not None:
                changes["ordered"] = body.ordered
            endpoint = await app.webhooks.update_endpoint(id, **changes)
            if body.enabled is True:
                endpoint = await app.webhooks.enable_endpoint(id)
            elif body.enabled is False:
                endpoint = await app.webhooks.disable_endpoint(id, "disabled through the admin API")
            return endpoint.to_json()
        return await _answer(go)

    @router.delete("/webhooks/endpoints/{id}", dependencies=admin, status_code=204,
                   response_model=None, response_class=Response,
                   responses=responses_for(404, 422, *auth), tags=["webhooks"],
                   summary="Delete an endpoint with its deliveries and attempts")
    async def delete_endpoint(id: UUID, tenants: Tenants) -> Response:
        async def go() -> Any:
            await _endpoint_in(app, id, tenants)
            await app.webhooks.delete_endpoint(id)
            return Response(status_code=204)
        answer: Response = await _answer(go)
        return answer

    @router.post("/webhooks/endpoints/{id}/rotate-secret", dependencies=admin,
                 response_model=EndpointOut, responses=responses_for(404, 409, 422, *auth),
                 tags=["webhooks"],
                 summary="A new secret (shown once); the old one signs during the grace period")
    async def rotate_secret(id: UUID, tenants: Tenants, body: RotateIn | None = None) -> Any:
        options = body or RotateIn()

        async def go() -> Any:
            await _endpoint_in(app, id, tenants)
            return await _json(app.webhooks.rotate_secret(
                id, secret=options.secret, grace_s=options.grace_s))
        return await _answer(go)

    @router.post("/webhooks/endpoints/{id}/recover", dependencies=admin, status_code=202,
                 responses=responses_for(404, 422, *auth), tags=["webhooks"],
                 summary="Re-enqueue the endpoint's failed deliveries since a time")
    async def recover(id: UUID, body: RecoverIn, tenants: Tenants) -> Any:
        async def go() -> Any:
            await _endpoint_in(app, id, tenants)
            rows = await app.webhooks.recover(id, body.since)
            return JSONResponse({"recovered": len(rows), "items": [
                {"message_id": r["message_id"], "run_id": str(r["run_id"])} for r in rows]},
                status_code=202)
        return await _answer(go)

    @router.post("/webhooks/endpoints/{id}/replay-missing", dependencies=admin, status_code=202,
                 responses=responses_for(404, 422, *auth), tags=["webhooks"],
                 summary="Send the endpoint the messages since a time that it never got "
                         "(disabled, canceled, or subscribed later); dry_run counts them")
    async def replay_missing(id: UUID, body: ReplayIn, tenants: Tenants) -> Any:
        async def go() -> Any:
            await _endpoint_in(app, id, tenants)
            replayed = await app.webhooks.replay_missing(id, body.since, limit=body.limit,
                                                         dry_run=body.dry_run)
            return JSONResponse(replayed.to_json(), status_code=200 if body.dry_run else 202)
        return await _answer(go)



def _add_message_routes(router: APIRouter, app: App, read: list[Any],
                        admin: list[Any]) -> None:
    auth = (401, 403)

    @router.get("/webhooks/messages", dependencies=read, responses=responses_for(422, *auth),
                tags=["webhooks"],
                summary="Messages, newest first; with endpoint_id, that endpoint's deliveries")
    async def list_messages(
        tenants: Tenants,
        endpoint_id: UUID | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: Annotated[str | None, Query(pattern=MESSAGE_ID)] = None,
    ) -> Any:
        if endpoint_id is not None:
            try:
                await _endpoint_in(app, endpoint_id, tenants)
            except WebhookNotFound as exc:
                return problem(404, str(exc), field="endpoint_id")
        rows = await app.webhooks.list_messages(endpoint_id=endpoint_id, before=cursor,
                                                limit=limit, tenant_ids=tenants)
        return {"items": [_plain(r) for r in rows],
                "next_cursor": rows[-1]["id"] if len(rows) == limit else None}

    @router.post("/webhooks/messages", dependencies=admin, status_code=201,
                 response_model=MessageOut,
                 responses={200: {"model": MessageOut,
                                  "description": "a message with this idempotency_key exists"},
                            **responses_for(413, 422, *auth)},
                 tags=["webhooks"], summary="Send a message to one endpoint or by event type")
    async def send(body: MessageIn, tenants: Tenants) -> Any:
        if tenants is not None and body.endpoint_id is None:
            return problem(422, "endpoint_id: required with a token limited to tenants (a "
                           "message by event type would reach other tenants' endpoints)",
                           field="endpoint_id")

        async def go() -> Any:
            if body.endpoint_id is not None:
                await _endpoint_in(app, body.endpoint_id, tenants)
            sent = await app.webhooks.send(body.event_type, body.payload,
                                    endpoint_id=body.endpoint_id,
                                    idempotency_key=body.idempotency_key,
                                    payload_retention_s=body.payload_retention_s)
            return JSONResponse(sent.to_json(), status_code=201 if sent.created else 200)
        return await _answer(go)

    @router.post("/webhooks/messages/batch", dependencies=admin, status_code=201,
                 response_model=MessageBatchOut, responses=responses_for(413, 422, *auth),
                 tags=["webhooks"],
                 summary="Send many messages in one transaction, all or nothing")
    async def send_batch(body: MessageBatchIn, tenants: Tenants) -> Any:
        if tenants is not None:
            for n, message in enumerate(body.messages):
                if message.endpoint_id is None:
                    return problem(422, f"messages[{n}].endpoint_id: required with a token "
                                   "limited to tenants (a message by event type would reach "
                                   "other tenants' endpoints)", field=f"messages[{n}].endpoint_id")

        async def go() -> Any:
            if tenants is not None:
                for endpoint_id in {m.endpoint_id for m in body.messages}:
                    await _endpoint_in(app, endpoint_id, tenants)  # type: ignore[arg-type]
            sent = await app.webhooks.send_many([
                WebhookMessage(m.event_type, m.payload, endpoint_id=m.endpoint_id,
                               idempotency_key=m.idempotency_key,
                               payload_retention_s=m.payload_retention_s)
                for m in body.messages])
            return {"items": [s.to_json() for s in sent]}
        return await _answer(go)

    @router.get("/webhooks/messages/{id}", dependencies=read,
                responses=responses_for(404, *auth), tags=["webhooks"],
                summary="A message with its deliveries")
    async def get_message(id: Annotated[str, PathParam(pattern=MESSAGE_ID)],
                          tenants: Tenants) -> Any:
        async def go() -> Any:
            await _message_in(app, id, tenants)
            return await _jsonable(app.webhooks.message(id))
        return await _answer(go)

    @router.get("/webhooks/messages/{id}/attempts", dependencies=read,
                responses=responses_for(404, *auth), tags=["webhooks"],
                summary="Every attempt of a message, oldest first")
    async def attempts(id: Annotated[str, PathParam(pattern=MESSAGE_ID)],
                       tenants: Tenants) -> Any:
        async def go() -> Any:
            await _message_in(app, id, tenants)
            return {"items": [_plain(r) for r in await app.webhooks.attempts(id)]}
        return await _answer(go)

    @router.post("/webhooks/messages/{id}/resend", dependencies=admin, status_code=202,
                 responses=responses_for(404, 409, 422, *auth), tags=["webhooks"],
                 summary="A manual attempt (no retries) to every endpoint of the message, or "
                         "one")
    async def resend(id: Annotated[str, PathParam(pattern=MESSAGE_ID)], tenants: Tenants,
                     body: ResendIn | None = None) -> Any:
        async def go() -> Any:
            await _message_in(app, id, tenants)
            rows = await app.webhooks.resend(id, endpoint_id=(body or ResendIn()).endpoint_id)
            return JSONResponse({"items": [_plain(r) for r in rows]}, status_code=202)
        return await _answer(go)

    @router.post("/webhooks/messages/{id}/give-up", dependencies=admin,
                 response_model=GiveUpOut, responses=responses_for(404, 409, 422, *auth),
                 tags=["webhooks"],
                 summary="Give up the message's pending delivery to one endpoint (it fails, its "
                         "run is canceled): an ordered endpoint's next message goes")
    async def give_up(id: Annotated[str, PathParam(pattern=MESSAGE_ID)], body: GiveUpIn,
                      tenants: Tenants) -> Any:
        async def go() -> Any:
            await _message_in(app, id, tenants)
            await _endpoint_in(app, body.endpoint_id, tenants)
            run_id = await app.webhooks.give_up(id, body.endpoint_id, reason=body.reason)
            return {"message_id": id, "endpoint_id": str(body.endpoint_id),
                    "run_id": str(run_id)}
        return await _answer(go)


async def _json(pending: Awaitable[Any]) -> Any:
    return (await pending).to_json()


async def _jsonable(pending: Awaitable[Message]) -> Any:
    message = await pending
    return {**_plain(message), "deliveries": [_plain(d) for d in message["deliveries"]]}


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else
                str(v) if isinstance(v, UUID) else v) for k, v in row.items()}
