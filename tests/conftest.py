"""Shared fixtures: a migrated template database built once per test process, cloned into a
fresh database for every test (CREATE DATABASE ... TEMPLATE is a file copy: ~30 ms)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifyq import App
from notifyq._db import migrate as migrations
from notifyq._settings import Settings
from tests.receiver import Receiver
from tests.support import worker_log_dir

ADMIN_DSN = os.environ.get("NOTIFYQ_TEST_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Restarting PostgreSQL would break every test running beside it: the chaos_restart
    scenarios are deselected (not skipped) unless NOTIFYQ_CHAOS_RESTART=1 asks for them, which
    .ci/run does in a pytest invocation of their own."""
    if os.environ.get("NOTIFYQ_CHAOS_RESTART") == "1":
        return
    kept = [i for i in items if i.get_closest_marker("chaos_restart") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def dsn_for(database: str) -> str:
    return psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=database)


def _admin(sql: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    name = f"nq_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _admin(f'CREATE DATABASE "{name}"')
    try:
        async def go() -> None:
            conn = await psycopg.AsyncConnection.connect(dsn_for(name), autocommit=True)
            async with conn:
                await migrations.migrate(conn, "notifyq")
        import anyio
        anyio.run(go)
        yield name
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test only."""
    name = f"nq_{uuid.uuid4().hex[:16]}"
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield dsn_for(name)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_dsn() -> Iterator[str]:
    """A fresh database with no notifyq schema."""
    name = f"nq_{uuid.uuid4().hex[:16]}"
    _admin(f'CREATE DATABASE "{name}"')
    try:
        yield dsn_for(name)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def logs() -> Iterator[Path]:
    """A directory for worker processes' logs, kept when NOTIFYQ_TEST_WORKER_LOGS names one."""
    with worker_log_dir() as path:
        yield path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fast_settings(dsn: str, **overrides: Any) -> Settings:
    """Settings for tests: short poll, lease and maintenance intervals."""
    worker = {"poll_interval_s": 0.2, "lease_s": 3.0, "shutdown_grace_s": 2.0,
              **overrides.pop("worker", {})}
    return Settings(
        database_url=dsn, env="test",
        worker=worker,  # type: ignore[arg-type]
        reaper=overrides.pop("reaper", {"interval_s": 0.2}),
        leader=overrides.pop("leader", {"ttl_s": 1.0}),
        **overrides,
    )


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[App]:
    application = App(settings=fast_settings(dsn))
    async with application:
        yield application


@pytest.fixture
def sql(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection to the test database for assertions in SQL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 (tests/receiver.py), stopped after the test."""
    server = Receiver().start()
    try:
        yield server
    finally:
        server.stop()
