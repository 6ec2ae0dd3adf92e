"""Every named query has at least one test in tests/db (STYLE.md item 10)."""

from __future__ import annotations

import re
from pathlib import Path

from notifyq._db.queries import queries_for


def test_every_named_query_is_exercised_by_a_db_test() -> None:
    here = Path(__file__).parent
    sources = "\n".join(p.read_text() for p in here.glob("*.py") if p.name != Path(__file__).name)
    used = set(re.findall(r"\bq\.([a-z0-9_]+)", sources))
    missing = set(queries_for("notifyq").names()) - used
    assert missing == set()
