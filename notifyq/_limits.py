"""The limits of what can be enqueued and asked for: the one source for the checks at the edge
(``notifyq._enqueue.validate``), the job policies, durable runs' signals and steps, and the
admin API's schemas, which import these names and state no number of their own.

The database states the run limits too: the ``_enqueue`` function that every SQL enqueue goes
through, the job definition's CHECK constraints and the insert queries (job_run itself checks
only its status and attempts since migration 0020: each CHECK cost every statement that wrote a
run 16-62k server instructions). tests/db/test_limits.py reads
them from the catalog and the query files and fails when the two sides disagree: changing a
limit here needs a migration there, and the other way round.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

MAX_JOB_TYPE_LEN = 128
MAX_POOL_LEN = 64
# A bounded repetition, so one regex says both the characters and the length (the database
# says them apart: a bounded repetition costs its regex engine 6-12 us a row, migration 0005).
JOB_TYPE = re.compile(rf"^[a-z0-9_][a-z0-9_.:-]{{0,{MAX_JOB_TYPE_LEN - 1}}}$")
POOL = re.compile(rf"^[a-z0-9_][a-z0-9_.:-]{{0,{MAX_POOL_LEN - 1}}}$")

BUILTIN_JOB_TYPES = {
    "webhook.deliver": "send webhooks with app.webhooks.send, POST /v1/webhooks/messages or "
                       "`notifyq webhooks send` (resend and recover likewise)",
    "secret.reencrypt": "rotate keys with app.keys.rotate, POST /v1/admin/rotate-key or "
                        "`notifyq keys rotate`",
}
"""notifyq's own job types, by name, with where to ask for them instead: they are enqueued
only by their features (webhooks, key rotation), never by ``App.enqueue``, ``POST /v1/jobs``,
``notifyq enqueue`` or SQL ``notifyq.enqueue``, which refuse them (a tenant's token resent
another tenant's webhook through ``POST /v1/jobs``, issue 31). Migration 0022 names them too."""

MAX_INPUT_BYTES = 65_536
"""A run's input as jsonb prints it (``octet_length(input::text)``)."""
PRIORITY_RANGE = (-1000, 1000)
MAX_ATTEMPTS_RANGE = (1, 1000)
"""A run's ``max_attempts`` and a RetryPolicy's ``attempts``."""
RUN_AT_RANGE = (datetime(2000, 1, 1, tzinfo=UTC), datetime(3000, 1, 1, tzinfo=UTC))
"""``[start, end)``"""
MAX_TAGS = 32
MAX_TAG_LEN = 128
MAX_KEY_LEN = 512
"""Dedupe and concurrency keys, tenant ids, scope entity types and ids."""
CONCURRENCY_LIMIT_RANGE = (1, 100_000)
RATE_LIMIT_RANGE = (1, 10_000)
"""A RateLimit's ``limit`` (the window keeps one timestamp per start)."""
RATE_PERIOD_MAX_S = 86_400.0
MAX_SIGNAL_TOKEN_LEN = 512
MAX_STEP_ID_LEN = 512
MAX_RESULT_WAIT_S = 60.0
"""The longest ``GET /v1/jobs/{id}?wait=`` holds a request (a proxy's idle timeout is often
60 s; a longer wait is a loop of requests on the client's side)."""

MAX_BATCH_RUNS = 1000
"""Runs in one ``POST /v1/jobs/batch``."""
MAX_PAGE = 1000
"""Most items in one listing page (runs, webhook endpoints)."""
