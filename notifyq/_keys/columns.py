"""The registry of encrypted columns: notifyq's own and the user's, each a (``schema.table``,
primary key column, ciphertext column) that key rotation re-encrypts and ``keys status``
counts.

Example::

    tokens = app.encrypted_column("public.users", pk="id", column="api_token")
    blob = app.keyring.encrypt(b"s3cret", tokens.context(user_id))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from notifyq._crypto.ciphertext import Context
from notifyq._db.queries import Queries
from notifyq._errors import ConfigError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


@dataclass(frozen=True, slots=True)
class EncryptedColumn:
    """A ``bytea`` column of notifyq ciphertexts whose associated data is
    ``(table, column, str(pk))``."""

    table: str
    pk: str
    column: str

    def __post_init__(self) -> None:
        schema, dot, name = self.table.partition(".")
        for label, part in (("schema", schema), ("table", name), ("pk", self.pk),
                            ("column", self.column)):
            if not dot or not _IDENT.fullmatch(part):
                raise ConfigError(f"encrypted column {self.table}.{self.column}: {label} "
                                  f"{part!r} is not a plain identifier (the table must be "
                                  "given as schema.table)")

    @property
    def name(self) -> str:
        """``schema.table.column``."""
        return f"{self.table}.{self.column}"

    def context(self, row_id: Any) -> Context:
        """The associated data of the value stored in row ``row_id``."""
        return Context.of(self.table, self.column, row_id)

    def identifier(self) -> sql.Identifier:
        schema, _, name = self.table.partition(".")
        return sql.Identifier(schema, name)


class EncryptedColumns:
    """Registered columns, in registration order, each once."""

    def __init__(self) -> None:
        self._columns: dict[str, EncryptedColumn] = {}
        self._builtin: dict[str, EncryptedColumn] = {}

    def register(self, table: str, *, pk: str = "id", column: str,
                 builtin: bool = False) -> EncryptedColumn:
        """``builtin``: one of notifyq's own columns (webhook secrets), listed after the
        user's."""
        entry = EncryptedColumn(table, pk, column)
        existing = self._columns.get(entry.name) or self._builtin.get(entry.name)
        if existing is not None and existing != entry:
            raise ConfigError(f"encrypted column {entry.name} registered twice with different "
                              f"primary keys ({existing.pk!r}, {pk!r})")
        if entry.name not in self._builtin:
            (self._builtin if builtin else self._columns)[entry.name] = entry
        return entry

    def get(self, name: str) -> EncryptedColumn:
        found = self._columns.get(name) or self._builtin.get(name)
        if found is None:
            raise ConfigError(f"no encrypted column {name!r} is registered")
        return found

    def __iter__(self) -> Iterator[EncryptedColumn]:
        return iter([*self._columns.values(), *self._builtin.values()])

    def entries(self) -> list[tuple[EncryptedColumn, bool]]:
        """(column, builtin) of every registered column."""
        return [*((c, False) for c in self._columns.values()),
                *((c, True) for c in self._builtin.values())]

    def with_recorded(self, rows: Iterable[Mapping[str, Any]]) -> list[EncryptedColumn]:
        """This process's columns together with those other processes recorded in the
        ``encrypted_column`` registry (rows of ``encrypted_column_list``): the user's first,
        then notifyq's own, each in name order. A recorded column with another primary key
        than this process's registration is a ConfigError (two processes disagree)."""
        merged = {name: (column, builtin) for column, builtin in self.entries()
                  for name in (column.name,)}
        for row in rows:
            column = EncryptedColumn(row["table_name"], row["pk"], row["column_name"])
            mine = merged.get(column.name)
            if mine is not None and mine[0].pk != column.pk:
                raise ConfigError(f"encrypted column {column.name} is registered here with "
                                  f"primary key {mine[0].pk!r} but recorded in the database "
                                  f"with {column.pk!r}")
            merged.setdefault(column.name, (column, bool(row["builtin"])))
        ordered = sorted(merged.values(), key=lambda e: (e[1], e[0].name))
        return [column for column, _ in ordered]

    def __len__(self) -> int:
        return len(self._columns) + len(self._builtin)


class ColumnQueries:
    """The ``encrypted_column_*`` named queries with one column's identifiers filled in.

    Build it with :meth:`describe`, which also checks that the table, its primary key and the
    ``bytea`` column exist (so a typo in the configuration fails with its name)."""

    def __init__(self, queries: Queries, column: EncryptedColumn, pk_type: str) -> None:
        self.column = column
        self.pk_type = pk_type
        idents = {"table": column.identifier(), "pk": sql.Identifier(column.pk),
                  "column": sql.Identifier(column.column), "pk_type": sql.SQL(pk_type)}

        def fill(query: LiteralString) -> str:
            return sql.SQL(query).format(**idents).as_string(None)

        self.page_first = fill(queries.encrypted_column_page_first)
        self.page_after = fill(queries.encrypted_column_page_after)
        self.swap_many = fill(queries.encrypted_column_swap_many)
        self.version_counts = fill(queries.encrypted_column_version_counts)

    @classmethod
    async def describe(cls, conn: psycopg.AsyncConnection[Any], queries: Queries,
                       column: EncryptedColumn) -> ColumnQueries:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries.encrypted_column_describe, {
                "table": column.identifier().as_string(None),
                "names": [column.pk, column.column]})
            types = {r["name"]: r["type"] for r in await cur.fetchall()}
        if not types:
            raise ConfigError(f"encrypted column {column.name}: table {column.table} does not "
                              "exist")
        for name in (column.pk, column.column):
            if name not in types:
                raise ConfigError(f"encrypted column {column.name}: {column.table} has no "
                                  f"column {name!r}")
        if types[column.column] != "bytea":
            raise ConfigError(f"encrypted column {column.name} is {types[column.column]}; it "
                              "must be bytea")
        return cls(queries, column, types[column.pk])
