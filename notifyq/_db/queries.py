"""The named-query registry.

Every SQL statement notifyq runs lives in ``db/queries/<entity>.sql`` as a named block::

    -- name: job_run_finish_and_claim
    WITH ... {schema}.job_run ...

A part that several statements share is written once, as a fragment, and named where it goes
(a fragment holds no other fragment)::

    -- fragment: job_run_claim_plain
    picked AS (...), claimed AS (...)

    -- name: job_run_claim
    WITH n AS (...), claim_limit AS (...), {job_run_claim_plain} SELECT ... FROM claimed

The files are parsed once; ``{schema}`` is filled with the quoted identifier of the configured
schema (``psycopg.sql.Identifier``), so queries work on any connection, the caller's included,
without touching its ``search_path``.

The names are checked statically: :class:`Queries` inherits one typed attribute per named query
from :class:`~notifyq._db.query_names.QueryNames`, generated from the SQL files by ``python -m
tests.generate queries``, so mypy rejects ``queries.job_run_claimm``.
tests/unit/test_query_registry.py fails when the generated file is out of date.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING, NoReturn

from psycopg import sql

from notifyq._db.files import sql_root
from notifyq._db.query_names import QueryNames

_BLOCK = re.compile(r"^--\s*(name|fragment):\s*([a-z0-9_]+)\s*$", re.MULTILINE)
_PLACE = re.compile(r"(?<!\{)\{([a-z0-9_]+)\}(?!\})")


@cache
def _blocks() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    files: dict[str, dict[str, str]] = {}
    fragments: dict[str, str] = {}
    seen: dict[str, str] = {}
    for entry in sorted((sql_root() / "queries").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        entity = entry.name.removesuffix(".sql")
        parts = _BLOCK.split(entry.read_text(encoding="utf-8"))
        files[entity] = {}
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name == "schema":
                raise RuntimeError(f"{entry.name}: 'schema' is the schema's placeholder, not a "
                                   "name for a query or a fragment")
            if name in seen:
                raise RuntimeError(f"query {name} is defined twice (in {seen[name]}.sql and "
                                   f"{entry.name})")
            seen[name] = entity
            (fragments if kind == "fragment" else files[entity])[name] = _strip_comments(body)
    return files, fragments


def named_queries() -> dict[str, dict[str, str]]:
    """Per SQL file (its name without ``.sql``, the entity), its named queries' bodies in file
    order, comments removed, fragments not yet put in and ``{schema}`` not yet filled in."""
    return _blocks()[0]


def fragments() -> dict[str, str]:
    """The shared parts of queries (``-- fragment: name``), comments removed."""
    return _blocks()[1]


def with_fragments(name: str, body: str) -> str:
    """``body`` with each ``{fragment}`` it names put in (``{schema}`` is left for later)."""
    known = fragments()

    def put(match: re.Match[str]) -> str:
        placed = match.group(1)
        if placed == "schema":
            return match.group(0)
        if placed not in known:
            raise RuntimeError(f"query {name}: no fragment named {placed} (see -- fragment: "
                               "blocks in db/queries/*.sql)")
        return known[placed]

    return _PLACE.sub(put, body)


def _strip_comments(body: str) -> str:
    lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines).strip()


def _compose(name: str, body: str, schema: sql.Identifier) -> str:
    try:
        text = sql.SQL(body).format(schema=schema).as_string(None)
    except (IndexError, KeyError, ValueError) as exc:
        raise RuntimeError(f"query {name}: cannot fill in {{schema}} ({exc!r}); write a literal "
                           "brace as {{ or }} (e.g. '{{}}' for an empty array)") from None
    return _unindented(name, text)


def _unindented(name: str, text: str) -> str:
    """``text`` without each line's indentation. psycopg caches the conversion of a query
    (placeholders to ``$n``) only up to 4,096 bytes (``MAX_CACHED_STATEMENT_LENGTH``); past
    that it parses the query with a regex at every execution, and the prepared-statement
    lookup hashes a new copy of it: job_run_finish_and_claim was 4,097 bytes, ~4 % of a
    worker's Python CPU in a drain. Safe because no string literal spans lines (checked)."""
    lines = text.splitlines()
    for line in lines:
        if _ends_inside_literal(line):
            raise RuntimeError(f"query {name}: a string literal spans lines ({line.strip()!r}); "
                               "keep each literal on one line")
    return "\n".join(line.strip() for line in lines)


def _ends_inside_literal(line: str) -> bool:
    """Whether a quoted literal (``'...'`` or ``$$...$$``) is still open at the end of
    ``line``, read as SQL: quotes inside a trailing ``--`` comment do not count."""
    quote: str | None = None
    i = 0
    while i < len(line):
        mark = "$$" if line.startswith("$$", i) else line[i]
        if mark in ("'", "$$") and quote in (None, mark):
            quote = None if quote else mark
        elif quote is None and line.startswith("--", i):
            break
        i += len(mark)
    return quote is not None


class Queries(QueryNames):
    """The registry for one schema: ``queries.job_run_finish_and_claim`` is ready to execute."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        ident = sql.Identifier(schema)
        self._names: list[str] = []
        for blocks in named_queries().values():
            for name, body in blocks.items():
                # The bodies come only from the packaged SQL files: literal strings in effect.
                setattr(self, name, _compose(name, with_fragments(name, body), ident))
                self._names.append(name)

    if not TYPE_CHECKING:  # for mypy an unknown name is an error, not an AttributeError
        def __getattr__(self, name: str) -> NoReturn:
            raise AttributeError(f"no query named {name}: see db/queries/*.sql")

    def names(self) -> list[str]:
        return sorted(self._names)


@cache
def queries_for(schema: str) -> Queries:
    return Queries(schema)
