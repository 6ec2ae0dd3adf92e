"""The named-query registry.

Every SQL statement notifyq runs lives in ``db/queries/<entity>.sql`` as a named block::

    -- name: job_run_claim
    WITH ... {schema}.job_run ...

The files are parsed once; ``{schema}`` is filled with the quoted identifier of the configured
schema (``psycopg.sql.Identifier``), so queries work on any connection, the caller's included,
without touching its ``search_path``.
"""

from __future__ import annotations

import re
from functools import cache

from psycopg import sql

from notifyq._db.files import sql_root

_NAME = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


@cache
def _raw_queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in sorted((sql_root() / "queries").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise RuntimeError(f"query {name} is defined twice (second in {entry.name})")
            found[name] = _strip_comments(body)
    return found


def _strip_comments(body: str) -> str:
    lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines).strip()


def _compose(name: str, body: str, schema: sql.Identifier) -> str:
    try:
        return sql.SQL(body).format(schema=schema).as_string(None)
    except (IndexError, KeyError, ValueError) as exc:
        raise RuntimeError(f"query {name}: cannot fill in {{schema}} ({exc!r}); write a literal "
                           "brace as {{ or }} (e.g. '{{}}' for an empty array)") from None


class Queries:
    """The registry for one schema: ``queries.job_run_claim`` is ready to execute."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        ident = sql.Identifier(schema)
        # mypy reads LiteralString as str; the bodies come only from the packaged SQL files.
        self._sql: dict[str, str] = {
            name: _compose(name, body, ident) for name, body in _raw_queries().items()
        }

    def __getattr__(self, name: str) -> str:
        try:
            return self._sql[name]
        except KeyError:
            raise AttributeError(f"no query named {name}") from None

    def names(self) -> list[str]:
        return sorted(self._sql)


@cache
def queries_for(schema: str) -> Queries:
    return Queries(schema)
