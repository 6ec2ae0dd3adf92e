"""Python measures an input's size as PostgreSQL's jsonb prints it (``encode_input`` with
``jsonb_growth``), which bulk enqueue by COPY relies on alone: checked against the database's own
``octet_length(input::jsonb::text)`` for generated JSON values, floats in exponent form among
them."""

from __future__ import annotations

from typing import Any

import psycopg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from notifyq._enqueue.validate import _ENCODER, jsonb_growth


def _nested(depth: int, value: Any) -> Any:
    for _ in range(depth):
        value = [value]
    return value


class _Hiding(dict[str, Any]):
    def values(self) -> Any:
        return []


ORACLE = settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(-(10**30), 10**30)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([1e300, -5e-324, 1.5e-7, 1e16, 1.2345678901234568e17, 1e-5, 0.0001])
           | st.text(max_size=12) | st.sampled_from(["1e+300", "3e-5 one-time", "é\t\\\n"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=5), max_leaves=25)
inputs = st.dictionaries(st.text(max_size=6), values, max_size=5) | st.lists(values, max_size=5)


@ORACLE
@given(value=inputs)
@example(value={"n": [1e300] * 3, "s": "1e+300"})
@example(value=[5e-324, {"k": -1.5e-07}, 1e16, 123.0, 10**20])
@example(value=_nested(600, [1e16, -0.0]))  # deeper than a recursive walk could go
@example(value={"d": _Hiding(x=[1e300] * 3)})  # the encoder reads items(), not values()
def test_python_measures_an_input_as_jsonb_prints_it(
        db: psycopg.Connection[dict[str, Any]], value: Any) -> None:
    text = _ENCODER.encode(value)
    if "\\u0000" in text:  # refused before any size is taken
        return
    row = db.execute("SELECT octet_length(%s::jsonb::text) AS size", (text,)).fetchone()
    assert row is not None
    assert len(text.encode()) + jsonb_growth(value, text) == row["size"]
