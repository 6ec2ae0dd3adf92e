"""Enqueue validation at the edge: prepare(), encode_input(), parse_input()."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifyq import EnqueueRequest, InvalidEnqueue, PayloadTooLarge
from notifyq._enqueue.request import coerce_requests, prepare
from notifyq._enqueue.validate import encode_input, parse_input


def request(**kwargs: Any) -> EnqueueRequest:
    return EnqueueRequest(**{"job_type": "email.send", "input": {}, **kwargs})


@pytest.mark.parametrize("value", [1, "text", None, True, 2.5])
def test_input_that_is_not_an_object_or_array_is_refused(value: object) -> None:
    with pytest.raises(InvalidEnqueue, match="must be a JSON object or array, got"):
        encode_input(value)


def test_input_objects_and_arrays_are_accepted() -> None:
    assert json.loads(encode_input({"a": [1, 2]})) == {"a": [1, 2]}
    assert json.loads(encode_input([1, "x"])) == [1, "x"]
    assert json.loads(encode_input((1, 2))) == [1, 2]


def _input_of_size(size: int) -> dict[str, str]:
    """An input whose serialized size is exactly ``size`` bytes."""
    overhead = len(encode_input({"x": ""}).encode())
    return {"x": "a" * (size - overhead)}


def test_input_of_exactly_64_kib_is_accepted() -> None:
    assert len(encode_input(_input_of_size(65_536)).encode()) == 65_536


def test_input_of_64_kib_plus_one_is_too_large_naming_size_and_limit() -> None:
    with pytest.raises(PayloadTooLarge, match="input is 65537 bytes serialized; the limit is "
                                              "65536 bytes") as info:
        encode_input(_input_of_size(65_537))
    assert info.value.size == 65_537
    assert info.value.limit == 65_536
    assert isinstance(info.value, InvalidEnqueue)


def test_input_size_counts_utf8_bytes_not_characters() -> None:
    big = {"x": "é" * 40_000}  # 40k characters, 80k bytes
    with pytest.raises(PayloadTooLarge):
        encode_input(big)


def test_input_size_is_measured_as_postgresql_stores_it() -> None:
    # jsonb's text form puts a space after every ',' and ':'; the SQL function measures that,
    # so the Python edge must too or it would pass what the database then refuses.
    many = [0] * 30_000
    compact = len(json.dumps(many, separators=(",", ":")))
    assert compact < 65_536
    with pytest.raises(PayloadTooLarge):
        encode_input(many)


def test_a_lower_configured_limit_applies() -> None:
    with pytest.raises(PayloadTooLarge, match="the limit is 100 bytes"):
        encode_input(_input_of_size(101), 100)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_input_with_nan_or_infinity_is_refused(value: float) -> None:
    with pytest.raises(InvalidEnqueue, match="not JSON-serializable"):
        encode_input({"x": value})


def test_input_with_a_non_json_value_is_refused() -> None:
    with pytest.raises(InvalidEnqueue, match="not JSON-serializable"):
        encode_input({"when": datetime.now(UTC)})


def test_input_with_a_nul_character_is_refused() -> None:
    with pytest.raises(InvalidEnqueue, match="NUL character"):
        encode_input({"x": "a\x00b"})
    with pytest.raises(InvalidEnqueue, match="NUL character"):
        encode_input({"a\x00": 1})


def test_input_with_an_unpaired_surrogate_is_refused() -> None:
    with pytest.raises(InvalidEnqueue, match="unpaired surrogate"):
        encode_input({"x": "a\udc80"})


def test_input_with_a_literal_backslash_u0000_is_accepted() -> None:
    text = encode_input({"path": "C:\\u0000"})
    assert json.loads(text) == {"path": "C:\\u0000"}


@pytest.mark.parametrize("job_type", [
    "Email.send", "email send", "", "-starts-with-dash", "x" * 129, "émail", "a/b", 42, None,
    "email.send\n",  # re's $ also matches before a final newline: the whole name must match
])
def test_bad_job_types_are_refused_naming_the_pattern(job_type: object) -> None:
    with pytest.raises(InvalidEnqueue, match=r"invalid job type .*it must match"):
        prepare(request(job_type=job_type))


@pytest.mark.parametrize("job_type", ["a", "email.send", "x" * 128, "_a:b-c.d", "0"])
def test_good_job_types_are_accepted(job_type: str) -> None:
    assert prepare(request(job_type=job_type)).request.job_type == job_type


@pytest.mark.parametrize(("field", "value", "message"), [
    ("priority", -1001, r"priority -1001 is out of range \[-1000, 1000\]"),
    ("priority", 1001, r"priority 1001 is out of range"),
    ("priority", "1", "priority must be an integer, got str"),
    ("priority", True, "priority must be an integer, got bool"),
    ("max_attempts", 0, r"max_attempts 0 is out of range \[1, 1000\]"),
    ("max_attempts", 1001, "max_attempts 1001 is out of range"),
    ("max_attempts", 2.0, "max_attempts must be an integer, got float"),
])
def test_out_of_range_numbers_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidEnqueue, match=message):
        prepare(request(**{field: value}))


def test_range_bounds_are_inclusive() -> None:
    for priority in (-1000, 1000):
        assert prepare(request(priority=priority)).request.priority == priority
    for attempts in (1, 1000):
        assert prepare(request(max_attempts=attempts)).request.max_attempts == attempts


def test_naive_run_at_is_refused() -> None:
    with pytest.raises(InvalidEnqueue, match="timezone-aware"):
        prepare(request(run_at=datetime(2030, 1, 1)))


@pytest.mark.parametrize("run_at", [datetime(1999, 12, 31, tzinfo=UTC),
                                    datetime(3000, 1, 1, tzinfo=UTC)])
def test_run_at_out_of_range_is_refused(run_at: datetime) -> None:
    with pytest.raises(InvalidEnqueue, match="out of range"):
        prepare(request(run_at=run_at))


def test_aware_run_at_in_any_timezone_is_accepted() -> None:
    tz = datetime.now(UTC).astimezone().tzinfo
    run_at = datetime.now(tz) + timedelta(hours=1)
    assert prepare(request(run_at=run_at)).request.run_at == run_at


@pytest.mark.parametrize("tags", ["single-string", ["x"] * 33, [""], ["x" * 129], [1]])
def test_bad_tags_are_refused(tags: object) -> None:
    with pytest.raises(InvalidEnqueue, match="tags must be a list of at most 32 strings"):
        prepare(request(tags=tags))


def test_good_tags_are_accepted() -> None:
    prepared = prepare(request(tags=["a", "x" * 128] + ["t"] * 30))
    assert prepared.params(notify=False)["tags"][0] == "a"


@pytest.mark.parametrize("pool", ["Default", "", "a b", 3])
def test_bad_pools_are_refused(pool: object) -> None:
    with pytest.raises(InvalidEnqueue, match="invalid pool"):
        prepare(request(pool=pool))


@pytest.mark.parametrize("key", ["", "k" * 513, 5])
def test_bad_dedupe_keys_are_refused(key: object) -> None:
    with pytest.raises(InvalidEnqueue, match="dedupe_key must be a string of 1 to 512"):
        prepare(request(dedupe_key=key))


def test_prepared_insert_params_carry_the_serialized_input_and_the_request_fields() -> None:
    prepared = prepare(request(input={"to": "a@b.c", "n": [1, 2]}, priority=3, tags=("t",),
                               run_at=datetime(2030, 1, 1, tzinfo=UTC)))
    params = prepared.insert_params(accept=True, trace_context=None)
    assert json.loads(params["input"]) == {"to": "a@b.c", "n": [1, 2]}
    assert params["id"] == prepared.id
    assert (params["priority"], params["tags"], params["run_at"]) == (
        3, ["t"], datetime(2030, 1, 1, tzinfo=UTC))
    assert (params["accept"], params["notify"], params["pool"]) == (True, True, None)


def test_coerce_requests_names_the_bad_item() -> None:
    with pytest.raises(InvalidEnqueue, match=r"item 1: .*unexpected keyword argument 'typo'"):
        coerce_requests([{"job_type": "a"}, {"job_type": "b", "typo": 1}])


def test_parse_input_reads_json() -> None:
    assert parse_input('{"to": "a@b.c"}') == {"to": "a@b.c"}


@pytest.mark.parametrize("text", ['{"to": ', "{'single': 1}", "", "nope"])
def test_parse_input_refuses_malformed_json_with_position(text: str) -> None:
    with pytest.raises(InvalidEnqueue, match=r"input is not valid JSON: .* at line 1 column \d+"):
        parse_input(text)
