"""Request and response bodies of the admin API (they are its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from notifyq._enqueue.validate import MAX_DEDUPE_KEY_LEN, MAX_TAG_LEN, MAX_TAGS
from notifyq._http.schemas import Text

JsonValue = dict[str, Any] | list[Any]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueIn(_In):
    """One run to enqueue. Unset fields take the job type's defaults."""

    job_type: Annotated[Text, Field(min_length=1, max_length=128, examples=["email.send"])]
    input: JsonValue = Field(default_factory=dict, description="a JSON object or array, "
                             "at most 64 KiB serialized")
    run_at: AwareDatetime | None = Field(None, description="not before this time (with offset)")
    priority: Annotated[int, Field(ge=-1000, le=1000)] | None = None
    pool: Annotated[Text, Field(min_length=1, max_length=64)] | None = None
    max_attempts: Annotated[int, Field(ge=1, le=1000)] | None = None
    dedupe_key: Annotated[Text, Field(min_length=1, max_length=MAX_DEDUPE_KEY_LEN)] | None = Field(
        None, description="an existing run with this key is returned instead (200)")
    tags: Annotated[list[Annotated[Text, Field(min_length=1, max_length=MAX_TAG_LEN)]],
                    Field(max_length=MAX_TAGS)] | None = None
    tenant_id: Annotated[Text, Field(min_length=1, max_length=512)] | None = None


class BatchIn(_In):
    jobs: Annotated[list[EnqueueIn], Field(min_length=1, max_length=1000)]


class RunOut(BaseModel):
    id: UUID
    job_type: str
    status: str
    input: Any = None
    pool: str
    priority: int
    run_at: datetime
    attempts: int
    max_attempts: int
    created_at: datetime
    output: Any = None
    error: dict[str, Any] | None = None
    tags: list[str] | None = None
    dedupe_key: str | None = None
    timeout_s: float | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    claimed_at: datetime | None = None
    leased_by: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    parent_run_id: UUID | None = None
    root_run_id: UUID | None = None
    trigger_source: str | None = None
    trigger_ref: str | None = None


class StepOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    step_id: str
    seq: int
    status: str
    output: Any = None
    error: Any = None
    attempts: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class RunDetail(RunOut):
    steps: list[StepOut] = Field(default_factory=list)
    children: list[RunOut] = Field(default_factory=list)


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: UUID | None = Field(
        None, description="pass as `cursor` for the next (older) page; null on the last page")


class BatchOut(BaseModel):
    items: list[RunOut]


class CountRow(BaseModel):
    job_type: str
    pool: str
    status: str
    count: int


class RunnableRow(BaseModel):
    pool: str
    runnable: int
    oldest_age_s: float


class StatsOut(BaseModel):
    counts: list[CountRow]
    runnable: list[RunnableRow]


class SignalOut(BaseModel):
    token: str
    woken: int = Field(description="1: a waiting run received it; 0: queued for the next "
                                   "wait on the token")


class RotationOut(BaseModel):
    run_id: UUID
    created: bool = Field(description="false: a rotation to this version was already running")
    run: RunOut


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
