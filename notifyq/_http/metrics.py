"""Prometheus metrics of one ``notifyq serve`` process.

Counters and histograms count what this process did (runs it finished, by type and outcome);
the gauges are read from the database at scrape time and are cluster-wide (queue depth and the
age of the oldest runnable run per pool, runs by type and status, paused pools and types).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from notifyq._control import Stats
    from notifyq._dispatch.executor import Execution
    from notifyq._dispatch.worker import Worker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The executor's outcome keys -> the counter a run lands in.
_OUTCOMES = {"completed": "completed", "failed": "failed", "timed_out": "failed",
             "pending": "retried", "canceled": "canceled", "released": "released",
             "lease_lost": "lease_lost"}

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.enqueued = Counter("notifyq_runs_enqueued", "Runs enqueued through this API",
                                ["job_type"], registry=r)
        self.finished = Counter("notifyq_runs_finished", "Runs this process executed, by "
                                "outcome (completed, failed, retried, canceled, released, "
                                "lease_lost)", ["job_type", "outcome"], registry=r)
        self.completed = Counter("notifyq_runs_completed", "Runs completed by this process",
                                 ["job_type"], registry=r)
        self.failed = Counter("notifyq_runs_failed", "Runs dead-lettered (failed or timed "
                              "out) by this process", ["job_type"], registry=r)
        self.retried = Counter("notifyq_runs_retried", "Failed attempts scheduled for a retry",
                               ["job_type"], registry=r)
        self.lease_lost = Counter("notifyq_lease_lost", "Write-backs dropped because another "
                                  "worker took the run over", registry=r)
        self.duration = Histogram("notifyq_handler_duration_seconds", "Handler run time",
                                  ["job_type"], buckets=_DURATION_BUCKETS, registry=r)
        self.pickup = Histogram("notifyq_wake_latency_seconds", "From runnable (run_at) to "
                                "the handler starting, on the database clock",
                                buckets=_LATENCY_BUCKETS, registry=r)
        self.depth = Gauge("notifyq_queue_depth", "Runs runnable now", ["pool"], registry=r)
        self.oldest = Gauge("notifyq_oldest_runnable_age_seconds", "How long the oldest "
                            "runnable run has waited", ["pool"], registry=r)
        self.runs = Gauge("notifyq_runs", "Runs in the table by type, pool and status",
                          ["job_type", "pool", "status"], registry=r)
        self.paused = Gauge("notifyq_paused", "1 for each paused pool (kind=pool) and job "
                            "type (kind=type): workers claim none of their runs",
                            ["kind", "name"], registry=r)
        self.webhook_attempts = Counter(
            "notifyq_webhook_attempts", "Webhook attempts made by this process, by outcome "
            "(2xx, 3xx, 4xx, 5xx, or the error kind: timeout, connect, dns, tls, blocked, "
            "invalid)",
            ["outcome"], registry=r)
        self.operator_events = Counter(
            "notifyq_operator_events", "Operator events this process emitted (as the leader), "
            "by kind (endpoint.disabled, endpoint.circuit_opened, endpoint.circuit_closed, "
            "endpoint.failing, retention.purged): each event is emitted by one process",
            ["kind"], registry=r)
        self.listener = Gauge("notifyq_listener_connected", "1 when the LISTEN connection is "
                              "up (absent without a worker or in poll-only mode)", registry=r)

    def observe(self, execution: Execution, outcome: str, handler_s: float,
                now: datetime | None = None) -> None:
        """The executor's observer: one call per finished execution."""
        job_type = execution.run.job_type
        kind = _OUTCOMES.get(outcome, outcome)
        self.finished.labels(job_type, kind).inc()
        if kind == "completed":
            self.completed.labels(job_type).inc()
        elif kind == "failed":
            self.failed.labels(job_type).inc()
        elif kind == "retried":
            self.retried.labels(job_type).inc()
        elif kind == "lease_lost":
            self.lease_lost.inc()
        self.duration.labels(job_type).observe(handler_s)
        if now is not None and execution.db_offset is not None:
            started_db = now + execution.db_offset
            waited = (started_db - execution.run.run_at).total_seconds() - handler_s
            if waited >= 0:
                self.pickup.observe(waited)

    def webhook_attempt(self, outcome: str) -> None:
        """The webhook deliverer's observer: one call per attempt."""
        self.webhook_attempts.labels(outcome).inc()

    def operator_event(self, kind: str) -> None:
        """The announcer's observer: one call per emitted operator event."""
        self.operator_events.labels(kind).inc()

    def render(self, stats: Stats | None, worker: Worker | None) -> bytes:
        """The exposition text; ``stats`` (None: the database was unreachable) refreshes the
        gauges first."""
        if stats is not None:
            for gauge in (self.depth, self.oldest, self.runs, self.paused):
                gauge.clear()
            for pause in stats.paused:
                self.paused.labels(pause.kind, pause.name).set(1)
            for backlog in stats.runnable:
                self.depth.labels(backlog.pool).set(backlog.runnable)
                self.oldest.labels(backlog.pool).set(backlog.oldest_age_s)
            for count in stats.counts:
                self.runs.labels(count.job_type, count.pool, count.status).set(count.count)
        if worker is not None and worker.notifier is not None:
            self.listener.set(1 if worker.notifier.connected else 0)
        return generate_latest(self.registry)
