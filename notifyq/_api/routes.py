"""The ``/v1`` routes: jobs (enqueue, batch, get with steps and children, optionally waiting
until the run is finished, list, cancel, retry, replay from a step) and stats. Each is a thin
call into :class:`notifyq.App`.

Tenants: the routes about runs and signals pass the token's tenants (:data:`Tenants`, None for
a token of every tenant) to the queries as ``tenant_ids``; a run of another tenant is a 404 as
if it did not exist. What a tenant-scoped token enqueues belongs to one of its tenants
(:func:`tenant_for`). The routes about the whole cluster (stats, pools, workers, pauses,
schedules, keys) take ``read_all`` / ``admin_all``: 403 for a tenant-scoped token."""

from __future__ import annotations

import re
from contextlib import suppress
from dataclasses import replace
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Depends, Path, Query
from fastapi.responses import JSONResponse

from notifyq._api import schemas
from notifyq._api.cluster import add_cluster_routes, run_filter
from notifyq._api.schedules import add_schedule_routes
from notifyq._app import App
from notifyq._control import BulkOptions, RunFilter
from notifyq._enqueue.request import EnqueueRequest
from notifyq._enqueue.validate import encode_input
from notifyq._errors import (
    InvalidEnqueue,
    PayloadTooLarge,
    ResultTimeout,
    RunNotFound,
    UnknownStep,
)
from notifyq._http.auth import Authenticator, tenant_for, token_tenants
from notifyq._http.gate import SchemaGate
from notifyq._http.problems import problem
from notifyq._http.schemas import responses_for
from notifyq._keys.routes import add_key_routes
from notifyq._limits import (
    MAX_PAGE,
    MAX_RESULT_WAIT_S,
    MAX_SIGNAL_TOKEN_LEN,
)
from notifyq._run import Run
from notifyq._webhooks.routes import add_webhook_routes

DETAIL_LIMIT = 1000  # most steps / children shown with a job
_WAIT = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}

AUTH = (401, 403)
Tenants = Annotated[list[str] | None, Depends(token_tenants)]
"""The tenants of the request's token (None: every tenant), for the queries' ``tenant_ids``."""
AllowUnknownType = Annotated[bool | None, Query(description=(
    "enqueue even if no worker has registered the job type (default: the server's "
    "enqueue.allow_unknown_types); otherwise such a type is refused with 422"))]


def _run(run: Run) -> dict[str, Any]:
    return run.to_json()


def wait_seconds(text: str) -> float:
    """``?wait=``: ``30s``, ``500ms``, ``1m`` or plain seconds, at most ``MAX_RESULT_WAIT_S``."""
    found = _WAIT.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"wait must be a duration like 30s, 500ms or 1m, got {text!r}")
    seconds = float(found[1]) * _UNIT_S[found[2]]
    if seconds > MAX_RESULT_WAIT_S:
        raise ValueError(f"wait is at most {MAX_RESULT_WAIT_S:g}s, got {text!r}: ask again "
                         "when it runs out")
    return seconds


def _filter_of(body: schemas.FilterIn, tenants: list[str] | None = None) -> RunFilter:
    fields = body.model_dump()
    if body.status is not None:
        fields["status"] = body.status.value
    return RunFilter(**fields, tenant_ids=tenants)


async def _visible(app: App, run_id: UUID, tenants: list[str] | None) -> bool:
    """Whether the run is one of ``tenants``' (None: any), asked in SQL."""
    if tenants is None:
        return True
    async with (await app.pool()).connection() as conn:
        try:
            await app._control.get(conn, run_id, tenant_ids=tenants)
        except RunNotFound:
            return False
    return True


def build_router(app: App, auth: Authenticator, metrics_enqueued: Any) -> APIRouter:
    schema = Depends(SchemaGate(app))  # after the token check: strangers learn nothing
    read = [Depends(auth.require("read")), schema]
    admin = [Depends(auth.require("admin")), schema]
    # Operations about the whole cluster: a token limited to tenants is refused (403).
    read_all = [Depends(auth.require("read", every_tenant=True)), schema]
    admin_all = [Depends(auth.require("admin", every_tenant=True)), schema]
    router = APIRouter(prefix="/v1")

    @router.post("/jobs", dependencies=admin, status_code=201, response_model=schemas.RunOut,
                 responses={200: {"model": schemas.RunOut,
                                  "description": "a run with this dedupe_key exists"},
                            **responses_for(400, 409, 413, 422, *AUTH)},
                 summary="Enqueue a run")
    async def enqueue(body: schemas.EnqueueIn, tenants: Tenants,
                      allow_unknown_type: AllowUnknownType = None) -> JSONResponse:
        run, new = await app.enqueue_request(EnqueueRequest(
            job_type=body.job_type, input=body.input, run_at=body.run_at,
            priority=body.priority, pool=body.pool, max_attempts=body.max_attempts,
            dedupe_key=body.dedupe_key, tags=body.tags,
            tenant_id=tenant_for(body.tenant_id, tenants)),
            allow_unknown_type=allow_unknown_type)
        if new:
            metrics_enqueued.labels(run.job_type).inc()
        elif not await _visible(app, run.id, tenants):
            # Dedupe keys are per tenant (migration 0019), so a tenant's key only finds its own
            # runs; should one ever come back that this token cannot see, say no more.
            return problem(409, "dedupe_key is taken by a run this token cannot see: choose "
                           "another dedupe key", field="dedupe_key")
        return JSONResponse(_run(run), status_code=201 if new else 200)

    @router.post("/jobs/batch", dependencies=admin, status_code=201,
                 response_model=schemas.BatchOut, responses=responses_for(400, 413, 422, *AUTH),
                 summary="Enqueue many runs in one transaction")
    async def enqueue_batch(body: schemas.BatchIn, tenants: Tenants,
                            allow_unknown_type: AllowUnknownType = None) -> Any:
        runs = await app.enqueue_many(
            [{**job.model_dump(), "tenant_id": tenant_for(job.tenant_id, tenants)}
             for job in body.jobs], allow_unknown_type=allow_unknown_type)
        for run in runs:
            metrics_enqueued.labels(run.job_type).inc()
        return {"items": [_run(r) for r in runs]}

    @router.get("/jobs/{id}", dependencies=read, response_model=schemas.RunDetail,
                responses=responses_for(404, 422, *AUTH),
                summary="A run with its steps and children; with wait, once it is finished")
    async def get_job(id: UUID, tenants: Tenants, wait: Annotated[str | None, Query(description=(
            "wait up to this long (30s, 500ms, 1m; at most "
            f"{MAX_RESULT_WAIT_S:g}s) for the run to finish, woken when it does; the answer "
            "is the run as it is then, finished or not"))] = None) -> Any:
        if wait is not None:
            try:
                seconds = wait_seconds(wait)
            except ValueError as exc:
                return problem(422, str(exc), field="wait")
            if tenants is not None:  # 404 before waiting on another tenant's run
                async with (await app.pool()).connection() as conn:
                    await app._control.get(conn, id, tenant_ids=tenants)
            with suppress(ResultTimeout):  # not finished yet: the run as it is now
                await app._awaiter.finished(id, seconds)
        db = await app.pool()
        async with db.connection() as conn:
            detail = await app._control.detail(conn, id, limit=DETAIL_LIMIT, tenant_ids=tenants)
        return {**_run(detail.run), "steps": detail.steps,
                "children": [_run(c) for c in detail.children], "wait": detail.wait}

    @router.get("/jobs", dependencies=read, response_model=schemas.RunPage,
                responses=responses_for(422, *AUTH), summary="Runs, newest first")
    async def list_jobs(where: Annotated[RunFilter, Depends(run_filter)], tenants: Tenants,
                        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
                        cursor: Annotated[UUID | None, Query(
                            description="next_cursor of the previous page")] = None,
                        ) -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            runs = await app._control.list_filtered(conn, replace(where, tenant_ids=tenants),
                                                    limit=limit, before=cursor)
        return {"items": [_run(r) for r in runs],
                "next_cursor": str(runs[-1].id) if len(runs) == limit else None}

    _add_run_actions(router, app, admin)

    @router.get("/stats", dependencies=read_all, response_model=schemas.StatsOut,
                responses=responses_for(*AUTH), summary="Counts by type, pool and status")
    async def stats() -> dict[str, Any]:
        return (await app.stats()).to_json()

    add_cluster_routes(router, app, read_all, admin_all)
    add_schedule_routes(router, app, read_all, admin_all)
    _add_signals(router, app, admin)
    add_key_routes(router, app, read_all, admin_all)
    if app._webhooks is not None:  # only what this server does is in its OpenAPI document
        add_webhook_routes(router, app, read, admin, admin_all)
    return router


def _add_run_actions(router: APIRouter, app: App, admin: list[Any]) -> None:
    """Bulk actions, cancel, retry and replay: on the runs of the token's tenants only."""

    @router.post("/jobs/bulk", dependencies=admin, response_model=schemas.BulkOut,
                 responses=responses_for(422, *AUTH),
                 summary="Cancel, retry, delete or reschedule many runs: by id, or all that "
                         "match a filter, in batches (dry_run: only count them)")
    async def bulk(body: schemas.BulkIn, tenants: Tenants) -> Any:
        if (body.ids is None) == (body.filter is None):
            return problem(422, "give either ids or filter", field="body")
        options = BulkOptions(run_at=body.run_at, batch_size=body.batch_size)
        try:
            if not body.dry_run:  # a count needs no run_at
                options.check(body.action)
            where = _filter_of(body.filter, tenants) if body.filter is not None else None
        except ValueError as exc:
            return problem(422, str(exc), field="run_at" if "run_at" in str(exc) else "filter")
        async with (await app.pool()).connection() as conn:
            if body.dry_run:
                if where is None:
                    return problem(422, "dry_run counts a filter's runs; with ids, the count "
                                   "is theirs", field="dry_run")
                return {"action": body.action, "dry_run": True,
                        "matched": await app._control.count(conn, where, body.action)}
            result = await app._control.bulk(conn, body.action, ids=body.ids, where=where,
                                             options=options, tenant_ids=tenants)
        return {**result.to_json(), "dry_run": False}

    @router.post("/jobs/{id}/cancel", dependencies=admin, response_model=schemas.RunOut,
                 responses=responses_for(404, 409, 422, *AUTH),
                 summary="Cancel a pending or waiting run; ask a running one to stop")
    async def cancel(id: UUID, tenants: Tenants) -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            return _run(await app._control.cancel(conn, id, tenant_ids=tenants))

    @router.post("/jobs/{id}/retry", dependencies=admin, response_model=schemas.RunOut,
                 responses=responses_for(404, 409, 422, *AUTH),
                 summary="Put a failed, canceled or timed-out run back in line")
    async def retry(id: UUID, tenants: Tenants) -> dict[str, Any]:
        async with (await app.pool()).connection() as conn:
            return _run(await app._control.retry(conn, id, tenant_ids=tenants))

    @router.post("/jobs/{id}/replay", dependencies=admin, response_model=schemas.ReplayOut,
                 responses=responses_for(404, 409, 422, *AUTH),
                 summary="Run a finished durable run again from a step, reusing the steps "
                         "recorded before it")
    async def replay(id: UUID, body: schemas.ReplayIn, tenants: Tenants) -> Any:
        async with (await app.pool()).connection() as conn:
            try:
                done = await app._control.replay(conn, id, body.from_step, tenant_ids=tenants)
            except UnknownStep as exc:
                return problem(422, str(exc), field="from_step")
        return done.to_json()


def _add_signals(router: APIRouter, app: App, admin: list[Any]) -> None:
    """``POST /v1/signals/{token}`` when the App has durable runs' ``signal`` (it does once
    migration 0002 ships)."""
    signal = getattr(app, "signal", None)
    if signal is None:
        return

    @router.post("/signals/{token}", dependencies=admin, status_code=202,
                 response_model=schemas.SignalOut, responses=responses_for(400, 413, 422, *AUTH),
                 summary="Signal the run waiting on a token (queued for the next wait if none; "
                         "with a token limited to tenants, only a run of theirs waiting now, "
                         "else 404)")
    async def send_signal(
        token: Annotated[str, Path(min_length=1, max_length=MAX_SIGNAL_TOKEN_LEN,
                                   pattern=r"^[^\x00]+$")],
        tenants: Tenants,
        payload: Annotated[Any, Body(description="any JSON value; {} when absent")] = None,
    ) -> Any:
        try:
            if tenants is None:
                woken = await signal(token, payload)
            else:
                woken = await _tenant_signal(app, token, payload, tenants)
        except InvalidEnqueue as exc:
            status = 413 if isinstance(exc, PayloadTooLarge) else 422
            return problem(status, f"payload: {exc}", field="payload")
        if tenants is not None and not woken:
            return problem(404, "no run of this token's tenants waits on this signal token "
                           "(a token limited to tenants signals only runs waiting now: "
                           "nothing is queued)", field="token")
        return {"token": token, "woken": woken}


async def _tenant_signal(app: App, token: str, payload: Any, tenants: list[str]) -> int:
    """A signal for the runs of ``tenants`` only: delivered to one waiting now or dropped (a
    queued signal has no tenant: another tenant's run could take it)."""
    encode_input([payload])  # JSON and size check, as App.signal
    async with (await app.pool()).connection() as conn:
        return await app._control.signal(conn, token, {} if payload is None else payload,
                                         tenant_ids=tenants)


