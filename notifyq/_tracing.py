"""OpenTelemetry traces and metrics, when the application asks for them.

notifyq reports to OpenTelemetry when ``opentelemetry-api`` is importable (the ``otel`` extra)
and the application has installed a tracer provider (spans) or a meter provider (metrics), for
example the SDK's. Otherwise every hook here returns at once: with the API's own no-op or proxy
provider nothing is recorded, nothing is allocated and no trace context is stored.

One run's trace::

    send <pool>          PRODUCER  the enqueue; its context is stored with the run (trace_context)
    ├─ claim <pool>      CONSUMER  from when the run was due until its handler started (queue wait)
    └─ process <pool>    CONSUMER  the handler, current while it runs (the user's spans nest here)
       ├─ step <id>      INTERNAL  each durable step (ctx.step)
       └─ webhook attempt CLIENT   each delivery attempt of webhook.deliver
    key rotation batch   INTERNAL  each batch of secret.reencrypt, under its process span

The stored context is the W3C ``traceparent`` (and ``tracestate``) of the send span, so a run
enqueued inside a traced request continues that request's trace, across processes and hosts.
Attributes follow OpenTelemetry's messaging conventions (``messaging.system`` = ``notifyq``,
``messaging.destination.name`` = the pool, ``messaging.message.id`` = the run id) plus
``notifyq.*`` ones. Metrics: :data:`RUNS_FINISHED`, :data:`RUN_DURATION`, :data:`QUEUE_WAIT`,
:data:`RUNS_ENQUEUED` and :data:`WEBHOOK_ATTEMPTS` (docs/observability.md).

Cost when off: two calls per run that read the API's globals (see :data:`_FROM_ENV`) or find
the API missing, ~1.7 us together on the 2-core VM (timeit of both hooks), and a claim that
returns one more (null) column.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.metrics import _internal as otel_metrics_internal
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _API = True
except ImportError:  # the `otel` extra is not installed: every hook is a no-op
    _API = False

# `trace.get_tracer_provider()` costs ~5 us on this 2-core VM while no provider is set: each call
# looks up OTEL_PYTHON_TRACER_PROVIDER in os.environ, a KeyError raised and caught (the same in
# metrics) - 20 us a run for the two hooks, ~20 % of a no-op run's worker CPU in `notifyq bench`
# drain. The API's module globals say the same in ~0.05 us; the getter is still asked when a
# provider is named in the environment (it loads it on first use) or the globals are gone.
_FROM_ENV = {"OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"} & set(os.environ)
_UNKNOWN = object()

SYSTEM = "notifyq"
SCOPE = "notifyq"

RUNS_ENQUEUED = "notifyq.runs.enqueued"
RUNS_FINISHED = "notifyq.runs.finished"
RUN_DURATION = "notifyq.run.duration"
QUEUE_WAIT = "notifyq.run.queue_wait"
WEBHOOK_ATTEMPTS = "notifyq.webhook.attempts"

# The operation attributes, in both spellings of the messaging conventions: the current
# `messaging.operation.type` and the older `messaging.operation` many backends still read.
_OPERATIONS = {
    "send": {"messaging.operation.type": "send", "messaging.operation": "publish",
             "messaging.operation.name": "enqueue"},
    "claim": {"messaging.operation.type": "receive", "messaging.operation": "receive",
              "messaging.operation.name": "claim"},
    "process": {"messaging.operation.type": "process", "messaging.operation": "process",
                "messaging.operation.name": "process"},
}


class _Off:
    """The shared context manager of every hook when nothing is recorded: yields None."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


@dataclass(slots=True)
class _Instruments:
    enqueued: Any
    finished: Any
    duration: Any
    queue_wait: Any
    webhook_attempts: Any


class _Providers:
    """The tracer and instruments of the providers installed last (the global providers can
    be replaced, e.g. between tests: compared by identity at every call)."""

    tracer_provider: object = None
    tracer: Any = None
    meter_provider: object = None
    instruments: _Instruments | None = None


_seen = _Providers()


def _api_only(provider: object) -> bool:
    """The API's own no-op or proxy provider: nothing installed, nothing to record."""
    return type(provider).__module__.startswith(("opentelemetry.trace",
                                                 "opentelemetry.metrics"))


def _tracer() -> Any:
    if not _API:
        return None
    provider: Any = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _FROM_ENV:
        return None
    if provider is None or provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    if provider is not _seen.tracer_provider:
        _seen.tracer_provider = provider
        _seen.tracer = None if _api_only(provider) else provider.get_tracer(SCOPE)
    return _seen.tracer


def _instruments() -> _Instruments | None:
    if not _API:
        return None
    provider: Any = getattr(otel_metrics_internal, "_METER_PROVIDER", _UNKNOWN)
    if provider is None and not _FROM_ENV:
        return None
    if provider is None or provider is _UNKNOWN:
        provider = otel_metrics.get_meter_provider()
    if provider is not _seen.meter_provider:
        _seen.meter_provider = provider
        _seen.instruments = None if _api_only(provider) else _make_instruments(
            provider.get_meter(SCOPE))
    return _seen.instruments


def _make_instruments(meter: Any) -> _Instruments:
    return _Instruments(
        enqueued=meter.create_counter(RUNS_ENQUEUED, unit="{run}",
                                      description="Runs enqueued by this process"),
        finished=meter.create_counter(
            RUNS_FINISHED, unit="{run}", description="Runs this process executed, by outcome "
            "(completed, failed, timed_out, pending = retry, waiting, canceled, released, "
            "lease_lost)"),
        duration=meter.create_histogram(RUN_DURATION, unit="s",
                                        description="Handler run time"),
        queue_wait=meter.create_histogram(
            QUEUE_WAIT, unit="s", description="From when a run was due (run_at) until a "
            "worker claimed it, on the database clock"),
        webhook_attempts=meter.create_counter(
            WEBHOOK_ATTEMPTS, unit="{attempt}",
            description="Webhook attempts, by outcome (2xx..5xx or the error kind)"))


def enabled() -> bool:
    """Whether a tracer or a meter provider is installed (something is recorded)."""
    return _tracer() is not None or _instruments() is not None


def _run_attributes(operation: str, pool: str | None, job_type: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, **_OPERATIONS[operation]}
    if pool is not None:
        attributes["messaging.destination.name"] = pool
    if job_type is not None:
        attributes["notifyq.job_type"] = job_type
    return attributes


# -- the enqueue -------------------------------------------------------------------------------


class Sending:
    """An enqueue's span: its context goes into the runs it writes."""

    def __init__(self, span: Any, job_type: str | None) -> None:
        self._span = span
        self._job_type = job_type
        self.trace_context: str | None = None
        """The span's W3C trace context as a JSON object (the ``trace_context`` column), or
        None when no tracer is installed (only metrics)."""
        if span is not None:
            carrier: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
            self.trace_context = json.dumps(carrier, separators=(",", ":")) if carrier else None

    def sent(self, runs: list[tuple[UUID, str, str]]) -> None:
        """The runs written: (id, job type, pool) each."""
        instruments = _instruments()
        if instruments is not None:
            for _, job_type, pool in runs:
                instruments.enqueued.add(1, {"notifyq.job_type": job_type,
                                             "messaging.destination.name": pool})
        if self._span is None or not runs:
            return
        pools = {pool for _, _, pool in runs}
        if len(pools) == 1:
            [pool] = pools
            self._span.update_name(f"send {pool}")
            self._span.set_attribute("messaging.destination.name", pool)
        if len(runs) == 1:
            self._span.set_attribute("messaging.message.id", str(runs[0][0]))
            self._span.set_attribute("notifyq.job_type", runs[0][1])
        else:
            self._span.set_attribute("messaging.batch.message_count", len(runs))


def sending(job_type: str | None, count: int = 1) -> AbstractContextManager[Sending | None]:
    """Around one enqueue (``job_type``) or a batch of ``count`` runs: yields a
    :class:`Sending` whose ``trace_context`` the runs are written with, or None when off."""
    if _tracer() is None and _instruments() is None:
        return _OFF
    return _sending(job_type, count)


@contextmanager
def _sending(job_type: str | None, count: int) -> Iterator[Sending]:
    tracer = _tracer()
    if tracer is None:
        yield Sending(None, job_type)
        return
    attributes = _run_attributes("send", None, job_type if count == 1 else None)
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span("send", kind=trace.SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        yield Sending(span, job_type)


# -- the handler -------------------------------------------------------------------------------


class Processing:
    """A run's process span, current while its handler runs."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def decided(self, *, outcome: str, error: BaseException | None, timed_out: bool) -> None:
        """The handler's result: its exception (or timeout) and the status it leads to."""
        if self._span is None:
            return
        self._span.set_attribute("notifyq.outcome", outcome)
        if error is not None:
            self._span.record_exception(error)
            self._span.set_status(trace.StatusCode.ERROR, type(error).__name__)
            self._span.set_attribute("error.type", type(error).__qualname__)
        elif timed_out:
            self._span.set_status(trace.StatusCode.ERROR, "timed out")
            self._span.set_attribute("error.type", "timeout")


@dataclass(frozen=True, slots=True)
class Claimed:
    """What the worker knows of a claimed run that the spans need."""

    id: UUID
    job_type: str
    pool: str
    attempt: int
    run_at: datetime
    claimed_at: datetime | None
    db_offset: timedelta | None
    """The database clock minus this host's clock (None: unknown)."""
    trace_context: Mapping[str, str] | None


def processing(claim: Callable[[], Claimed]) -> AbstractContextManager[Processing | None]:
    """Around a run's handler: records the queue wait, then makes the run's process span (a
    child of its enqueue's) current. Yields None when off. ``claim`` is called only when on
    (building a :class:`Claimed` for every run would cost more than the check)."""
    tracer = _tracer()
    instruments = _instruments()
    if tracer is None and instruments is None:
        return _OFF
    claimed = claim()
    if instruments is not None and claimed.claimed_at is not None:
        instruments.queue_wait.record(
            max(0.0, (claimed.claimed_at - claimed.run_at).total_seconds()),
            {"notifyq.job_type": claimed.job_type, "messaging.destination.name": claimed.pool})
    if tracer is None:
        return _OFF
    return _processing(tracer, claimed)


@contextmanager
def _processing(tracer: Any, claimed: Claimed) -> Iterator[Processing]:
    parent = TraceContextTextMapPropagator().extract(claimed.trace_context or {})
    attributes = _run_attributes("claim", claimed.pool, claimed.job_type)
    attributes["messaging.message.id"] = str(claimed.id)
    attributes["notifyq.attempt"] = claimed.attempt
    _queue_wait_span(tracer, parent, claimed, attributes)
    attributes.update(_OPERATIONS["process"])
    with tracer.start_as_current_span(f"process {claimed.pool}", context=parent,
                                      kind=trace.SpanKind.CONSUMER, attributes=attributes,
                                      record_exception=False) as span:
        yield Processing(span)


def _queue_wait_span(tracer: Any, parent: Any, claimed: Claimed,
                     attributes: dict[str, Any]) -> None:
    """``claim <pool>``: from when the run was due (its run_at, on this host's clock) until
    now, when its handler starts; the claim itself is an event on it."""
    now = time.time_ns()
    start = min(_ns(claimed.run_at - (claimed.db_offset or timedelta())), now)
    if claimed.claimed_at is not None:
        attributes = {**attributes, "notifyq.queue_wait_s": max(
            0.0, (claimed.claimed_at - claimed.run_at).total_seconds())}
    span = tracer.start_span(f"claim {claimed.pool}", context=parent,
                             kind=trace.SpanKind.CONSUMER, attributes=attributes,
                             start_time=start)
    if claimed.claimed_at is not None:
        claimed_host = _ns(claimed.claimed_at - (claimed.db_offset or timedelta()))
        span.add_event("claimed", timestamp=max(start, min(claimed_host, now)))
    span.end(end_time=now)


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


def finished(job_type: str, pool: str, outcome: str, duration_s: float) -> None:
    """One execution's outcome (the executor's outcome key) and handler duration."""
    instruments = _instruments()
    if instruments is None:
        return
    attributes = {"notifyq.job_type": job_type, "messaging.destination.name": pool,
                  "notifyq.outcome": outcome}
    instruments.finished.add(1, attributes)
    instruments.duration.record(duration_s, attributes)


def child_span(name: str, attributes: Mapping[str, Any], *,
         client: bool = False) -> AbstractContextManager[Any]:
    """A child span of the current one (a durable step, a webhook attempt, a key-rotation
    batch); yields the span (set more attributes on it) or None when off. An exception leaving
    the block is recorded on the span."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        name, kind=trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL,
        attributes=dict(attributes))


def mark_error(span: Any, error_type: str) -> None:
    """Mark a :func:`child_span` failed without an exception (e.g. an HTTP 500 answer)."""
    span.set_status(trace.StatusCode.ERROR, error_type)
    span.set_attribute("error.type", error_type)


def webhook_attempt(outcome: str) -> None:
    """A webhook attempt's outcome (``2xx``..``5xx`` or the error kind), for the counter."""
    instruments = _instruments()
    if instruments is not None:
        instruments.webhook_attempts.add(1, {"notifyq.webhook.outcome": outcome})
