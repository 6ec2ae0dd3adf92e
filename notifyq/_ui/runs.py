"""Runs: the filtered, paged list (newest first, the API's cursor paging) with bulk cancel and
retry of a selection or of the whole filter (counted, then confirmed), and a run's detail:
input, output, error with its stack, the durable step timeline, children, what it waits for,
and the actions cancel, retry and send a signal."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from notifyq._app import App
from notifyq._control import (
    BULK_MAX,
    COUNT_CAP,
    RUN_STATES,
    BulkAction,
    Count,
    RunDetail,
    RunFilter,
)
from notifyq._errors import InvalidEnqueue, InvalidTransition, RunNotFound
from notifyq._pause import Pause
from notifyq._ui.web import Problem, Signed, Ui, query, read_form_lists, redirect, utc_time

PAGE = 50
STATES_BUDGET_S = 0.12
MATCHING_BUDGET_S = 0.05
CONFIRM_BUDGET_S = 0.15
"""The time the state tabs' counts share, the "N matching" count's and a bulk confirmation's
count's: a count planned to read much of the table (a rare filter over tens of millions of
runs, without a time range), or still reading at the end, is shown as the planner's estimate.
Together under the 200 ms a dashboard request may take on 10 million runs (issue 33)."""
SUFFIX_WINDOW = timedelta(hours=6)
FILTERS = ("status", "type", "pool", "tag", "tenant", "scope", "scope_id", "from", "to", "q",
           "due", "finished", "worker")
FINISHED_WITHIN = {"1h": 3600, "24h": 24 * 3600, "7d": 7 * 24 * 3600}
"""The ``finished`` filter's choices: finished in the last hour, day or week."""
DONE = {"cancel": "Canceled", "retry": "Put back in line", "signal": "Signal sent",
        "replay": "Replaying from the step", "delete": "Deleted", "reschedule": "Rescheduled",
        "pause_type": "Job type paused", "resume_type": "Job type resumed"}


def run_filter(params: dict[str, str]) -> RunFilter:
    """The list's filter from its form fields (a Problem page, 422, naming a bad one).
    ``status`` is a state of ``RUN_STATES`` (``pending``: runnable now; ``due`` overrides
    when given), or several statuses comma-separated (the overview's "failed" counts
    timed-out runs too)."""
    finished = params.get("finished")
    if finished is not None and finished not in FINISHED_WITHIN:
        raise Problem(422, "Invalid filter", f"finished: {finished!r} is not one of "
                      f"{', '.join(FINISHED_WITHIN)}")
    prefix, suffix = id_search(params.get("q", ""))
    try:
        after, before = utc_time(params, "from"), utc_time(params, "to")
        if suffix_bounded(params):
            after = (before or datetime.now(UTC)) - SUFFIX_WINDOW
        return RunFilter(
            **_states(params), finished_within_s=FINISHED_WITHIN[finished] if finished else None,
            leased_by=params.get("worker"), job_type=params.get("type"), pool=params.get("pool"),
            tag=params.get("tag"), tenant_id=params.get("tenant"),
            scope_entity_type=params.get("scope"), scope_entity_id=params.get("scope_id"),
            created_after=after, created_before=before, id_prefix=prefix, id_suffix=suffix)
    except ValueError as exc:
        raise Problem(422, "Invalid filter", str(exc)) from None


def _states(params: dict[str, str]) -> dict[str, Any]:
    """RunFilter's fields of the ``status`` and ``due`` parameters (RunFilter checks them)."""
    statuses = tuple(params["status"].split(",")) if params.get("status") else ()
    if len(statuses) > 1:
        fields: dict[str, Any] = {"status_in": statuses}
    elif statuses:
        fields = dict(RUN_STATES.get(statuses[0], {"status": statuses[0]}))
    else:
        fields = {}
    return fields | ({"due": params["due"]} if params.get("due") else {})


def id_search(text: str) -> tuple[str | None, str | None]:
    """What the Run id box takes: an id's start (``0193a2f0``), its end as the lists show it
    (``…9c3e3db5``, or ``...9c3e3db5``), or both (``0193a2f0…3db5``)."""
    head, tail = text, ""
    for mark in ("\u2026", "..."):
        if mark in text:
            head, _, tail = text.partition(mark)
            break
    return head.strip() or None, tail.strip() or None


def suffix_bounded(params: dict[str, str]) -> bool:
    """An id's end alone (no id start, no "from") is searched among the runs created in the
    ``SUFFIX_WINDOW`` before "to" (or now) only: it is checked run by run in the primary key
    (1.4 million runs a day at 10 million a week: 0.7-0.9 s on a busy 2-core machine; 6 hours
    keep it under 200 ms), where an id's start or a time range is a range of the key."""
    prefix, suffix = id_search(params.get("q", ""))
    return suffix is not None and prefix is None and not params.get("from")


def run_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise Problem(422, "Not a run id", f"{text[:80]!r} is not a run id (a UUID)") from None


def add_run_pages(router: APIRouter, app: App, ui: Ui) -> None:
    control = app._control

    async def listing(request: Request, *, whole: bool = False) -> dict[str, Any]:
        """The list's rows; for the ``whole`` page also the state tabs (their counts come
        after, from ``/runs/counts``) and the known job types and pools."""
        params = query(request.query_params, *FILTERS, "cursor")
        where = run_filter(params)
        before = run_id(params["cursor"]) if "cursor" in params else None
        filters = {k: v for k, v in params.items() if k != "cursor"}
        page: dict[str, Any] = {}
        async with (await app.pool()).connection() as conn:
            runs = await control.list_with_tenants(conn, where, limit=PAGE, before=before)
            if whole:
                page = _tabs(filters, dict.fromkeys(RUN_STATES))
                page["job_types"] = await control.job_types(conn)
        return {"runs": runs, "filters": filters, "statuses": RUN_STATES, **page,
                "cap": COUNT_CAP, "now": datetime.now(UTC),
                "suffix_window": suffix_bounded(params),
                "next_cursor": str(runs[-1].run.id) if len(runs) == PAGE else None,
                "live": before is None}

    @router.get("/runs", response_class=HTMLResponse)
    async def runs(request: Request, viewer: Signed) -> Response:
        text = request.query_params.get("q", "").strip()
        if len(text) >= 32:
            try:
                return redirect(request, f"/runs/{UUID(text)}")
            except ValueError:
                pass
        return ui.page(request, viewer, "runs.html", **await listing(request, whole=True),
                       done=_done(request))

    @router.get("/runs/rows", response_class=HTMLResponse)
    async def rows(request: Request, viewer: Signed) -> Response:
        return ui.page(request, viewer, "runs_rows.html", **await listing(request))

    _add_bulk(router, app, ui)
    _add_counts(router, app, ui)

    @router.get("/runs/{id}", response_class=HTMLResponse)
    async def detail(request: Request, id: str, viewer: Signed) -> Response:
        try:
            target = UUID(id)
        except ValueError:
            return await _lookup(request, app, id)
        try:
            async with (await app.pool()).connection() as conn:
                found = await control.detail(conn, target, limit=200)
        except RunNotFound:
            raise Problem(404, "No such run", f"there is no run {id} (it may have been "
                          "purged after its retention)") from None
        return ui.page(request, viewer, "run.html", detail=found, run=found.run,
                       done=_done(request), live=not found.run.status.terminal,
                       waiting_step=_waiting_step(found),
                       type_paused=await type_pause(app, found.run.job_type))

    @router.post("/runs/{id}/{action}")
    async def act(request: Request, id: str, action: str) -> Response:
        form = await ui.form(request)
        target = run_id(id)
        try:
            if action == "cancel":
                await app.cancel(target)
            elif action == "retry":
                await app.retry(target)
            elif action == "signal":
                woken = await _signal(app, form)
                return redirect(request, f"/runs/{target}", done="signal", woken=str(woken))
            else:
                raise Problem(404, "Not found", f"no action {action!r}")
        except RunNotFound:
            raise Problem(404, "No such run", f"there is no run {target}") from None
        except InvalidTransition as exc:
            raise Problem(409, f"Cannot {action} this run", str(exc)) from None
        return redirect(request, f"/runs/{target}", done=action)


async def _lookup(request: Request, app: App, text: str) -> Response:
    """A run's address with a short id (``/runs/…9c3e3db5``): to the run it names, or to
    the list when it names several."""
    async with (await app.pool()).connection() as conn:
        found = await app._control.list_filtered(conn, run_filter({"q": text}), limit=2)
    if len(found) == 1:
        return redirect(request, f"/runs/{found[0].id}")
    if found:
        return redirect(request, "/runs", q=text)
    raise Problem(404, "No such run", f"no run matches {text[:80]!r} (it may have been "
                  "purged after its retention)")


def _tabs(filters: dict[str, str], counts: dict[str, Count | None]) -> dict[str, Any]:
    """A tab per state (and "all") with its count and link: each count stops at
    ``COUNT_CAP`` (shown "10,000+"), or is an estimate (shown "≈"), the total of "all" with one
    that did either is so too. A count of None is not known (yet, on the page before
    ``/runs/counts`` answers; or at all, when not even its estimate came within the budget):
    "all" is then the sum of the known ones, with a "+"."""
    others = {k: v for k, v in filters.items() if k not in ("status", "due")}
    current = None if "due" in filters else filters.get("status")
    known = [c for c in counts.values() if c is not None]
    total = Count(sum(c.n for c in known), estimated=any(c.estimated for c in known))
    tabs = [{"state": None, "label": "all", "count": total if known else None,
             "more": len(known) < len(counts) or any(c.capped for c in known),
             "query": others}]
    tabs += [{"state": state, "label": state.replace("_", " "), "count": c,
              "more": c is not None and c.capped, "query": {**others, "status": state}}
             for state, c in counts.items()]
    for tab in tabs:
        tab["current"] = tab["state"] == current
    return {"tabs": tabs}


def _add_counts(router: APIRouter, app: App, ui: Ui) -> None:
    control = app._control

    @router.get("/runs/counts", response_class=HTMLResponse)
    async def counts(request: Request, viewer: Signed) -> Response:
        """The state tabs with their counts and the filter's "N matching", asked for by the
        Runs page once its list is shown: on a large table a count that stops short of its cap
        reads every run the filter's id range covers, which the list never waits for."""
        params = query(request.query_params, *FILTERS)
        async with (await app.pool()).connection() as conn:
            where = await control.with_ids_ending(conn, run_filter(params))
            any_state = replace(where, status=None, status_in=None, due=None, retried=None)
            page = _tabs(params, await control.count_states(conn, any_state,
                                                            budget_s=STATES_BUDGET_S))
            matching = await control.count_matching(conn, where, budget_s=MATCHING_BUDGET_S)
        return ui.page(request, viewer, "runs_counts.html", **page, matching=matching,
                       cap=COUNT_CAP, filters=params, counted=True)


def _add_bulk(router: APIRouter, app: App, ui: Ui) -> None:
    control = app._control

    @router.post("/runs/bulk", response_class=HTMLResponse)
    async def bulk(request: Request) -> Response:
        await ui.form(request)  # admin, Origin, CSRF
        viewer = ui.viewer(request)
        lists = await read_form_lists(request)
        form = {k: v[-1] for k, v in lists.items()}
        action: BulkAction
        if form.get("action") == "cancel":
            action = "cancel"
        elif form.get("action") == "retry":
            action = "retry"
        else:
            raise Problem(422, "Unknown action", "choose cancel or retry")
        ids = [run_id(i) for i in lists.get("id", [])]
        where = run_filter(query(form, *FILTERS))
        by_filter = form.get("target") == "filter"
        if not by_filter and not ids:
            raise Problem(422, "Nothing selected", "tick the runs to act on, or choose "
                          "\u201call matching the filter\u201d")
        async with (await app.pool()).connection() as conn:
            if form.get("confirm") != "yes":
                count = (await control.count_within(conn, where, action,
                                                    budget_s=CONFIRM_BUDGET_S)
                         if by_filter else Count(len(ids)))
                return ui.page(request, viewer, "runs_confirm.html", action=action,
                               count=count,
                               by_filter=by_filter, ids=ids, filters=query(form, *FILTERS),
                               batch_max=BULK_MAX)
            result = await control.bulk(conn, action, where=where if by_filter else None,
                                        ids=None if by_filter else ids)
        return redirect(request, "/runs", **query(form, *FILTERS), done=action,
                        changed=str(result.changed), requested=str(result.requested),
                        remaining=str(result.remaining))


async def type_pause(app: App, job_type: str) -> Pause | None:
    """The job type's pause, if it is paused (the run page offers to pause or resume it)."""
    return next((p for p in await app.paused() if p.kind == "type" and p.name == job_type),
                None)


def _waiting_step(found: RunDetail) -> str | None:
    """The step a waiting run waits in: its latest sleep or signal step, shown as sleeping or
    waiting instead of the fact recorded for it (a sleep is recorded completed at once, a wait
    for a signal running)."""
    kind = {"sleep": "sleep", "signal": "signal"}.get(found.wait["kind"]) if found.wait else None
    steps = [s["step_id"] for s in found.steps if s["kind"] == kind]
    return steps[-1] if steps else None


async def _signal(app: App, form: dict[str, str]) -> int:
    token = form.get("token", "").strip()
    text = form.get("payload", "").strip() or "{}"
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise Problem(422, "The payload is not JSON", f"payload: {exc}") from None
    try:
        return await app.signal(token, payload)
    except (InvalidEnqueue, ValueError) as exc:
        raise Problem(422, "Signal refused", str(exc)) from None


def _done(request: Request) -> dict[str, Any] | None:
    """What the previous action did, from the redirect's query (numbers only: a link cannot
    put words on the page)."""
    action = request.query_params.get("done")
    if action not in DONE:
        return None
    numbers = {}
    for name in ("changed", "requested", "remaining", "woken"):
        value = request.query_params.get(name, "")
        if value.isdigit():
            numbers[name] = int(value)
    return {"action": action, "title": DONE[action], **numbers}

