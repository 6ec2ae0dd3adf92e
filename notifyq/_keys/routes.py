"""The key routes under ``/v1``: status (the ``keys status --json`` object, schema version 1),
promote, rotate (throttled, pausable), pause, resume and retire. Thin calls into ``app.keys``
(:class:`~notifyq._keys.admin.KeyAdmin`); refusals are problem details, 409 with the reason
(a promotion refused for processes that lack the version lists them in ``processes``).

Every route is about the whole cluster: ``read_all`` / ``admin_all`` tokens only."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from notifyq._app import App
from notifyq._crypto.ciphertext import MAX_VERSION
from notifyq._errors import ConfigError, PromotionRefused
from notifyq._http.problems import problem
from notifyq._http.schemas import responses_for

AUTH = (401, 403)
Version = Annotated[int, Field(ge=1, le=MAX_VERSION)]
RatePerS = Annotated[float, Field(ge=0, le=10_000_000, description=(
    "rows per second at most (0 lifts a limit set before)"))]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromoteIn(_In):
    version: Version
    force: bool = Field(default=False, description=(
        "promote although live processes lack the version: they then refuse to encrypt and "
        "cannot read what is written under it"))


class PromotionOut(BaseModel):
    version: int
    previous: int | None
    changed: bool = Field(description="false: the version was already active")
    promoted_at: str | None
    forced: bool
    lacking: list[dict[str, Any]] = Field(description="processes that lacked it (forced)")


class RotateIn(_In):
    rate_per_s: RatePerS | None = None
    batch_size: Annotated[int, Field(ge=1, le=10_000)] | None = None
    pause_s: Annotated[float, Field(ge=0, le=60)] | None = None


class RotationOut(BaseModel):
    run_id: UUID
    created: bool = Field(description="false: a rotation to this version was already running")
    run: dict[str, Any] = Field(description="the secret.reencrypt run, as GET /v1/jobs/{id}")


class ResumeIn(_In):
    rate_per_s: RatePerS | None = None


class VersionOut(BaseModel):
    version: int
    active: bool
    configured: bool = Field(description="held by the process answering")
    decrypt_only: bool
    retired: bool
    first_seen_at: str | None
    promoted_at: str | None = Field(description="when it last became active")
    held_by: int = Field(description="live processes that hold it")
    encrypted_by: int = Field(description="live processes that encrypt under it")


class ProcessOut(BaseModel):
    id: str
    role: str = Field(description="worker, serve or app")
    host: str
    pid: int
    versions: list[int]
    encrypts_with: int | None = Field(description="null: it lacks the active version")
    holds_active: bool
    checked_at: str | None
    expires_at: str | None


class ColumnOut(BaseModel):
    column: str
    rows: int
    by_version: dict[str, int]
    remaining: int = Field(description="rows not on the active version")


class CheckpointOut(BaseModel):
    column: str
    pass_: int = Field(alias="pass")
    reencrypted: int
    conflicts: int
    batches: int
    finished: bool


class RotationStatusOut(BaseModel):
    run_id: str
    status: str
    target_version: int
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    paused: bool
    paused_at: str | None
    rate_limit_per_s: float | None
    batch_size: int
    columns: list[CheckpointOut]
    undecryptable: int
    rate_per_s: float | None


class ProgressOut(BaseModel):
    done: int
    total: int
    percent: float
    rate_per_s: float | None
    eta_s: float | None


class PromotionInfo(BaseModel):
    version: int
    promoted_at: str | None
    promoted_by: str
    forced: bool


class KeyStatusOut(BaseModel):
    schema_version: int
    active_version: int | None
    promotion: PromotionInfo | None
    versions: list[VersionOut]
    processes: list[ProcessOut]
    columns: list[ColumnOut]
    rotation: RotationStatusOut | None
    progress: ProgressOut
    rows_left: int
    processes_left: list[str]
    done: bool = Field(description="every row and every live process is on the active version")


def add_key_routes(router: APIRouter, app: App, read: list[Any], admin: list[Any]) -> None:
    keys = app.keys
    tags: list[str | Enum] = ["keys"]

    @router.get("/keys", dependencies=read, response_model=KeyStatusOut, tags=tags,
                response_model_by_alias=True, responses=responses_for(409, *AUTH),
                summary="Key versions, live processes, rows per version and the rotation")
    async def key_status() -> Any:
        async with (await app.pool()).connection() as conn:
            try:
                return await keys.status(conn)
            except ConfigError as exc:
                return problem(409, str(exc), field="keys")

    @router.post("/admin/keys/promote", dependencies=admin, response_model=PromotionOut,
                 tags=tags, responses=responses_for(409, 422, *AUTH),
                 summary="Make a key version the one every process encrypts under")
    async def promote_key(body: PromoteIn, request: Request) -> Any:
        by = f"POST /v1/admin/keys/promote (token {request.state.token.name})"
        async with (await app.pool()).connection() as conn:
            try:
                return await keys.promote(conn, body.version, force=body.force, by=by)
            except PromotionRefused as exc:
                return problem(409, str(exc), field="version",
                               extra={"processes": exc.processes})

    @router.post("/admin/rotate-key", dependencies=admin, status_code=202,
                 response_model=RotationOut, tags=tags, responses=responses_for(409, *AUTH),
                 summary="Re-encrypt to the active key version (idempotent; throttled by "
                         "rate_per_s)")
    async def rotate_key(body: Annotated[RotateIn | None, Body()] = None) -> Any:
        given = body or RotateIn()
        async with (await app.pool()).connection() as conn:
            try:
                run, created = await keys.rotate(conn, batch_size=given.batch_size,
                                                 pause_s=given.pause_s,
                                                 rate_per_s=given.rate_per_s)
            except ConfigError as exc:
                return problem(409, str(exc), field="keys")
        return {"run_id": str(run.id), "created": created, "run": run.to_json()}

    @router.post("/admin/keys/rotation/pause", dependencies=admin, tags=tags,
                 responses=responses_for(409, *AUTH),
                 summary="Pause the rotation before its next batch")
    async def pause_rotation() -> Any:
        async with (await app.pool()).connection() as conn:
            return await keys.pause(conn)

    @router.post("/admin/keys/rotation/resume", dependencies=admin, tags=tags,
                 responses=responses_for(409, 422, *AUTH),
                 summary="Resume a paused rotation (optionally at a new rate)")
    async def resume_rotation(body: Annotated[ResumeIn | None, Body()] = None) -> Any:
        async with (await app.pool()).connection() as conn:
            return await keys.resume(conn, rate_per_s=(body or ResumeIn()).rate_per_s)

    @router.post("/admin/keys/{version}/retire", dependencies=admin, tags=tags,
                 responses=responses_for(409, 422, *AUTH),
                 summary="Retire a key version no row and no live process uses any more")
    async def retire_key(version: Annotated[int, Path(ge=1, le=MAX_VERSION)]) -> Any:
        async with (await app.pool()).connection() as conn:
            try:
                return await keys.retire(conn, version)
            except ConfigError as exc:
                return problem(409, str(exc), field="version")

