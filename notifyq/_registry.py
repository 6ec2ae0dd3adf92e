"""Handler registrations: what a worker can run, and with which policies."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from notifyq._cadence import Cadence, Cron, Every
from notifyq._context import JobContext
from notifyq._enqueue.validate import encode_input
from notifyq._errors import ConfigError
from notifyq._limits import JOB_TYPE, POOL
from notifyq._policies import (
    ConcurrencyPolicy,
    DedupePolicy,
    RateLimit,
    ReplayFrom,
    RetryPolicy,
    Scope,
    template_of,
)

log = logging.getLogger("notifyq")

HandlerFn = Callable[[JobContext], Any]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    job_type: str
    call: HandlerFn
    is_async: bool
    retry: RetryPolicy
    timeout_s: float | None
    pool: str
    priority: int
    version: int
    concurrency: ConcurrencyPolicy | None = None
    dedupe: DedupePolicy | None = None
    scope: Scope | None = None
    replay_from: ReplayFrom = "last_step"
    rate_limit: RateLimit | None = None
    prefetch: Callable[[Any], None] | None = None
    """A class handler's optional ``prefetch(input)``: called for every run of a claim as it
    comes back, before any of them starts, so the handler can queue one batched lookup for all
    of them (the webhook deliverer loads a claim's deliveries in one statement)."""

    def definition(self) -> dict[str, Any]:
        """The row this handler upserts into ``job``: its policies as data, so enqueuers in
        other processes and languages apply them (key templates; callables stay in Python)."""
        c, d, s, r = self.concurrency, self.dedupe, self.scope, self.rate_limit
        return {"type": self.job_type, "version": self.version, "pool": self.pool,
                "priority": self.priority, "max_attempts": self.retry.attempts,
                "retry_policy": self.retry.to_json(), "timeout_s": self.timeout_s,
                "concurrency_key_template": template_of(c.key) if c else None,
                "concurrency_collision": c.collision if c else None,
                "concurrency_limit": c.limit if c else None,
                "dedupe_key_template": template_of(d.key) if d else None,
                "dedupe_window_s": d.window_s if d else None,
                "dedupe_states": list(d.states) if d else None,
                "replay_from": self.replay_from,
                "scope_entity_type": s.entity if s else None,
                "scope_id_template": template_of(s.id_from) if s else None,
                "rate_limit": r.limit if r else None, "rate_period_s": r.period_s if r else None,
                "rate_key_template": r.key if r else None}


@dataclass(frozen=True, slots=True)
class PeriodicSpec:
    """One schedule: which job, when (``cadence``), with which input; ``catch_up`` enqueues the
    ticks missed while no worker ran, oldest first."""

    job_type: str
    cadence: Cadence
    input: dict[str, Any] | list[Any]
    catch_up: bool = False
    given_name: str | None = None

    @property
    def name(self) -> str:
        """``name=`` when given, else ``type@300000ms`` or ``type@cron(0 9 * * MON-FRI, tz)``."""
        if self.given_name is not None:
            return self.given_name
        match self.cadence:
            case Every(every):
                return f"{self.job_type}@{every // timedelta(milliseconds=1)}ms"
            case Cron(expression, tz):
                return f"{self.job_type}@cron({expression}, {tz})"

    def definition(self) -> dict[str, Any]:
        """The row the scheduler upserts into ``periodic_schedule``."""
        every, cron = (self.cadence, None) if isinstance(self.cadence, Every) else (
            None, self.cadence)
        return {"name": self.name, "job_type": self.job_type,
                "every_ms": every.every // timedelta(milliseconds=1) if every else None,
                "cron": cron.expression if cron else None, "tz": cron.tz if cron else None,
                "catch_up": self.catch_up, "input": encode_input(self.input)}


class Registry:
    def __init__(self, env: Literal["production", "development", "test"]) -> None:
        self._env = env
        self._handlers: dict[str, HandlerSpec] = {}
        self._by_function: dict[int, str] = {}
        self.periodic: list[PeriodicSpec] = []

    def register(self, job_type: str, target: Any, *, retry: RetryPolicy | None,
                 timeout_s: float | None, pool: str, priority: int, version: int,
                 concurrency: ConcurrencyPolicy | None = None,
                 dedupe: DedupePolicy | None = None, scope: Scope | None = None,
                 replay_from: ReplayFrom = "last_step",
                 rate_limit: RateLimit | None = None) -> HandlerSpec:
        if not JOB_TYPE.fullmatch(job_type):
            raise ConfigError(f"invalid job type {job_type!r}: it must match {JOB_TYPE.pattern}")
        if not POOL.fullmatch(pool):
            raise ConfigError(f"invalid pool {pool!r}: it must match {POOL.pattern}")
        if timeout_s is not None and timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
        if job_type in self._handlers:
            self._duplicate(job_type)
        if concurrency is not None and rate_limit is not None:
            raise ConfigError(f"{job_type!r}: a concurrency policy and a rate limit do not combine "
                              "yet; keep one of them")
        call = _callable(target)
        if replay_from not in ("scratch", "last_step", "last_checkpoint"):
            raise ConfigError("replay_from must be scratch, last_step or last_checkpoint, "
                              f"got {replay_from!r}")
        prefetch = getattr(target, "prefetch", None) if not inspect.isfunction(target) else None
        spec = HandlerSpec(job_type, call, _is_async(call), retry or RetryPolicy(), timeout_s,
                           pool, priority, version, concurrency, dedupe, scope, replay_from,
                           rate_limit, prefetch if callable(prefetch) else None)
        self._handlers[job_type] = spec
        self._by_function[id(target)] = job_type
        return spec

    def _duplicate(self, job_type: str) -> None:
        message = f"handler for {job_type!r} registered twice"
        if self._env == "production":
            raise ConfigError(message + " (set NOTIFYQ_ENV=development to allow overwriting)")
        if self._env == "development":
            log.warning("%s; the later one wins", message)

    def add_periodic(self, spec: PeriodicSpec) -> None:
        if any(s.name == spec.name for s in self.periodic):
            raise ConfigError(f"periodic schedule {spec.name!r} declared twice: give one of "
                              "them another name=")
        self.periodic.append(spec)

    def get(self, job_type: str) -> HandlerSpec | None:
        return self._handlers.get(job_type)

    def type_of(self, target: Any) -> str | None:
        return self._by_function.get(id(target))

    def specs(self) -> list[HandlerSpec]:
        return list(self._handlers.values())

    def keyed_pools(self) -> set[str]:
        """Pools with a handler that has a concurrency policy or a rate limit: their producers
        also run the keyed claim."""
        return {s.pool for s in self._handlers.values()
                if s.concurrency is not None or s.rate_limit is not None}

    def pools(self) -> list[str]:
        return sorted({s.pool for s in self._handlers.values()})


def _callable(target: Any) -> HandlerFn:
    """Functions are used as they are; classes are instantiated (no arguments) and instances
    are used through their ``handle`` method."""
    if inspect.isclass(target):
        target = target()
    if inspect.isfunction(target) or inspect.ismethod(target):
        return target
    handle = getattr(target, "handle", None)
    if callable(handle):
        return handle  # type: ignore[no-any-return]
    if callable(target):
        return target  # type: ignore[no-any-return]
    raise ConfigError(f"handler {target!r} is neither a function nor has a handle(ctx) method")


def _is_async(call: HandlerFn) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
        type(call).__call__)


AsyncHandler = Callable[[JobContext], Awaitable[Any]]
