"""Configuration: one pydantic model tree.

Sources, highest first: keyword arguments, ``NOTIFYQ_*`` environment variables (nested fields
with ``__``, e.g. ``NOTIFYQ_WORKER__CONCURRENCY=20``), then the YAML file named by
``NOTIFYQ_CONFIG_FILE`` or ``./notifyq.yaml`` when it exists. Invalid values stop the start with
a :class:`~notifyq._errors.ConfigError` naming the setting and its environment variable.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from notifyq._errors import ConfigError
from notifyq._limits import MAX_RESULT_WAIT_S

POOL_NAME = re.compile(r"^[a-z0-9_][a-z0-9_.:-]{0,63}$")
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

Seconds = Annotated[float, Field(gt=0)]

# Where a password sits in a URL (user:PASSWORD@) or a key/value string (password=PASSWORD).
_DSN_PASSWORDS = (re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)"),
                  re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)()"))


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password (URL or key/value form) replaced by ``***``."""
    for pattern in _DSN_PASSWORDS:
        dsn = pattern.sub(lambda m: f"{m[1]}***{m[3]}", dsn)
    return dsn


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _string_list(value: Any) -> Any:
    """A list from the environment, either comma-separated (``default,emails``) or JSON
    (``["default", "emails"]``); lists (from the config file or code) pass through."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON list ({exc}); or give it comma-separated") from None
    return [part.strip() for part in value.split(",") if part.strip()]


class WorkerSettings(_Section):
    """The worker of ``notifyq worker``, ``notifyq serve`` and ``App.run_worker``: how many
    handlers run at once, which pools it claims from, leases, wake-ups and shutdown."""

    concurrency: Annotated[int, Field(ge=1, le=10_000)] = 10
    """Handlers run at once per process (``--concurrency`` overrides it). Defaults to 10."""
    pools: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["default"])
    """Pools this worker claims from, one producer each (``NOTIFYQ_WORKER__POOLS=default,emails``
    or a JSON list; ``--pool`` overrides it). Defaults to ["default"], plus the pool of every
    handler the app registers (e.g. ``webhooks``) while this setting is not set."""
    poll_interval_s: Seconds = 1.0
    """Fallback poll, jittered by ±10 %, for notifications that never came. Defaults to 1.0."""
    lease_s: Seconds = 30.0
    """How long a claim is valid without a heartbeat. Defaults to 30.0."""
    heartbeat_interval_s: Seconds | None = None
    """How often running leases are extended (one statement for all); less than lease_s.
    Defaults to ``lease_s / 3``."""
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 10.0
    """On shutdown, how long running handlers may finish before they are cancelled and their
    runs released. Defaults to 10.0."""
    listen: bool = True
    """Use LISTEN/NOTIFY for instant wake-ups; off, the worker only polls (PgBouncer in
    transaction mode without a listener DSN). Defaults to True."""
    completer_batch_max: Annotated[int, Field(ge=1, le=10_000)] = 500
    """Most write-backs in one statement. Defaults to 500."""
    completer_connections: Annotated[int, Field(ge=1, le=8)] = 2
    """Connections a worker writes back and claims on, each with one statement in flight:
    while one statement waits for the server, the next goes on another. Each is opened when
    first needed (a worker whose statements never overlap opens one). 1 sends the statements
    one after the other (one backend's pace: a drain at concurrency 200 on 2 cores, 23-25k
    runs/s against 27-29k with 2). Defaults to 2."""
    prefetch: Annotated[int, Field(ge=0, le=10_000)] | None = None
    """Claimed runs a worker holds beyond its busy handlers (claim-ahead), so a handler that
    finishes starts the next run without waiting for a claim; they are leased and heartbeated
    like running ones, and released at shutdown. 0 claims only for free handlers. Defaults to
    adaptive: as many as the worker's handlers could finish in three claim round trips (the
    concurrency over their mean duration), at least 1 and at most 20 per handler slot up to 200
    (or the concurrency, where that is more), starting at the concurrency: short runs are
    claimed in large batches, long ones are not held away from other workers. A claim takes
    at most half of the worker's slots, so the next batch is claimed while the handlers run the
    last one."""

    freeze_heap: bool = True
    """While the worker runs, keep the objects that existed when it started (modules, classes,
    the app) out of the cyclic garbage collector's full collections (``gc.freeze()``, undone
    with ``gc.unfreeze()`` when the last worker of the process stops). Every run the worker
    holds (claimed ahead, running, being written back) outlives the collector's young
    generations, so a busy worker triggers full collections, and each walked the whole heap:
    9-14 % of the Python CPU of a no-op drain, more the more runs it holds. Nothing is freed
    that would not be; cyclic garbage among the frozen objects waits until the worker stops.
    Off, the process's collector is left alone. Defaults to True."""

    fair_pools: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Pools claimed fairly across tenants: each claim takes an even share of its batch from
    every tenant with runnable runs (runs without a tenant get what the shares leave), so one
    tenant's backlog cannot hold back another's runs. Costs a second statement per claim and
    about one index probe per tenant.
    Defaults to [] (every pool claims best priority, then oldest first)."""

    @field_validator("pools", "fair_pools", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _string_list(value)

    @field_validator("pools", "fair_pools")
    @classmethod
    def _names(cls, pools: list[str], info: ValidationInfo) -> list[str]:
        for pool in pools:
            if not POOL_NAME.fullmatch(pool):
                raise ValueError(f"pool name {pool!r} must match {POOL_NAME.pattern}")
        if not pools and info.field_name == "pools":
            raise ValueError("pools must name at least one pool")
        return pools

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if self.heartbeat_interval_s is not None and self.heartbeat_interval_s >= self.lease_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be less than "
                f"lease_s ({self.lease_s})"
            )
        return self

    @property
    def heartbeat_every_s(self) -> float:
        return self.heartbeat_interval_s or self.lease_s / 3


class ReaperSettings(_Section):
    """The reaper (on the leader only): runs whose lease expired, because their worker died or
    hung without heartbeating, go back to ``pending``, or to ``failed`` when out of
    attempts."""

    enabled: bool = True
    """Whether this process runs the reaper while it is the leader (off on every process, the
    runs of a crashed worker are never rescued). Defaults to True."""
    interval_s: Seconds = 5.0
    """How often the leader looks for expired leases (and once as it is elected): a crashed
    worker's runs are back in line within ``worker.lease_s`` plus this (plus 10 % jitter) of
    its last heartbeat; a crashed leader's, within the larger of that and ``leader.ttl_s``.
    Defaults to 5.0."""
    batch_size: Annotated[int, Field(ge=1)] = 1000
    """Most runs rescued per statement. Defaults to 1000."""


class ResumerSettings(_Section):
    """The resumer (on the leader only): waiting runs whose wait is over (a durable sleep that
    elapsed, a wait past its deadline) go back in line."""

    enabled: bool = True
    """Whether this process runs the resumer while it is the leader (off on every process,
    durable sleeps and wait deadlines never end). Defaults to True."""
    interval_s: Seconds = 0.5
    """How often due durable sleeps and wait deadlines are looked for: a sleep resumes within
    about this much of its end. Defaults to 0.5."""
    batch_size: Annotated[int, Field(ge=1)] = 1000
    """Most waiting runs put back in line per statement. Defaults to 1000."""


class PurgerSettings(_Section):
    """The purger (on the leader only): deletes finished runs past their retention and queued
    signals nobody waited for, in batches, so the tables stay small."""

    enabled: bool = True
    """Whether this process runs the purger while it is the leader (off on every process,
    finished runs and unreceived signals are kept forever). Defaults to True."""
    interval_s: Seconds = 60.0
    """How often the leader purges. Defaults to 60.0."""
    batch_size: Annotated[int, Field(ge=1)] = 2000
    """Most rows deleted per statement (each batch is its own short transaction). Defaults to
    2000."""
    completed_retention_s: Seconds = 86_400.0
    """Completed runs are kept this long. Defaults to 1 day."""
    failed_retention_s: Seconds = 7 * 86_400.0
    """Failed and timed-out runs (the dead-letter) are kept this long. Defaults to 7 days."""
    canceled_retention_s: Seconds = 86_400.0
    """Canceled runs are kept this long. Defaults to 1 day."""
    signal_retention_s: Seconds = 7 * 86_400.0
    """A signal no run has waited for (queued for the next ``wait_for_signal`` on its token) is
    dropped after this long. Defaults to 7 days."""


class EnqueueSettings(_Section):
    """How enqueues of this process are checked."""

    allow_unknown_types: bool = False
    """Accept job types no worker has registered (a producer deployed before its workers).
    Without it, once any worker has registered handlers (rows in ``notifyq.job``), enqueueing
    another type raises ``UnknownJobType``; before the first worker starts every type is
    accepted. A call's ``allow_unknown_type=`` wins. Defaults to False."""


class LeaderSettings(_Section):
    """The election that makes one worker process of the cluster the leader, the one that runs
    the reaper, the resumer and the purger."""

    ttl_s: Seconds = 15.0
    """A leader that stops renewing (it renews every ttl_s / 3) loses the role after this, and
    another process takes it the moment it runs out and runs the reaper, resumer and purger at
    once: a leader that crashed is replaced within ttl_s. Lower values fail over sooner for one
    tiny statement per process every ttl_s / 3 (tested down to 1 s:
    tests/chaos/test_leader_failover.py); a leader whose database stalls longer than ttl_s loses
    the role meanwhile, which is harmless (the runners re-check everything they change).
    Defaults to 15.0."""


MIN_TOKEN_LEN = 16


class ApiToken(_Section):
    """One bearer token of the admin API (config file: ``api.tokens``)."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    """Shown in logs instead of the token. Required."""
    token: SecretStr
    """The bearer token itself (at least 16 characters). Required."""
    scopes: list[Literal["read", "admin"]] = Field(
        default_factory=lambda: ["read"])  # type: ignore[arg-type]
    """``read`` lists and gets; ``admin`` may also change things (enqueue, cancel, retry,
    signals, keys, webhooks). Defaults to ["read"]."""
    tenants: list[Annotated[str, Field(min_length=1, max_length=512)]] | None = Field(
        default=None, min_length=1)
    """The tenants (``tenant_id``) whose runs, signals, webhook endpoints and messages this token
    sees and changes; the objects of other tenants (or of none) do not exist for it (404). Such
    a token cannot use the operations about the whole cluster (stats, pools, workers, pauses,
    schedules, keys: 403), and what it enqueues or creates belongs to one of its tenants.
    Defaults to none: every tenant."""

    @model_validator(mode="after")
    def _check(self) -> ApiToken:
        if len(self.token.get_secret_value()) < MIN_TOKEN_LEN:
            raise ValueError(f"token {self.name!r} must be at least {MIN_TOKEN_LEN} characters")
        return self


class ApiSettings(_Section):
    """The admin HTTP API of ``notifyq serve``."""

    host: str = "127.0.0.1"
    """Address to bind. Defaults to "127.0.0.1" (a non-loopback address needs a token)."""
    port: Annotated[int, Field(ge=0, le=65_535)] = 8080
    """Port to bind (``--port`` overrides it). Defaults to 8080."""
    admin_token: SecretStr | None = None
    """Bearer token with every scope and every tenant (at least 16 characters, none other
    with the same value); also ``NOTIFYQ_ADMIN_TOKEN``. With no token configured
    at all, ``notifyq serve`` on a loopback address generates one and says where it keeps it.
    Defaults to none."""
    read_token: SecretStr | None = None
    """Bearer token with the read scope, for every tenant (at least 16 characters, none other
    with the same value); also ``NOTIFYQ_READ_TOKEN``. Defaults to none."""
    tokens: list[ApiToken] = Field(default_factory=list)
    """More named tokens with their scopes, and tenants if limited to some. Defaults to
    none."""
    max_body_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 1_048_576
    """Larger ``/v1`` request bodies are refused (413) before they are parsed; outside ``/v1``
    a body may be at most what its route takes (none, or the dashboard's forms). Defaults to
    1 MiB."""
    body_timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    """How long a request body may take to arrive once its headers have: a slower one is
    answered 408 and its connection closed. Defaults to 10.0."""
    read_timeout_s: Annotated[int, Field(ge=int(MAX_RESULT_WAIT_S) + 1, le=3600)] = 120
    """A connection on which nothing arrives for this long is closed (hypercorn's
    ``read_timeout``), even while its request is being answered: keep it above the longest
    ``?wait=`` (60 s) and your slowest bulk action. Defaults to 120."""
    max_concurrent_requests: Annotated[int, Field(ge=1, le=100_000)] = 256
    """Requests handled at once; one more is answered 503 (``Retry-After: 1``) before anything
    reads it, and its connection closed. hypercorn has no connection limit of its own: a
    connection without a request in flight is closed after 5 s idle, headers included.
    Defaults to 256."""

    @field_validator("admin_token", "read_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < MIN_TOKEN_LEN:
            raise ValueError(f"must be at least {MIN_TOKEN_LEN} characters (e.g. the output "
                             "of `openssl rand -hex 24`)")
        return token

    @model_validator(mode="after")
    def _distinct(self) -> ApiSettings:
        """Two tokens with one value would be one token with the rights of whichever is
        compared last (an admin token equal to the read token acted as read)."""
        named = [("admin_token", self.admin_token), ("read_token", self.read_token),
                 *((f"tokens[{t.name!r}]", t.token) for t in self.tokens)]
        seen: dict[str, str] = {}
        for name, token in named:
            if token is None:
                continue
            value = token.get_secret_value()
            if value in seen:
                raise ValueError(f"{name} has the same value as {seen[value]}: give each "
                                 "token its own value")
            seen[value] = name
        names = [*(["admin"] if self.admin_token else []),
                 *(["read"] if self.read_token else []), *(t.name for t in self.tokens)]
        if len(set(names)) != len(names):
            raise ValueError("tokens: each token needs a name of its own (admin_token is "
                             "called 'admin', read_token 'read'); a dashboard session knows "
                             "its token by name")
        return self


class EmbeddedSettings(_Section):
    """The local PostgreSQL started when no database_url is set (extra ``notifyq[embedded]``)."""

    enabled: bool = True
    """Start one when database_url is unset. Defaults to True."""
    data_dir: str | None = None
    """Where its data lives (``--data-dir`` of ``serve``, ``worker`` and ``migrate`` overrides
    it; the other commands look for the running server here). Defaults to /var/lib/notifyq/pg
    as root, else the user data directory (e.g. ~/.local/share/notifyq/pg)."""


class WebhookSettings(_Section):
    """Webhook delivery (``webhook.deliver``): timeouts, retries, the SSRF guard."""

    enabled: bool | None = None
    """Whether this process installs webhooks (``app.webhooks``, the ``webhook.deliver``
    handler and a producer for the ``webhooks`` pool); true without a keyring is an error.
    Defaults to none: enabled when a keyring is configured (endpoint secrets are stored
    encrypted), so a worker without keys does not poll a pool nobody uses."""

    allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """CIDRs the SSRF guard lets through although they are not public (e.g.
    ``NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS=127.0.0.0/8,::1/128``, or a JSON list). Defaults to
    none."""
    allowed_ports: Annotated[list[Annotated[int, Field(ge=1, le=65_535)]], NoDecode] = Field(
        default_factory=list)
    """The only destination ports webhooks may be sent to (e.g.
    ``NOTIFYQ_WEBHOOKS__ALLOWED_PORTS=443,8443``), checked with the address at every new
    connection: a URL's port can aim a public host's other services. Defaults to none: any
    port."""
    https_only: bool = False
    """Refuse ``http://`` endpoint URLs. Defaults to False."""
    connect_timeout_s: Seconds = 5.0
    """How long connecting to the receiver may take; at most timeout_s. Defaults to 5.0."""
    timeout_s: Seconds = 15.0
    """The whole attempt (connect, send, response and its body), enforced by notifyq: a server
    that drips bytes cannot hold a worker longer. Defaults to 15.0."""
    response_max_bytes: Annotated[int, Field(ge=0, le=1_048_576)] = 20_000
    """Response body bytes read (raw) and stored. Defaults to 20000."""
    retry_schedule_s: Annotated[list[Annotated[float, Field(ge=0)]],
                                Field(min_length=1, max_length=100)] = Field(
        default_factory=lambda: [0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0])
    """The delay before each scheduled attempt (the first is the send itself). Defaults to
    immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h."""
    jitter: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Each delay is spread by this fraction either way. Defaults to 0.2."""
    retry_after_max_s: Seconds = 86_400.0
    """A ``Retry-After`` is honoured up to this long. Defaults to 1 day."""
    throttled_min_s: Annotated[float, Field(ge=0)] = 60.0
    """After a 429 or a timeout, wait at least this long. Defaults to 60.0."""
    permanent_statuses: list[Annotated[int, Field(ge=400, le=499)]] = Field(
        default_factory=list)
    """4xx statuses that end the delivery at once instead of retrying (410 always does, and
    disables the endpoint). Defaults to none."""
    disable_after_s: Seconds = 5 * 86_400.0
    """An endpoint failing continuously this long (no success) is disabled. Defaults to 5
    days."""
    allow_unknown_event_types: bool = False
    """Once the event-type catalog holds a type (``app.webhooks.define_event_type``), sends of
    a type it does not hold and endpoints subscribing to one are refused; true lets them
    through (payloads of cataloged types are still checked against their schema). An empty
    catalog refuses nothing. Defaults to False."""
    secret_grace_s: Annotated[float, Field(ge=0)] = 86_400.0
    """After a secret rotation the old secret still signs this long. Defaults to 1 day."""
    max_connections: Annotated[int, Field(ge=1, le=10_000)] = 100
    """Pooled connections across destinations (kept alive per destination). Defaults to 100."""
    endpoint_concurrency: Annotated[int, Field(ge=1, le=10_000)] = 5
    """Deliveries to one endpoint in flight at once, across all workers, to begin with: each
    endpoint's share then adapts (one more after a batch of fast successes, halved for each
    timeout, connect error, 429, 502-504 or answer slower than ``endpoint_slow_s``) between 1
    and ``endpoint_concurrency_max``, enforced when runs are claimed. Defaults to 5."""
    endpoint_concurrency_max: Annotated[int, Field(ge=1, le=10_000)] = 100
    """The most deliveries to one endpoint in flight at once, however fast it answers. A share
    above a worker's ``--concurrency`` lets one endpoint that suddenly stops answering hold
    that worker's slots for one ``timeout_s`` before its share collapses and its circuit
    opens. Defaults to 100."""
    endpoint_slow_s: Seconds = 5.0
    """An answer slower than this counts against the endpoint's share like a timeout.
    Defaults to 5.0."""
    breaker_failures: Annotated[int, Field(ge=0, le=10_000)] = 5
    """Failed attempts in a row (no success between) that open an endpoint's circuit: its
    deliveries are parked for ``breaker_cooldown_s``, then one probe decides whether it closes.
    0 turns the breaker off. Defaults to 5."""
    breaker_cooldown_s: Seconds = 60.0
    """How long an open circuit parks an endpoint's deliveries before a probe. Defaults to
    60.0."""
    retry_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    """The share of a worker's ``--concurrency`` that webhook retries (deliveries attempted
    before) may hold at once, at least one slot; the rest is kept for first attempts, which are
    also claimed before retries. 1 lets retries take every slot (first attempts still go
    first in each claim). Defaults to 0.5."""
    portal_url: Annotated[str, Field(pattern=r"^https?://[^/?#]+(/[^?#]*)?$")] | None = None
    """Where customers reach this server's customer portal (e.g.
    ``https://hooks.example.com``; ``/portal/link#...`` is appended): the address of the sign-in
    links ``POST /v1/portal/links`` mints. Defaults to none: the address the minting request
    was sent to."""
    portal_link_ttl_s: Annotated[float, Field(ge=10, le=86_400)] = 900.0
    """How long a minted portal sign-in link stays valid when the call gives no ``ttl_s``
    (a link is spent by its first use in any case). Defaults to 900 (15 min)."""
    portal_session_s: Annotated[float, Field(ge=60, le=7 * 86_400)] = 7200.0
    """How long a customer portal session lasts after signing in. Defaults to 7200 (2 h)."""
    failing_alert_after_s: Annotated[float, Field(ge=0)] = 3600.0
    """An endpoint failing continuously this long (no success) raises one
    ``endpoint.failing`` operator event per failure streak, well before ``disable_after_s``
    disables it. 0 turns the event off. Defaults to 1 hour."""
    operator_endpoint_id: UUID | None = None
    """The webhook endpoint operator events are sent to, as ordinary signed and retried
    messages of types ``notifyq.endpoint.disabled`` etc. (create an endpoint for your own
    receiver, subscribed to ``notifyq.*`` types only, and put its id here; the leader's
    setting is the one used). Defaults to none: operator events are logged, counted and
    listed only."""
    operator_events_interval_s: Seconds = 5.0
    """How often the leader looks for endpoints failing for long and emits the operator
    events recorded since (log line, metric, webhook). Defaults to 5.0."""
    operator_events_retention_s: Seconds = 30 * 86_400.0
    """Emitted operator events are kept this long (listed by ``app.webhooks.operator_events``,
    ``GET /v1/webhooks/operator-events``). Defaults to 30 days."""
    payload_retention_s: Seconds = 30 * 86_400.0
    """A message's payload is dropped this long after it was sent (``send(...,
    payload_retention_s=)`` sets one message's own): its body becomes empty and
    ``payload_dropped_at`` says when, while the message, its deliveries and attempts stay, and
    it can no longer be resent, recovered or replayed. Run by the leader every
    ``purger.interval_s``. Defaults to 30 days."""
    attempt_retention_s: Seconds = 30 * 86_400.0
    """Attempts are kept at least this long, then go a day at a time: ``webhook_attempt`` is
    partitioned by day (UTC) and a day's partition is dropped once all of it is older than
    this (no DELETE, no bloat). Defaults to 30 days."""
    partitions_ahead_days: Annotated[int, Field(ge=1, le=366)] = 7
    """How many days of ``webhook_attempt`` partitions the leader keeps made ahead (attempts
    with no partition for their day go to a default one). Defaults to 7."""

    @field_validator("allowed_networks", "allowed_ports", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _string_list(value)

    @model_validator(mode="after")
    def _check(self) -> WebhookSettings:
        import ipaddress

        for cidr in self.allowed_networks:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allowed_networks: {cidr!r} is not a CIDR "
                                 "(e.g. 10.0.0.0/8 or ::1/128)") from None
        if self.connect_timeout_s > self.timeout_s:
            raise ValueError(f"connect_timeout_s ({self.connect_timeout_s}) cannot be more "
                             f"than timeout_s ({self.timeout_s})")
        if self.endpoint_concurrency > self.endpoint_concurrency_max:
            raise ValueError(f"endpoint_concurrency ({self.endpoint_concurrency}) cannot be "
                             f"more than endpoint_concurrency_max "
                             f"({self.endpoint_concurrency_max})")
        return self


class EncryptedColumnSettings(_Section):
    """One encrypted column of yours (config file: ``encrypted_columns``), rotated by
    ``secret.reencrypt`` and counted by ``notifyq keys status``."""

    table: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}\."
                                        r"[A-Za-z_][A-Za-z0-9_$]{0,62}$")]
    """``schema.table``. Required."""
    pk: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")] = "id"
    """The primary key column (single-column keys only). Defaults to "id"."""
    column: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")]
    """The ``bytea`` column holding notifyq ciphertexts. Required."""


class Settings(BaseSettings):
    """Everything notifyq reads from its environment."""

    model_config = SettingsConfigDict(
        env_prefix="NOTIFYQ_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    database_url: str | None = None
    """The PostgreSQL to use: a libpq connection string or URL. Without it, ``notifyq serve``,
    ``worker`` and ``migrate`` start the embedded PostgreSQL (extra ``notifyq[embedded]``,
    data in ``embedded.data_dir``), and the other commands and ``App()`` of the same user use
    the one they run (they find its URL in the data directory) or, when none runs, refuse
    in one line that says what to export. Defaults to none."""
    listen_database_url: str | None = None
    """A separate DSN for the LISTEN connection (e.g. direct to PostgreSQL when the pool goes
    through PgBouncer in transaction mode). Defaults to ``database_url``, unless
    ``database_transaction_pooling`` is set (then no LISTEN without it)."""
    database_transaction_pooling: bool = False
    """``database_url`` goes through a pooler in transaction mode (PgBouncer's ``pool_mode =
    transaction``), where consecutive statements outside a transaction may run on different
    server sessions: notifyq then prepares no statements (PgBouncer before 1.21, or without
    ``max_prepared_statements``, cannot route them), sets nothing for a session, and never
    LISTENs on ``database_url`` (set ``listen_database_url`` to a direct connection, or turn
    ``worker.listen`` off to poll). Defaults to False."""
    schema_name: str = "notifyq"
    """The PostgreSQL schema holding notifyq's tables and SQL functions (lowercase letters,
    digits and ``_``). Defaults to "notifyq"."""
    env: Literal["production", "development", "test"] = "production"
    """What a job type registered twice in one app does: ``production`` refuses it
    (``ConfigError``), ``development`` lets the later handler win with a warning, ``test`` lets
    it win silently. Defaults to "production"."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Level of the log the ``notifyq`` commands write to stderr (an ``App`` inside your own
    process logs through your logging setup). Defaults to "INFO"."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """Format of the ``notifyq`` commands' log: ``auto`` is JSON lines when stderr is not a
    terminal, text when it is. Defaults to "auto"."""
    pool_max_size: Annotated[int, Field(ge=1, le=1000)] = 10
    """Connections in the process's pool. Beside it, a worker opens up to three (its LISTEN
    connection and its completer's, ``worker.completer_connections``) and a process that
    enqueues one (its enqueues' own). Defaults to 10."""
    max_input_bytes: Annotated[int, Field(ge=1, le=65_536)] = 65_536
    """Largest serialized input of a run this process enqueues (``PayloadTooLarge`` above it);
    the database refuses more than 65536 bytes whatever this says. Defaults to 65536 (the hard
    limit)."""
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    enqueue: EnqueueSettings = Field(default_factory=EnqueueSettings)
    reaper: ReaperSettings = Field(default_factory=ReaperSettings)
    resumer: ResumerSettings = Field(default_factory=ResumerSettings)
    purger: PurgerSettings = Field(default_factory=PurgerSettings)
    leader: LeaderSettings = Field(default_factory=LeaderSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    keys: SecretStr | None = None
    """Master keys, ``VERSION:BASE64`` of 32 bytes each, comma-separated; every version
    decrypts, the cluster's active version encrypts. Never logged, never stored in the
    database. Defaults to none (no keyring)."""
    key_file: Path | None = None
    """A file of ``VERSION:BASE64`` lines instead of ``keys`` (not both). Defaults to none."""
    active_key_version: Annotated[int, Field(ge=1)] | None = None
    """The version new secrets are encrypted under while the cluster has no active version yet
    (the first one); after that the database's active version (``notifyq keys promote``)
    decides, and a newer version named here is promoted by this process once every live
    process holds it (an older one is ignored). Must be one of ``keys``. Defaults to none:
    follow the cluster's."""
    key_check_interval_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """How often a process holding a keyring checks it against the database again (key check
    values, the active version, retired versions) and renews its key holder row, which counts
    for three intervals. Every process checks before its first encrypt or decrypt; workers and
    ``serve`` also check on their own, and at once when a promotion or retirement is announced;
    other processes follow a promotion or retirement within this time. Defaults to 10.0."""
    encrypted_columns: list[EncryptedColumnSettings] = Field(default_factory=list)
    """Your encrypted columns (``NOTIFYQ_ENCRYPTED_COLUMNS`` as a JSON list of
    {"table", "pk", "column"}); code can add more with ``App.encrypted_column``. Defaults to
    none."""

    def __repr_args__(self) -> Any:
        """``repr(settings)`` (and ``str``) with the DSNs' passwords masked: settings end up in
        logs, tracebacks and debuggers. ``settings.database_url`` itself is unchanged."""
        for name, value in super().__repr_args__():
            dsn = name in ("database_url", "listen_database_url") and isinstance(value, str)
            yield name, redact_dsn(value) if dsn else value

    @model_validator(mode="before")
    @classmethod
    def _token_shorthands(cls, data: Any) -> Any:
        """``NOTIFYQ_ADMIN_TOKEN`` / ``NOTIFYQ_READ_TOKEN`` are short for
        ``NOTIFYQ_API__ADMIN_TOKEN`` / ``NOTIFYQ_API__READ_TOKEN`` (the long form wins)."""
        shorthands = {name: os.environ[f"NOTIFYQ_{name.upper()}"]
                      for name in ("admin_token", "read_token")
                      if os.environ.get(f"NOTIFYQ_{name.upper()}")}
        if not shorthands or not isinstance(data, dict):
            return data
        api = data.get("api") or {}
        if isinstance(api, BaseModel):
            api = {k: getattr(api, k) for k in api.model_fields_set}
        return {**data, "api": {**shorthands, **api}}

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not SCHEMA_NAME.fullmatch(self.schema_name):
            raise ValueError(f"schema_name {self.schema_name!r} must match {SCHEMA_NAME.pattern}")
        return self

    @model_validator(mode="after")
    def _check_pooling(self) -> Settings:
        if (self.database_transaction_pooling and self.listen_database_url is None
                and self.worker.listen):
            raise ValueError(
                "database_transaction_pooling is on, and LISTEN through a transaction pool "
                "loses its notifications: set listen_database_url "
                "(NOTIFYQ_LISTEN_DATABASE_URL) to a direct connection to PostgreSQL, or "
                "worker.listen to false (NOTIFYQ_WORKER__LISTEN=false) to poll")
        return self

    @property
    def listen_url(self) -> str | None:
        """Where a LISTEN connects: ``listen_database_url``, else ``database_url`` unless it
        goes through a transaction pool (None: nowhere; poll)."""
        if self.listen_database_url is not None:
            return self.listen_database_url
        return None if self.database_transaction_pooling else self.database_url

    @model_validator(mode="after")
    def _check_keys(self) -> Settings:
        from notifyq._crypto.keyring import configured_keys

        keys = self.keys.get_secret_value() if self.keys is not None else None
        configured_keys(keys, self.key_file, self.active_key_version)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _EnvSource(settings_cls)]
        path = os.environ.get("NOTIFYQ_CONFIG_FILE")
        if path and not Path(path).is_file():
            raise ConfigError(f"NOTIFYQ_CONFIG_FILE: no such file {path!r}")
        path = path or ("notifyq.yaml" if Path("notifyq.yaml").is_file() else None)
        if path:
            sources.append(_yaml_source(settings_cls, path))
        return tuple(sources)


class _EnvSource(EnvSettingsSource):
    """The ``NOTIFYQ_*`` variables. A list or section that is not valid JSON is handed on as the
    string it is, so validation names the setting and its variable (pydantic-settings would
    raise a bare JSONDecodeError naming neither)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo,
                             value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value


def _yaml_source(settings_cls: type[BaseSettings], path: str) -> YamlConfigSettingsSource:
    """The config file, read now; a YAML syntax error names the file, line and column."""
    import yaml

    try:
        return YamlConfigSettingsSource(settings_cls, yaml_file=path)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {exc.problem}{context}") from None
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc}") from None
    except (ValueError, TypeError):  # valid YAML, but a list or a scalar at the top
        raise ConfigError(f"{path}: the config file must be a mapping of settings, one "
                          "`name: value` per line (e.g. `database_url: postgresql://…`)"
                          ) from None


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings; raise ConfigError naming every bad setting."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    except SettingsError as exc:  # a source failed in a way validation never saw
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(f"invalid configuration: {exc}{cause}") from None


# Validation errors about a value of the wrong shape; from the environment such a value is a
# string that was not JSON.
_SHAPE_ERRORS = {"list_type", "dict_type", "model_type", "model_attributes_type"}


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        path = [str(part) for part in error["loc"]]
        env = "NOTIFYQ_" + "__".join(part.upper() for part in path) if path else "NOTIFYQ_*"
        where = ".".join(path) or "settings"
        hint = ""
        if error["type"] in _SHAPE_ERRORS and isinstance(error.get("input"), str):
            shape = "list" if error["type"] == "list_type" else "object"
            hint = f" (in the environment: a JSON {shape})"
        problems.append(f"{where} ({env}): {error['msg']}{hint}")
    return "invalid configuration: " + "; ".join(problems)
