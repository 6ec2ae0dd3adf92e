"""Fixtures for running the named queries directly with psycopg on a fresh migrated database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from notifyq._db.queries import Queries, queries_for

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def q() -> Queries:
    return queries_for("notifyq")


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """An autocommit dict-row connection to the test database."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def db2(dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A second, independent connection (for concurrency tests)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        yield conn
