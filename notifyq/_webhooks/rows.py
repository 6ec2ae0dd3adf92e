"""What ``app.webhooks`` returns about messages, deliveries and attempts: dicts (the public API
hands them out as such), typed here so that a key the code reads is checked by mypy.

Each ``...Row`` is exactly its query's columns (tests/db/test_typed_rows.py checks it); the
classes below them add what the service computes.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict
from uuid import UUID

from notifyq._db.rows import typed_dict_row


class MessageRow(TypedDict):
    """webhook_message_get"""

    id: str
    event_type: str
    body: str
    endpoint_id: UUID | None
    idempotency_key: str | None
    created_at: datetime
    payload_retain_until: datetime | None
    """When this message's payload is dropped, if it was given a retention of its own (else
    ``webhooks.payload_retention_s`` after ``created_at``)."""
    payload_dropped_at: datetime | None
    """When retention dropped the payload (``body`` is then empty); None while it is kept."""


class DeliveryRow(TypedDict):
    """webhook_delivery_list: a delivery of a message to one endpoint, with its url."""

    message_id: str
    endpoint_id: UUID
    status: str
    attempts: int
    run_id: UUID | None
    last_status_code: int | None
    last_error: str | None
    last_attempt_at: datetime | None
    created_at: datetime
    updated_at: datetime
    url: str
    next_attempt_at: datetime | None
    """A pending delivery's next attempt (None once it has started, or when not pending)."""
    held_until: datetime | None
    """While the endpoint's circuit is open, until when its pending deliveries wait."""


class Delivery(DeliveryRow):
    max_attempts: int
    """The scheduled attempts it gets (``webhooks.retry_schedule_s``' length)."""


class Message(MessageRow):
    deliveries: list[Delivery]


class AttemptRow(TypedDict):
    """webhook_attempt_list"""

    id: int
    message_id: str
    endpoint_id: UUID
    run_id: UUID | None
    trigger: str
    """scheduled or manual"""
    attempt: int
    webhook_timestamp: int
    url: str
    status_code: int | None
    error_kind: str | None
    error: str | None
    duration_ms: float
    response_body: str | None
    response_truncated: bool
    next_attempt_at: datetime | None
    created_at: datetime


class Attempt(AttemptRow):
    max_attempts: int | None
    """A scheduled attempt's series length; None for a manual resend (never retried)."""


class Resent(TypedDict):
    """webhook_delivery_resend: the run of a manual attempt to one endpoint."""

    endpoint_id: UUID
    run_id: UUID


class Recovered(TypedDict):
    """webhook_delivery_recover: a failed delivery that starts a new series."""

    message_id: str
    run_id: UUID


message_row = typed_dict_row(MessageRow)
delivery_row = typed_dict_row(DeliveryRow)
attempt_row = typed_dict_row(AttemptRow)
resent_row = typed_dict_row(Resent)
recovered_row = typed_dict_row(Recovered)
