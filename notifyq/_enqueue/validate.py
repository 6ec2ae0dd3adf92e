"""Validation at the edge: the checks of a run's values against its limits
(``notifyq._limits``), with errors that name the problem. Nothing here touches the database."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from notifyq._errors import InvalidEnqueue, PayloadTooLarge
from notifyq._limits import (
    BUILTIN_JOB_TYPES,
    JOB_TYPE,
    MAX_INPUT_BYTES,
    MAX_TAG_LEN,
    MAX_TAGS,
    RUN_AT_RANGE,
)

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def input_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, allow_nan=False)`` for one batch of inputs.

    ``json.dumps`` builds an encoder at every call: 2.1 us for a small object against 0.9 us
    for the C encoder built once (json's own ``c_make_encoder``, with the same arguments
    ``JSONEncoder.iterencode`` gives it). One per batch, never shared: its circular-reference
    markers are not safe across threads."""
    make: Callable[..., Callable[[Any, int], list[str]]] | None = getattr(
        json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - an interpreter without the _json accelerator
        return _ENCODER.encode
    try:
        encoder = make({}, _ENCODER.default, json.encoder.encode_basestring, None,
                       _ENCODER.key_separator, _ENCODER.item_separator, False, False, False)
    except TypeError:  # pragma: no cover - another signature in another Python version
        return _ENCODER.encode
    join = "".join

    def encode(value: Any) -> str:
        return join(encoder(value, 0))
    return encode


def refuse_builtin(job_types: Iterable[object]) -> None:
    """Raise InvalidEnqueue for the first of notifyq's own job types (``BUILTIN_JOB_TYPES``)
    among ``job_types``: those are enqueued by their features only, never by a caller."""
    for job_type in job_types:
        if type(job_type) is str and job_type in BUILTIN_JOB_TYPES:
            raise InvalidEnqueue(
                f"job type {job_type!r} is built in and enqueued by notifyq itself, with the "
                f"checks its own API makes: {BUILTIN_JOB_TYPES[job_type]}")


def encode_input(value: Any, max_input_bytes: int = MAX_INPUT_BYTES,
                 encode: Callable[[Any], str] | None = None) -> str:
    """Serialize a run's input; it must be a JSON object or array within the size limit."""
    if type(value) is not dict and not isinstance(value, Mapping | list | tuple):
        raise InvalidEnqueue(
            f"input must be a JSON object or array, got {type(value).__name__}")
    try:
        # Default separators (", ", ": ") are jsonb's text form, which the SQL function and
        # the database measure: compact JSON would let [0, 0, ...] pass here at 60 KB and be
        # refused there at 90 KB.
        text = (encode or _ENCODER.encode)(value)
    except (TypeError, ValueError) as exc:
        raise InvalidEnqueue(f"input is not JSON-serializable: {exc}") from None
    if text.isascii() and "\\u0000" not in text:  # the common case: nothing jsonb refuses,
        size = len(text)                           # and as many bytes as characters
    else:
        problem = jsonb_problem(text)
        if problem:
            raise InvalidEnqueue(
                f"input contains {problem}, which PostgreSQL's jsonb cannot store")
        size = len(text.encode())
    # The size as jsonb prints it, which the SQL function and the INSERTs check too (bulk
    # enqueue by COPY relies on this check alone).
    size += jsonb_growth(value, text)
    if size > max_input_bytes:
        raise PayloadTooLarge(size, max_input_bytes)
    return text


def jsonb_growth(value: Any, text: str) -> int:
    """How many bytes longer PostgreSQL's jsonb prints ``value`` than ``text``, the encoder's
    JSON of it (jsonb's separators and escapes, ``ensure_ascii=False``).

    Only floats print differently: one in exponent form in full (Python's ``1e+300``, 6 bytes,
    is 301 digits in jsonb; ``5e-324`` 326 bytes), and ``-0.0`` as ``0.0``. Such inputs are
    rare: the common case costs three substring tests."""
    if floats_print_differently(text):
        return _float_growth(value)
    return 0


def floats_print_differently(text: str) -> bool:
    """Whether ``text`` (the encoder's JSON) may hold a float that jsonb prints otherwise (see
    :func:`jsonb_growth`); True also for such text inside a string, which is rare."""
    return ("e+" in text or "e-" in text or "-0.0" in text) and _GROWS.search(text) is not None


_GROWS = re.compile(r"\de[+-]\d|-0\.0\b")


def _float_growth(value: Any) -> int:
    """The floats' part of :func:`jsonb_growth`, walked with a stack (inputs nest as deep as
    the encoder goes), through what the encoder writes (a dict's ``items()``)."""
    growth, todo = 0, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, float):
            short = float.__repr__(item)  # what the encoder writes, for subclasses too
            if item == 0:  # numeric has no negative zero
                growth -= short.startswith("-")
            elif "e" in short:
                growth += len(format(Decimal(short), "f")) - len(short)
        elif isinstance(item, Mapping):
            todo.extend(v for _, v in item.items())
        elif isinstance(item, list | tuple):
            todo.extend(item)
    return growth


_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def has_nul(json_text: str) -> bool:
    """Whether JSON text holds a U+0000 escape (not a literal backslash followed by "u0000")."""
    return "\\u0000" in json_text and _NUL_ESCAPE.search(json_text) is not None


def jsonb_problem(json_text: str) -> str | None:
    """Why jsonb cannot store this JSON text (dumped with ``ensure_ascii=False``), or None."""
    if has_nul(json_text):
        return "a NUL character (\\u0000)"
    try:
        json_text.encode()
    except UnicodeEncodeError:
        return "an unpaired surrogate (not valid Unicode)"
    return None


def parse_input(text: str) -> Any:
    """Parse JSON text given on a command line or in an HTTP body; refuse what is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidEnqueue(f"input is not valid JSON: {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}") from None


def check_type(job_type: object) -> None:
    if not isinstance(job_type, str) or not JOB_TYPE.fullmatch(job_type):
        raise InvalidEnqueue(f"invalid job type {job_type!r}: it must match {JOB_TYPE.pattern}")


def check_range(name: str, value: int | None, bounds: tuple[int, int]) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEnqueue(f"{name} must be an integer, got {type(value).__name__}")
    if not bounds[0] <= value <= bounds[1]:
        raise InvalidEnqueue(f"{name} {value} is out of range [{bounds[0]}, {bounds[1]}]")


def check_run_at(run_at: datetime | None) -> None:
    if run_at is None:
        return
    if not isinstance(run_at, datetime) or run_at.tzinfo is None:
        raise InvalidEnqueue("run_at must be a timezone-aware datetime")
    if not RUN_AT_RANGE[0] <= run_at < RUN_AT_RANGE[1]:
        raise InvalidEnqueue(f"run_at {run_at.isoformat()} is out of range "
                             f"[{RUN_AT_RANGE[0]:%Y-%m-%d}, {RUN_AT_RANGE[1]:%Y-%m-%d})")


def check_tags(tags: Sequence[str] | None) -> None:
    if tags is None:
        return
    if isinstance(tags, str) or len(tags) > MAX_TAGS or not all(
        isinstance(t, str) and 0 < len(t) <= MAX_TAG_LEN for t in tags
    ):
        raise InvalidEnqueue(
            f"tags must be a list of at most {MAX_TAGS} strings of 1 to {MAX_TAG_LEN} characters")
