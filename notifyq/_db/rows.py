"""Typed rows: psycopg row factories for the rows that become public objects, so that code
reading a column is checked by mypy (a dataclass's attribute, a TypedDict's key) and each kind
of row is built in one place.

- psycopg's ``class_row(cls)`` when a query's columns are exactly the class's fields.
- :func:`picked_row` for ``SELECT *`` (or ``RETURNING *``) of a table that has more columns than
  the class: the class's fields are taken by name, and a field the result lacks is an error at
  the first row, never a silent default. :data:`run_row` makes :class:`~notifyq._run.Run`\\ s.
- :func:`typed_dict_row` for rows the public API hands out as dicts (``app.steps``,
  ``app.webhooks.attempts``): ``dict_row``, typed. tests/db/test_typed_rows.py checks that each
  such query's columns are exactly its TypedDict's keys.

Example::

    async with conn.cursor(row_factory=run_row) as cur:
        await cur.execute(queries.job_run_get, {"id": run_id})
        run = await cur.fetchone()  # Run | None
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar, cast

from psycopg.rows import BaseRowFactory, RowMaker, dict_row, no_result

from notifyq._run import RUN_FIELDS, Run

T = TypeVar("T")


def picked_row(make: Callable[..., T], fields: Collection[str]) -> BaseRowFactory[T]:
    """Rows as ``make(**{field: value})`` for each of ``fields`` (other columns are left out)."""
    wanted = frozenset(fields)

    def factory(cursor: Any) -> RowMaker[T]:  # a psycopg BaseCursor (a private class)
        if cursor.description is None:
            return no_result
        names = [column.name for column in cursor.description]
        missing = wanted.difference(names)
        if missing:
            raise TypeError(f"a row for {getattr(make, '__qualname__', make)} needs the columns "
                            f"{sorted(missing)}; the query returns {names}")
        taken = [(i, name) for i, name in enumerate(names) if name in wanted]

        def row(values: Sequence[Any]) -> T:
            return make(**{name: values[i] for i, name in taken})
        return row
    return factory


run_row: BaseRowFactory[Run] = picked_row(Run.from_columns, RUN_FIELDS)
"""Each row a :class:`~notifyq._run.Run` (job_run_get, job_run_list, ...: ``SELECT *``)."""


def typed_dict_row(_: type[T]) -> BaseRowFactory[T]:
    """``dict_row`` typed as the TypedDict ``T`` (nothing checked at run time: see the module
    docstring)."""
    return cast("BaseRowFactory[T]", dict_row)
