"""OpenTelemetry: the enqueue's trace context travels with the run through PostgreSQL to the
handler's spans; spans and metrics carry the messaging attributes (notifyq/_tracing.py).

The SDK's in-memory span exporter and metric reader are installed as the global providers for
each test and removed after it, so other tests run with nothing installed, as users without
the ``otel`` extra do."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from notifyq import App, ConcurrencyPolicy, JobContext, Permanent, RetryPolicy
from notifyq._tracing import QUEUE_WAIT, RUN_DURATION, RUNS_ENQUEUED, RUNS_FINISHED
from tests.integration.inproc import fetch, running, status_becomes
from tests.support import eventually

pytestmark = pytest.mark.anyio


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.finished(name)
        assert len(found) == 1, [s.name for s in self.spans.get_finished_spans()]
        return found[0]

    def points(self, metric: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [point for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == metric for point in m.data.data_points]


def _reset_global_providers() -> None:
    # The API lets a process set its providers once; tests put them back (test-only).
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    metrics._internal._METER_PROVIDER_SET_ONCE = Once()
    metrics._internal._METER_PROVIDER = None


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    _reset_global_providers()
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    try:
        yield Telemetry(exporter, reader)
    finally:
        _reset_global_providers()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _is_child(child: ReadableSpan, parent: ReadableSpan) -> bool:
    assert child.context is not None
    assert parent.context is not None
    return (child.context.trace_id == parent.context.trace_id and child.parent is not None
            and child.parent.span_id == parent.context.span_id)


async def _spans_with(telemetry: Telemetry, name: str, n: int) -> None:
    """Wait until ``n`` spans named ``name`` have ended (a span ends after the write-back is
    queued, which may be after the run's row changed)."""
    async def check() -> None:
        assert len(telemetry.finished(name)) == n
    await eventually(check)


async def _stored_trace_context(app: App, run_id: Any) -> Any:
    [row] = await fetch(app, "SELECT trace_context FROM notifyq.job_run WHERE id = %s", run_id)
    return row["trace_context"]


async def test_the_handler_continues_the_enqueuers_trace(app: App,
                                                         telemetry: Telemetry) -> None:
    seen: list[Any] = []

    @app.handler("t.traced", pool="mail")
    async def traced(ctx: JobContext) -> None:
        seen.append(trace.get_current_span().get_span_context())
        with trace.get_tracer("user").start_as_current_span("user work"):
            pass

    tracer = trace.get_tracer("web")
    with tracer.start_as_current_span("POST /signup") as request:
        run = await app.enqueue("t.traced", {"to": "a@b.c"})
    async with running(app, pools=["mail"]):
        await status_becomes(app, run.id, "completed")
        await _spans_with(telemetry, "process mail", 1)

    send = telemetry.one("send mail")
    claim = telemetry.one("claim mail")
    process = telemetry.one("process mail")
    user = telemetry.one("user work")
    root = telemetry.one("POST /signup")
    assert root.context is not None
    assert root.context.span_id == request.get_span_context().span_id
    assert _is_child(send, root)
    assert _is_child(claim, send)
    assert _is_child(process, send)
    assert _is_child(user, process)
    # The handler ran with its process span current (sync code and user spans nest under it).
    assert process.context is not None
    assert seen[0].span_id == process.context.span_id

    stored = await _stored_trace_context(app, run.id)
    assert send.context is not None
    assert stored["traceparent"].split("-")[:3] == [
        "00", f"{send.context.trace_id:032x}", f"{send.context.span_id:016x}"]

    assert send.kind == SpanKind.PRODUCER
    assert _attrs(send) == {
        "messaging.system": "notifyq", "messaging.operation.type": "send",
        "messaging.operation": "publish", "messaging.operation.name": "enqueue",
        "messaging.destination.name": "mail", "messaging.message.id": str(run.id),
        "notifyq.job_type": "t.traced"}
    assert process.kind == SpanKind.CONSUMER
    assert _attrs(process) == {
        "messaging.system": "notifyq", "messaging.operation.type": "process",
        "messaging.operation": "process", "messaging.operation.name": "process",
        "messaging.destination.name": "mail", "messaging.message.id": str(run.id),
        "notifyq.job_type": "t.traced", "notifyq.attempt": 1, "notifyq.outcome": "completed"}
    assert process.status.status_code == StatusCode.UNSET
    claim_attrs = _attrs(claim)
    assert claim_attrs["messaging.operation.type"] == "receive"
    assert claim_attrs["messaging.message.id"] == str(run.id)
    assert claim_attrs["notifyq.queue_wait_s"] >= 0
    assert [e.name for e in claim.events] == ["claimed"]
    # The queue wait ends where the handler starts.
    assert claim.end_time is not None
    assert process.start_time is not None
    assert claim.start_time is not None
    assert claim.start_time <= claim.end_time
    assert claim.end_time <= process.start_time


async def test_a_failed_attempt_marks_its_span_and_the_retry_gets_its_own(
        app: App, telemetry: Telemetry) -> None:
    @app.handler("t.flaky", retry=RetryPolicy(attempts=3, backoff="fixed", base_s=0.05,
                                              jitter=0))
    async def flaky(ctx: JobContext) -> None:
        if ctx.run.attempt == 1:
            raise ConnectionError("upstream down")

    @app.handler("t.bad")
    async def bad(ctx: JobContext) -> None:
        raise Permanent(ValueError("bad address"))

    flaky_run = await app.enqueue("t.flaky", {})
    bad_run = await app.enqueue("t.bad", {})
    async with running(app):
        await status_becomes(app, flaky_run.id, "completed")
        await status_becomes(app, bad_run.id, "failed")
        await _spans_with(telemetry, "process default", 3)

    by_run: dict[str, list[ReadableSpan]] = {}
    for span in telemetry.finished("process default"):
        by_run.setdefault(_attrs(span)["messaging.message.id"], []).append(span)
    first, second = sorted(by_run[str(flaky_run.id)], key=lambda s: _attrs(s)["notifyq.attempt"])
    assert first.status.status_code == StatusCode.ERROR
    assert _attrs(first)["notifyq.outcome"] == "pending"  # a retry is scheduled
    assert _attrs(first)["error.type"] == "ConnectionError"
    assert [e.name for e in first.events] == ["exception"]
    assert _attrs(second)["notifyq.outcome"] == "completed"
    assert second.status.status_code == StatusCode.UNSET
    # Both attempts continue the one enqueue.
    send = [s for s in telemetry.finished("send default")
            if _attrs(s)["messaging.message.id"] == str(flaky_run.id)]
    assert len(send) == 1
    assert _is_child(first, send[0])
    assert _is_child(second, send[0])
    [dead] = by_run[str(bad_run.id)]
    assert dead.status.status_code == StatusCode.ERROR
    assert _attrs(dead)["notifyq.outcome"] == "failed"
    assert _attrs(dead)["error.type"] == "Permanent"


async def test_bulk_keyed_and_sync_enqueues_store_their_trace_context(
        app: App, telemetry: Telemetry) -> None:
    @app.handler("t.keyed", concurrency=ConcurrencyPolicy(key="{account}", limit=1))
    async def keyed(ctx: JobContext) -> None:
        pass

    runs = await app.enqueue_many([{"job_type": "t.plain", "input": {"n": n}, "pool": "bulk"}
                                   for n in range(3)]
                                  + [{"job_type": "t.keyed", "input": {"account": "a"}}],
                                  allow_unknown_type=True)
    [batch] = telemetry.finished("send")  # several pools: the name keeps the operation only
    assert _attrs(batch)["messaging.batch.message_count"] == 4
    assert batch.context is not None
    for run in runs:
        stored = await _stored_trace_context(app, run.id)
        assert stored["traceparent"].split("-")[2] == f"{batch.context.span_id:016x}", run

    single = await app.enqueue("t.keyed", {"account": "b"})
    send = [s for s in telemetry.finished("send default")
            if _attrs(s)["messaging.message.id"] == str(single.id)]
    assert len(send) == 1
    assert send[0].context is not None
    stored = await _stored_trace_context(app, single.id)
    assert stored["traceparent"].split("-")[2] == f"{send[0].context.span_id:016x}"

    synced = await anyio.to_thread.run_sync(
        lambda: app.enqueue_sync("t.keyed", {"account": "c"}))
    send = [s for s in telemetry.finished("send default")
            if _attrs(s)["messaging.message.id"] == str(synced.id)]
    assert len(send) == 1
    assert send[0].context is not None
    stored = await _stored_trace_context(app, synced.id)
    assert stored["traceparent"].split("-")[2] == f"{send[0].context.span_id:016x}"


async def test_without_providers_nothing_is_stored_or_recorded(app: App) -> None:
    assert type(trace.get_tracer_provider()).__module__ == "opentelemetry.trace"
    ran = anyio.Event()

    @app.handler("t.quiet")
    async def quiet(ctx: JobContext) -> None:
        assert not trace.get_current_span().get_span_context().is_valid
        ran.set()

    run = await app.enqueue("t.quiet", {})
    [many] = await app.enqueue_many([{"job_type": "t.quiet", "input": {}}])
    async with running(app):
        await status_becomes(app, run.id, "completed")
        await status_becomes(app, many.id, "completed")
    assert ran.is_set()
    rows = await fetch(app, "SELECT count(*) AS n FROM notifyq.job_run "
                            "WHERE trace_context IS NOT NULL")
    assert rows[0]["n"] == 0


async def test_metrics_count_runs_by_outcome_and_time_them(app: App,
                                                           telemetry: Telemetry) -> None:
    @app.handler("t.ok", pool="work")
    async def ok(ctx: JobContext) -> None:
        await anyio.sleep(0.05)

    @app.handler("t.dead", pool="work")
    async def dead(ctx: JobContext) -> None:
        raise Permanent(ValueError("no"))

    runs = [await app.enqueue("t.ok", {}) for _ in range(3)]
    dead_run = await app.enqueue("t.dead", {})
    async with running(app, pools=["work"]):
        for run in runs:
            await status_becomes(app, run.id, "completed")
        await status_becomes(app, dead_run.id, "failed")

        async def counted() -> dict[tuple[str, str], int]:
            counts = {(p.attributes["notifyq.job_type"], p.attributes["notifyq.outcome"]):
                      p.value for p in telemetry.points(RUNS_FINISHED)}
            assert counts == {("t.ok", "completed"): 3, ("t.dead", "failed"): 1}
            return counts
        await eventually(counted)

    for point in telemetry.points(RUNS_FINISHED):
        assert point.attributes["messaging.destination.name"] == "work"
    durations = {p.attributes["notifyq.job_type"]: p for p in telemetry.points(RUN_DURATION)}
    assert durations["t.ok"].count == 3
    assert durations["t.ok"].min >= 0.04  # the handler's 50 ms sleep
    waits: Sequence[Any] = telemetry.points(QUEUE_WAIT)
    assert sum(p.count for p in waits) == 4
    assert all(p.min >= 0 for p in waits)
    enqueued = {p.attributes["notifyq.job_type"]: p.value
                for p in telemetry.points(RUNS_ENQUEUED)}
    assert enqueued == {"t.ok": 3, "t.dead": 1}


def test_the_stored_trace_context_is_a_json_object_of_w3c_headers() -> None:
    from notifyq._tracing import Sending

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("send") as span:
        sending = Sending(span, "t.x")
    assert sending.trace_context is not None
    carrier = json.loads(sending.trace_context)
    assert set(carrier) == {"traceparent"}
    ctx = span.get_span_context()
    assert carrier["traceparent"].split("-")[:3] == ["00", f"{ctx.trace_id:032x}",
                                                     f"{ctx.span_id:016x}"]


def test_a_worker_runs_without_opentelemetry_installed(dsn: str) -> None:
    """The `otel` extra is optional: with the package gone, enqueue and a worker still work."""
    import subprocess
    import sys

    from tests.support import ROOT
    from tests.unit.test_dependencies import WITHOUT_OTEL

    script = WITHOUT_OTEL + (
        "import anyio\n"
        "from notifyq import App\n"
        "app = App(dsn=sys.argv[1])\n"
        "@app.handler('t.plain')\n"
        "async def plain(ctx): return {'n': ctx.input['n']}\n"
        "async def main():\n"
        "    runs = [await app.enqueue('t.plain', {'n': 1})]\n"
        "    runs += await app.enqueue_many([{'job_type': 't.plain', 'input': {'n': 2}}])\n"
        "    await app.run_worker(concurrency=2, burst=True)\n"
        "    await app.close()\n"
        "    print(len(runs))\n"
        "anyio.run(main)\n")
    done = subprocess.run([sys.executable, "-c", script, dsn], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2"]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT status, output, trace_context FROM notifyq.job_run "
                            "ORDER BY id").fetchall()
    assert rows == [("completed", {"n": 1}, None), ("completed", {"n": 2}, None)]


# -- spans inside a run: durable steps, webhook attempts, key-rotation batches --------------------

def _process_span_of(telemetry: Telemetry, run_id: Any, attempt: int = 1) -> ReadableSpan:
    [span] = [s for s in telemetry.finished()
              if s.name.startswith("process ") and
              _attrs(s)["messaging.message.id"] == str(run_id) and
              _attrs(s)["notifyq.attempt"] == attempt]
    return span


async def test_each_durable_step_is_a_child_span_and_a_replay_says_it_was_memoized(
        app: App, telemetry: Telemetry) -> None:
    calls: list[str] = []

    @app.handler("t.steps", retry=RetryPolicy(attempts=2, backoff="fixed", base_s=0.05,
                                              jitter=0))
    async def steps(ctx: JobContext) -> None:
        async def fetch_once() -> int:
            calls.append("fetch")
            if calls.count("fetch") == 1:
                raise ConnectionError("flaky upstream")
            return 7

        await ctx.step("fetch", fetch_once, retry=RetryPolicy(attempts=2, base_s=0.01))
        await ctx.step("save", lambda: calls.append("save"))
        if ctx.run.attempt == 1:
            raise RuntimeError("crash after the steps")

    run = await app.enqueue("t.steps", {})
    async with running(app):
        await status_becomes(app, run.id, "completed")
        await _spans_with(telemetry, "process default", 2)
    assert calls == ["fetch", "fetch", "save"]  # attempt 2 reused both steps

    first, second = (_process_span_of(telemetry, run.id, n) for n in (1, 2))
    fetches = sorted(telemetry.finished("step fetch"), key=lambda s: s.start_time or 0)
    saves = sorted(telemetry.finished("step save"), key=lambda s: s.start_time or 0)
    assert len(fetches) == len(saves) == 2
    assert _is_child(fetches[0], first)
    assert _is_child(saves[0], first)
    assert _is_child(fetches[1], second)
    assert _is_child(saves[1], second)
    assert _attrs(fetches[0]) == {"notifyq.step.id": "fetch", "notifyq.step.attempts": 2,
                                  "messaging.message.id": str(run.id)}
    assert _attrs(fetches[1])["notifyq.step.memoized"] is True
    assert _attrs(saves[1])["notifyq.step.memoized"] is True
    assert all(s.status.status_code == StatusCode.UNSET for s in fetches + saves)


async def test_each_webhook_attempt_is_a_span_with_its_endpoint_and_status(
        dsn: str, telemetry: Telemetry) -> None:
    from tests.receiver import Receiver, Reply
    from tests.webhooks.conftest import webhook_settings

    with Receiver() as receiver:
        receiver.script("/hook", Reply(500), Reply(200))
        async with App(settings=webhook_settings(dsn)) as wapp:
            endpoint = await wapp.webhooks.create_endpoint(receiver.url("/hook"))
            sent = await wapp.webhooks.send("order.paid", {"order": 7}, endpoint_id=endpoint.id)
            async with running(wapp, pools=["webhooks"]):
                await _spans_with(telemetry, "webhook attempt", 2)
            assert len(receiver.at("/hook")) == 2

    failed, ok = sorted(telemetry.finished("webhook attempt"), key=lambda s: s.start_time or 0)
    for span, status in ((failed, 500), (ok, 200)):
        assert span.kind == SpanKind.CLIENT
        attributes = _attrs(span)
        assert attributes["notifyq.webhook.endpoint_id"] == str(endpoint.id)
        assert attributes["notifyq.webhook.message_id"] == sent.id
        assert attributes["http.response.status_code"] == status
        assert attributes["http.request.method"] == "POST"
        assert not any("url" in name for name in attributes)  # a URL may carry a token
        [process] = [s for s in telemetry.finished("process webhooks") if _is_child(span, s)]
        assert _attrs(process)["notifyq.job_type"] == "webhook.deliver"
    assert failed.status.status_code == StatusCode.ERROR
    assert _attrs(failed)["error.type"] == "500"
    assert ok.status.status_code == StatusCode.UNSET
    assert [_attrs(s)["notifyq.webhook.attempt"] for s in (failed, ok)] == [1, 2]
    outcomes = {p.attributes["notifyq.webhook.outcome"]: p.value
                for p in telemetry.points("notifyq.webhook.attempts")}
    assert outcomes == {"5xx": 1, "2xx": 1}


async def test_key_rotation_batches_are_spans_under_the_rotation_run(
        dsn: str, sql: psycopg.Connection[Any], telemetry: Telemetry) -> None:
    from tests import vault

    vault.fill(sql, vault.keyring(1, active=1), 1200, 300)
    app = vault.vault_app(dsn, 1, 2, active=2)
    async with app:
        tracer = trace.get_tracer("admin")
        with tracer.start_as_current_span("rotate keys"):
            async with (await app.pool()).connection() as conn:
                run, _ = await app.keys.rotate(conn)
        async with running(app):
            await status_becomes(app, run.id, "completed", within=60)
            await _spans_with(telemetry, f"process {run.pool}", 1)

    process = _process_span_of(telemetry, run.id)
    assert _is_child(process, telemetry.one(f"send {run.pool}"))
    assert process.context is not None
    admin = telemetry.one("rotate keys")
    assert admin.context is not None
    assert process.context.trace_id == admin.context.trace_id
    batches = telemetry.finished("key rotation batch")
    assert batches
    assert all(_is_child(b, process) for b in batches)
    reencrypted: dict[str, int] = {}
    for batch in batches:
        attributes = _attrs(batch)
        assert attributes["notifyq.key.target_version"] == 2
        column = attributes["notifyq.key.column"]
        reencrypted[column] = reencrypted.get(column, 0) + attributes[
            "notifyq.key.batch.reencrypted"]
    assert reencrypted == {"public.vault_a.secret": 1200, "public.vault_b.token": 300,
                           "notifyq.webhook_endpoint.header_values": 0,
                           "notifyq.webhook_secret.ciphertext": 0}  # no webhook secrets here
    # 1,200 rows in batches of 500: three batches in pass 1, then an empty verification pass.
    full = [b for b in batches if _attrs(b)["notifyq.key.column"] == "public.vault_a.secret"
            and _attrs(b)["notifyq.key.batch.full"]]
    assert len(full) == 2
