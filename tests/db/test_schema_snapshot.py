"""db/schema.sql is the schema every migration builds, so it can be read in one place."""

from __future__ import annotations

import difflib
import re

import pytest

from tests.generate import SCHEMA, dump_schema, migrate_from_scratch, pg_dump_major

pytestmark = pytest.mark.anyio


async def test_schema_sql_is_what_the_migrations_build(empty_dsn: str) -> None:
    await migrate_from_scratch(empty_dsn)
    built = dump_schema(empty_dsn)  # no pg_dump: RuntimeError, a failure (never a skip)
    stored = SCHEMA.read_text(encoding="utf-8") if SCHEMA.exists() else ""
    if stored == built:
        return
    found = re.search(r"with pg_dump (\d+)", stored)
    versions = (f" (it was generated with pg_dump {found[1]}, this is pg_dump "
                f"{pg_dump_major()}: their output differs)"
                if found and found[1] != pg_dump_major() else "")
    diff = "".join(difflib.unified_diff(stored.splitlines(True), built.splitlines(True),
                                        "db/schema.sql", "migrated from scratch", n=2))
    pytest.fail(f"db/schema.sql differs from a database migrated from scratch{versions}: run "
                f"`python -m tests.generate schema` and commit the result\n{diff[:20_000]}")


def test_the_snapshot_holds_the_current_body_of_every_function() -> None:
    text = SCHEMA.read_text(encoding="utf-8")
    # _enqueue's latest version (migration 0007) takes the dedupe states; 0001's did not.
    assert re.search(r"CREATE FUNCTION notifyq\._enqueue\(.*p_dedupe_states text\[\]", text)
    assert text.count("CREATE FUNCTION notifyq._enqueue(") == 1
    for name in ("enqueue", "_claim_keyed", "_send_webhook", "signal", "uuid7",
                 "_after_run_finished", "_accept_unknown_job_type"):
        assert f"CREATE FUNCTION notifyq.{name}(" in text
    assert "CREATE TRIGGER job_run_finished" in text
    assert "\\restrict" not in text
    assert "Dumped by pg_dump" not in text
