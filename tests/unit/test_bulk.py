"""Bulk enqueue's pieces: ids in bulk, the batch encoder, runs built by column, the batch."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from notifyq import EnqueueRequest, InvalidEnqueue, PayloadTooLarge, Run, RunStatus
from notifyq._enqueue.bulk import Batch
from notifyq._enqueue.ids import _COUNTER, new_run_id, new_run_ids
from notifyq._enqueue.request import coerce_requests, prepare, with_values
from notifyq._enqueue.validate import encode_input, input_encoder
from notifyq._run import run_of, runs_from_columns

NOW = datetime(2030, 1, 2, 3, 4, 5, 6789, tzinfo=UTC)


def test_new_run_ids_are_version_7_of_this_millisecond_and_distinct() -> None:
    ids = new_run_ids(1000)
    assert len(set(ids)) == 1000
    millis = time.time_ns() // 1_000_000
    for run_id in ids:
        assert (run_id.version, run_id.variant) == (7, uuid.RFC_4122)
        assert abs(int(run_id.hex[:12], 16) - millis) < 5_000
        assert run_id == uuid.UUID(str(run_id)) == uuid.UUID(int=run_id.int)
        assert hash(run_id) == hash(uuid.UUID(int=run_id.int))
        assert run_id.is_safe is uuid.SafeUUID.unknown
    assert new_run_ids(0) == []


def test_new_run_ids_increase_in_the_order_made_within_and_across_batches() -> None:
    ids = new_run_ids(1000) + new_run_ids(1) + [new_run_id()] + new_run_ids(500)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_the_first_run_id_of_a_millisecond_starts_from_random_bits() -> None:
    starts = []
    for _ in range(300):
        _COUNTER.reset()  # as a new millisecond (or a new process) does
        starts.append(new_run_id().int)
    assert len({(i >> 64) & 0xFFF for i in starts}) > 200  # rand_a: 12 random bits
    assert {(i >> 60) & 1 for i in starts} == {0, 1}  # rand_b: 61 random bits...
    assert {(i >> 61) & 1 for i in starts} == {0}  # ...below 2**61: room to count up


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, None, True]}, [1e300, -0.0, 1e-7], {"é": "ü\n\"\\", "nested": {"x": []}},
    (1, "two"), {1: "int key", None: "null key"}, {"big": 2**70}, []])
def test_the_batch_encoder_writes_what_json_dumps_writes(value: Any) -> None:
    encode = input_encoder()
    assert encode(value) == json.dumps(value, ensure_ascii=False, allow_nan=False)
    assert encode_input(value, encode=encode) == encode_input(value)


@pytest.mark.parametrize("value", [{"x": float("nan")}, {"x": {1, 2}}, {"x": object()}])
def test_the_batch_encoder_refuses_what_json_dumps_refuses(value: Any) -> None:
    with pytest.raises(InvalidEnqueue, match="not JSON-serializable") as ours:
        encode_input(value, encode=input_encoder())
    with pytest.raises(InvalidEnqueue) as theirs:
        encode_input(value)
    assert str(ours.value) == str(theirs.value)


def test_the_batch_encoder_reports_a_circular_input_and_stays_usable() -> None:
    encode = input_encoder()
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(InvalidEnqueue, match="Circular reference"):
        encode_input(circular, encode=encode)
    shared = {"k": 1}
    assert encode([shared, shared]) == '[{"k": 1}, {"k": 1}]'


def test_runs_from_columns_equal_runs_built_one_by_one() -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    runs = runs_from_columns(2, {"id": ids, "input": [{"a": 1}, [2]], "tags": [[], ["t"]]}, {
        "job_type": "t.a", "status": RunStatus.PENDING, "pool": "p", "priority": 1,
        "run_at": NOW, "attempts": 0, "max_attempts": 3, "created_at": NOW})
    assert runs == [
        Run(id=ids[0], job_type="t.a", status=RunStatus.PENDING, input={"a": 1}, pool="p",
            priority=1, run_at=NOW, attempts=0, max_attempts=3, created_at=NOW, tags=[]),
        Run(id=ids[1], job_type="t.a", status=RunStatus.PENDING, input=[2], pool="p",
            priority=1, run_at=NOW, attempts=0, max_attempts=3, created_at=NOW, tags=["t"])]
    assert runs[0].output is None
    assert runs[0].to_json()["id"] == str(ids[0])
    with pytest.raises(AttributeError):
        runs[0].pool = "other"  # type: ignore[misc]


def test_run_of_equals_the_run_built_by_its_constructor() -> None:
    values: dict[str, Any] = {
        "id": uuid.uuid4(), "job_type": "t.a", "status": RunStatus.PENDING, "input": {"a": 1},
        "pool": "p", "priority": 1, "run_at": NOW, "attempts": 0, "max_attempts": 3,
        "created_at": NOW, "tags": ["t"], "timeout_s": 2.5}
    run = run_of(values)
    assert run == Run(**values)
    assert (run.output, run.error) == (None, None)
    with pytest.raises(AttributeError):
        run.pool = "other"  # type: ignore[misc]


def test_with_values_copies_a_request_with_some_fields_changed() -> None:
    request = EnqueueRequest(job_type="t.a", input={"a": 1}, tags=["x"], dedupe_key="k")
    changed = with_values(request, {"pool": "p", "priority": 3})
    assert changed == dataclasses.replace(request, pool="p", priority=3)
    assert changed.input is request.input


def test_runs_from_columns_refuses_missing_or_unknown_fields() -> None:
    with pytest.raises(TypeError, match="missing"):
        runs_from_columns(1, {"id": [uuid.uuid4()]}, {})
    with pytest.raises(TypeError, match="unknown"):
        runs_from_columns(0, {}, {"id": None, "job_type": "t", "status": "pending", "input": {},
                                  "pool": "p", "priority": 0, "run_at": NOW, "attempts": 0,
                                  "max_attempts": 1, "created_at": NOW, "colour": "red"})


def _summary(**stored: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"inserted": 0, "now": NOW, "type": job_type, "pool": None,
             "priority_default": None, "max_attempts": None, "timeout_s": None, **definition}
            for job_type, definition in stored.items()]


def _rows(batch: Batch) -> tuple[list[uuid.UUID], list[dict[str, Any]], list[str]]:
    ids, params = batch.params()
    return ids, json.loads(params["rows"]), params["types"]


def test_a_batch_sends_compact_records_with_the_input_as_given() -> None:
    batch = Batch(65_536)
    batch.add(EnqueueRequest(job_type="t.a", input={"x": "é"}), (None, None, None))
    batch.add(EnqueueRequest(job_type="t.b", input=[1], tags=["t"], tenant_id="acme",
                             run_at=NOW), ("p", 2, 3))
    ids, rows, types = _rows(batch)
    assert rows == [
        {"id": ids[0].hex, "job_type": "t.a", "input": {"x": "é"}},
        {"id": ids[1].hex, "job_type": "t.b", "pool": "p", "priority": 2, "max_attempts": 3,
         "run_at": NOW.isoformat(), "tags": ["t"], "tenant_id": "acme", "input": [1]}]
    assert types == ["t.a", "t.b"]


def test_a_batch_refuses_a_job_type_with_a_trailing_newline() -> None:
    with pytest.raises(InvalidEnqueue, match="invalid job type"):
        Batch(65_536).add(EnqueueRequest(job_type="t.a\n", input={}), (None, None, None))


def test_a_batch_validates_like_prepare() -> None:
    with pytest.raises(InvalidEnqueue, match="priority 5000 is out of range"):
        Batch(65_536).add(EnqueueRequest(job_type="t.a", input={}), (None, 5000, None))
    with pytest.raises(InvalidEnqueue, match="invalid pool 'A B'"):
        Batch(65_536).add(EnqueueRequest(job_type="t.a", input={}), ("A B", None, None))
    with pytest.raises(PayloadTooLarge, match="the limit is 10 bytes"):
        Batch(10).add(EnqueueRequest(job_type="t.a", input={"x": "too long"}), (None, None, None))
    with pytest.raises(InvalidEnqueue, match="max_attempts must be an integer, got bool"):
        Batch(65_536).add(EnqueueRequest(job_type="t.a", input={}), (None, None, True))


def test_a_batch_builds_runs_with_the_coalesce_the_insert_applies() -> None:
    batch = Batch(65_536)
    kolkata = timezone(timedelta(hours=5, minutes=30))
    later = datetime(2031, 1, 1, 12, tzinfo=kolkata)
    batch.add(EnqueueRequest(job_type="t.stored", input={"i": 0}), (None, None, None))
    batch.add(EnqueueRequest(job_type="t.stored", input={"i": 1}), ("given", 4, None))
    batch.add(EnqueueRequest(job_type="t.bare", input={"i": 2}, run_at=later), (None, None, None))
    ids, _, _ = _rows(batch)
    runs = batch.runs(ids, _summary(**{
        "t.stored": {"pool": "slow", "priority_default": 3, "max_attempts": 7, "timeout_s": 1.5},
        "t.bare": {}}))
    assert [(r.pool, r.priority, r.max_attempts, r.timeout_s) for r in runs] == [
        ("slow", 3, 7, 1.5), ("given", 4, 7, 1.5), ("default", 0, 25, None)]
    assert [r.run_at for r in runs] == [NOW, NOW, later]
    assert runs[2].run_at.tzinfo is UTC  # in the session's time zone, as the database sends it
    assert {r.created_at for r in runs} == {NOW}
    assert [r.id for r in runs] == ids
    assert runs[0].tags == runs[1].tags == []
    assert runs[0].tags is not runs[1].tags


def test_a_batch_puts_keyed_requests_back_in_their_places() -> None:
    batch = Batch(65_536)
    batch.add(EnqueueRequest(job_type="t.a", input={"i": 0}), (None, None, None))
    keyed = prepare(EnqueueRequest(job_type="t.a", input={"i": 1}, dedupe_key="k"))
    batch.add_prepared(keyed)
    batch.add_prepared(prepare(EnqueueRequest(job_type="t.a", input={"i": 2})))
    assert len(batch) == 3
    ids, rows, _ = _rows(batch)
    assert [r["input"] for r in rows] == [{"i": 0}, {"i": 2}]
    plain = batch.runs(ids, _summary(**{"t.a": {}}))
    ordered = batch.order(plain)
    assert ordered == [plain[0], dataclasses.replace(keyed, id=ordered[1].id), plain[1]]
    # The keyed request's id is redrawn between its neighbours': it runs in its place.
    assert [r.id for r in ordered] == sorted(r.id for r in ordered)


@pytest.mark.parametrize("item", [
    {"job_type": "t.a"}, {"job_type": "t.a", "input": None}, {"job_type": "t.a", "input": [1]},
    {"job_type": "t.a", "input": {}, "priority": 3, "tags": ["x"], "run_at": NOW,
     "dedupe_key": "k", "concurrency_limit": 2, "tenant_id": "acme"}])
def test_coerce_requests_reads_a_dict_as_the_constructor_does(item: dict[str, Any]) -> None:
    [request] = coerce_requests([item])
    assert request == EnqueueRequest(**item)
    assert repr(request) == repr(EnqueueRequest(**item))


def test_coerce_requests_gives_each_dict_without_input_its_own_empty_input() -> None:
    first, second = coerce_requests([{"job_type": "t.a"}, {"job_type": "t.a"}])
    assert first.input == second.input == {}
    assert first.input is not second.input


@pytest.mark.parametrize(("item", "message"), [
    ({"input": {}}, "missing 1 required keyword-only argument: 'job_type'"),
    ({"job_type": "t.a", "typo": 1}, "unexpected keyword argument 'typo'"),
    ({"job_type": "t.a", 1: 2}, "keywords must be strings"),
    (["job_type"], "must be a mapping")])
def test_coerce_requests_names_the_item_the_constructor_refuses(item: Any, message: str) -> None:
    with pytest.raises(InvalidEnqueue, match=rf"item 1: .*{message}"):
        coerce_requests([{"job_type": "t.ok"}, item])
