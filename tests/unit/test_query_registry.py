"""The named queries: their generated, typed names; one file per entity; every name notifyq
uses exists, and every query is used."""

from __future__ import annotations

import ast
import difflib
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from notifyq._db.queries import Queries, named_queries, queries_for
from tests.generate import QUERY_NAMES, ROOT, render_query_names

# The names code calls its Queries: ``runtime.queries``, ``self._q``, ``q`` ...
_HOLDERS = frozenset({"queries", "_queries", "q", "_q"})
_OWN = frozenset({"schema", "names"})  # Queries' own attributes, not queries

UNUSED_BY_NOTIFYQ: set[str] = set()
"""Named queries notifyq/ never runs (tests/db does). Reported here rather than deleted: a
query that stops being used shows up as a failure, to be removed or listed on purpose."""


def _query_uses() -> dict[str, list[str]]:
    """Every ``<holder>.<name>`` in notifyq/: name -> where."""
    uses: dict[str, list[str]] = {}
    for path in sorted((ROOT / "notifyq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute):
                continue
            holder = node.value
            last = holder.attr if isinstance(holder, ast.Attribute) else (
                holder.id if isinstance(holder, ast.Name) else None)
            if last in _HOLDERS and node.attr not in _OWN:
                uses.setdefault(node.attr, []).append(
                    f"{path.relative_to(ROOT)}:{node.lineno}")
    return uses


def test_the_generated_query_names_match_the_sql_files() -> None:
    expected = render_query_names()
    current = QUERY_NAMES.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(current.splitlines(True), expected.splitlines(True),
                                        "notifyq/_db/query_names.py", "from db/queries/*.sql"))
    assert current == expected, (
        "notifyq/_db/query_names.py is out of date with db/queries/*.sql: run `python -m "
        f"tests.generate queries` and commit the result\n{diff}")


def test_each_query_file_holds_only_the_queries_of_its_entity() -> None:
    """``db/queries/<entity>.sql`` holds the queries named ``<entity>_...``; where two entities
    prefix a name (job, job_run), the longer one's file holds it."""
    files = named_queries()
    misplaced = []
    for entity, queries in files.items():
        for name in queries:
            owners = [e for e in files if name.startswith(f"{e}_")]
            home = max(owners, key=len) if owners else None
            if home != entity:
                misplaced.append(f"{name} is in {entity}.sql, not {home or '<its entity>'}.sql")
    assert misplaced == []


def test_no_query_name_hides_an_attribute_of_the_registry() -> None:
    names = {name for queries in named_queries().values() for name in queries}
    assert names & (set(dir(Queries)) - set(dir(object)) - names) == set()
    assert len(names) > 50


def test_every_query_name_used_in_notifyq_exists() -> None:
    uses = _query_uses()
    assert len(uses) > 50  # the scan sees the code's uses
    known = set(queries_for("notifyq").names())
    assert {name: where for name, where in uses.items() if name not in known} == {}


def test_every_named_query_is_used_by_notifyq() -> None:
    unused = set(queries_for("notifyq").names()) - set(_query_uses())
    assert unused == UNUSED_BY_NOTIFYQ


def test_mypy_rejects_an_unknown_query_name(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent("""\
        from notifyq._db.queries import queries_for

        known: str = queries_for("notifyq").job_run_finish_and_claim
        unknown: str = queries_for("notifyq").job_run_finish_and_claimm
    """))
    out, _, status = mypy_api.run([
        "--strict", "--follow-imports=silent", "--no-incremental", "--python-version=3.11",
        str(probe)])
    assert status == 1, out
    assert out.splitlines()[0] == (
        f'{probe}:4: error: "Queries" has no attribute '
        '"job_run_finish_and_claimm"  [attr-defined]'), out


def test_every_query_fits_psycopgs_statement_cache() -> None:
    """psycopg converts a query's placeholders once and caches the result only up to
    MAX_CACHED_STATEMENT_LENGTH bytes; a longer query is parsed again at every execution (the
    worker's own statement was one byte over, ~4 % of its Python CPU)."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    q = queries_for("notifyq")
    too_long = {name: len(getattr(q, name).encode()) for name in q.names()
                if len(getattr(q, name).encode()) > MAX_CACHED_STATEMENT_LENGTH}
    assert too_long == {}


def test_queries_are_sent_without_indentation_and_keep_their_literals() -> None:
    q = Queries("notifyq")
    body = named_queries()["job_run"]["job_run_finish_and_claim"]
    assert "\n    " in body  # the file is indented ...
    assert "\n " not in q.job_run_finish_and_claim  # ... what is sent is not
    assert "'pending', 'waiting'" in q.job_run_finish_and_claim


def test_a_literal_that_spans_lines_is_refused_when_the_registry_loads() -> None:
    from notifyq._db.queries import _unindented

    assert _unindented("ok", "SELECT 'a' -- it's fine\n  FROM t") == (
        "SELECT 'a' -- it's fine\nFROM t")
    assert _unindented("dollars", "SELECT $$it's$$\n  FROM t") == "SELECT $$it's$$\nFROM t"
    with pytest.raises(RuntimeError, match="query bad: a string literal spans lines"):
        _unindented("bad", "SELECT 'a\n  b'")
    with pytest.raises(RuntimeError, match="query body: a string literal spans lines"):
        _unindented("body", "SELECT $$a\n  b$$")
