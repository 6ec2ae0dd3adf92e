"""Request and response bodies of the admin API (they are its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from notifyq._http.schemas import Text
from notifyq._limits import (
    MAX_ATTEMPTS_RANGE,
    MAX_BATCH_RUNS,
    MAX_INPUT_BYTES,
    MAX_JOB_TYPE_LEN,
    MAX_KEY_LEN,
    MAX_POOL_LEN,
    MAX_STEP_ID_LEN,
    MAX_TAG_LEN,
    MAX_TAGS,
    PRIORITY_RANGE,
)
from notifyq._run import RunStatus

JsonValue = dict[str, Any] | list[Any]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueIn(_In):
    """One run to enqueue. Unset fields take the job type's defaults."""

    job_type: Annotated[Text, Field(min_length=1, max_length=MAX_JOB_TYPE_LEN,
                                    examples=["email.send"])]
    input: JsonValue = Field(default_factory=dict, description="a JSON object or array, "
                             f"at most {MAX_INPUT_BYTES // 1024} KiB serialized")
    run_at: AwareDatetime | None = Field(None, description="not before this time (with offset)")
    priority: Annotated[int, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])] | None = None
    pool: Annotated[Text, Field(min_length=1, max_length=MAX_POOL_LEN)] | None = None
    max_attempts: Annotated[int, Field(ge=MAX_ATTEMPTS_RANGE[0],
                                       le=MAX_ATTEMPTS_RANGE[1])] | None = None
    dedupe_key: Annotated[Text, Field(min_length=1, max_length=MAX_KEY_LEN)] | None = Field(
        None, description="an existing run with this key is returned instead (200)")
    tags: Annotated[list[Annotated[Text, Field(min_length=1, max_length=MAX_TAG_LEN)]],
                    Field(max_length=MAX_TAGS)] | None = None
    tenant_id: Annotated[Text, Field(min_length=1, max_length=MAX_KEY_LEN)] | None = None


class BatchIn(_In):
    jobs: Annotated[list[EnqueueIn], Field(min_length=1, max_length=MAX_BATCH_RUNS)]


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


class WaitOut(BaseModel):
    kind: str = Field(description="sleep, children or signal")
    until: datetime | None = Field(None, description="the sleep's end or the wait's deadline")
    token: str | None = None
    waiting_on: list[UUID] = Field(default_factory=list)
    children_done: list[UUID] = Field(default_factory=list)


class RunDetail(RunOut):
    steps: list[StepOut] = Field(default_factory=list)
    children: list[RunOut] = Field(default_factory=list)
    wait: WaitOut | None = Field(None, description="what a waiting run waits for")


class ReplayIn(_In):
    from_step: Annotated[Text, Field(min_length=1, max_length=MAX_STEP_ID_LEN, description=(
        "the step id to run again from; the steps recorded before it are reused"))]


class ReplayInfo(BaseModel):
    from_step: str
    steps_kept: int = Field(description="steps recorded before from_step, reused by the replay")
    steps_dropped: int = Field(description="from_step and the later steps, which run again")


class ReplayOut(RunOut):
    replay: ReplayInfo


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


class PauseOut(BaseModel):
    kind: Literal["pool", "type"]
    name: str
    reason: str | None
    paused_at: datetime


class StatsOut(BaseModel):
    counts: list[CountRow]
    runnable: list[RunnableRow]
    paused: list[PauseOut]


class PauseIn(_In):
    reason: Annotated[Text, Field(min_length=1, max_length=500)] | None = Field(
        None, description="shown with the pause (dashboard, CLI, API)")


class PausedOut(PauseOut):
    created: bool = Field(description="false: it was paused already (paused_at is the first "
                                      "pause's; a reason given replaces the old one)")


class ResumedOut(BaseModel):
    kind: Literal["pool", "type"]
    name: str
    resumed: bool = Field(description="false: it was not paused")


class PausesOut(BaseModel):
    items: list[PauseOut]


class RateWindowOut(BaseModel):
    key: str
    pool: str
    limit: int
    period_s: float
    in_window: int = Field(description="starts inside the last period_s seconds")
    runnable: int = Field(description="runs of the key waiting to start")
    next_start_at: datetime | None = Field(description="when the next run may start; null: now")


class RateWindowsOut(BaseModel):
    items: list[RateWindowOut]


class SignalOut(BaseModel):
    token: str
    woken: int = Field(description="1: a waiting run received it; 0: queued for the next "
                                   "wait on the token")


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class FilterIn(_In):
    """Which runs: every field narrows; none set means every run."""

    status: RunStatus | None = None
    job_type: Annotated[Text, Field(min_length=1, max_length=128)] | None = None
    pool: Annotated[Text, Field(min_length=1, max_length=64)] | None = None
    tag: Annotated[Text, Field(min_length=1, max_length=128)] | None = None
    scope_entity_type: Annotated[Text, Field(min_length=1, max_length=512)] | None = None
    scope_entity_id: Annotated[Text, Field(min_length=1, max_length=512)] | None = None
    tenant_id: Annotated[Text, Field(min_length=1, max_length=512)] | None = None
    trigger_source: Literal["manual", "schedule", "event", "parent"] | None = None
    parent_run_id: UUID | None = None
    created_after: AwareDatetime | None = None
    created_before: AwareDatetime | None = None
    id_prefix: Annotated[str, Field(pattern=r"^[0-9a-fA-F-]*[0-9a-fA-F][0-9a-fA-F-]*$",
                                    max_length=36)] | None = None


class BulkIn(_In):
    action: Literal["cancel", "retry", "delete", "reschedule"] = Field(description=(
        "cancel: pending, waiting, running (asked to stop); retry: failed, canceled, "
        "timed_out; delete: finished runs only; reschedule: pending runs, to run_at"))
    ids: Annotated[list[UUID], Field(min_length=1, max_length=10_000)] | None = None
    filter: FilterIn | None = None
    dry_run: bool = Field(False, description="with filter: only count the runs the action "
                                             "applies to (up to 10,000)")
    run_at: AwareDatetime | None = Field(None, description="reschedule: the new run_at "
                                                            "(required; with an offset)")
    batch_size: Annotated[int, Field(ge=1, le=5000)] = Field(
        500, description="runs changed per transaction")


class BulkOut(BaseModel):
    action: str
    dry_run: bool
    matched: int | None = Field(None, description="dry_run: runs the action applies to")
    changed: int | None = Field(None, description="runs canceled or put back in line")
    requested: int | None = Field(None, description="running runs asked to stop")
    remaining: int | None = Field(None, description="matching runs left: send it again")
    batches: int | None = Field(None, description="transactions it took")


class PoolRow(BaseModel):
    pool: str
    runnable: int
    scheduled: int
    running: int
    waiting: int
    failed_last_hour: int
    oldest_runnable_age_s: float
    paused: bool = Field(description="no worker claims its runs until it is resumed")


class PoolsOut(BaseModel):
    items: list[PoolRow]


class MinuteRow(BaseModel):
    minute: datetime
    completed: int
    failed: int
    latency_p50_s: float | None
    latency_p95_s: float | None


class SeriesOut(BaseModel):
    items: list[MinuteRow]


class LeaderRow(BaseModel):
    name: str
    leader_id: str
    elected_at: datetime
    expires_at: datetime
    alive: bool


class WorkerRow(BaseModel):
    id: str
    host: str
    pid: int
    version: str
    pools: list[str]
    concurrency: int
    running: int = Field(description="runs executing at the last heartbeat")
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime = Field(description="alive until then unless it heartbeats again")


class WorkersOut(BaseModel):
    items: list[WorkerRow]
    leaders: list[LeaderRow]


class ScheduleRow(BaseModel):
    name: str
    job_type: str
    every_s: float | None = Field(description="the interval of an every= schedule")
    cron: str | None = Field(description="the cron expression of a cron= schedule")
    tz: str | None = Field(description="the IANA time zone the cron expression is read in")
    catch_up: bool = Field(description="missed ticks are enqueued after downtime")
    paused: bool
    paused_at: datetime | None
    last_tick_at: datetime | None
    last_run_id: UUID | None
    last_status: str | None
    next_tick_at: datetime | None = Field(description="None while paused")
    registered_here: bool = Field(description="this server's app declares the schedule")


class SchedulePaused(BaseModel):
    name: str
    paused_at: datetime


class ScheduleResumed(BaseModel):
    name: str
    resumed_at: datetime | None = Field(
        description="ticks before this are skipped; unchanged if the schedule was not paused")


class ScheduleTriggered(BaseModel):
    name: str
    run_id: UUID


class SchedulesOut(BaseModel):
    items: list[ScheduleRow]
