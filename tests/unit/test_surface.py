"""The public surface, the query registry, the scheduler's ticks and handler registration."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import notifyq
from notifyq import App, ConfigError, JobContext, RetryPolicy
from notifyq._cadence import Every
from notifyq._db.files import sql_root
from notifyq._db.queries import queries_for
from notifyq._registry import PeriodicSpec
from notifyq._settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _names_in_sql_files() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "db" / "queries").glob("*.sql"):
        names.update(re.findall(r"^--\s*name:\s*([a-z0-9_]+)\s*$", path.read_text(), re.M))
    return names


def test_the_query_registry_loads_every_named_query() -> None:
    queries = queries_for("notifyq")
    expected = _names_in_sql_files()
    assert len(expected) > 20
    assert set(queries.names()) == expected
    for name in expected:
        text = getattr(queries, name)
        assert text.strip()
        assert "{schema}" not in text
        assert "-- name:" not in text


def test_queries_quote_the_schema_identifier() -> None:
    assert '"my_schema".job_run' in queries_for("my_schema").job_run_finish_and_claim


def test_an_unknown_query_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no query named job_run_nope"):
        _ = queries_for("notifyq").job_run_nope  # type: ignore[attr-defined]  # mypy says so too


def test_sql_files_are_found_from_a_source_checkout() -> None:
    assert (sql_root() / "migrations" / "0001_core.sql").is_file()


PUBLIC = [
    "App", "ChildFailed", "ChildRun", "Clock", "ConcurrencyPolicy", "ConcurrencyRejected",
    "ConfigError", "DatabaseUnavailable", "DecryptionFailed", "DedupePolicy", "EncryptedColumn",
    "Endpoint", "EnqueueRequest", "InvalidEndpoint", "InvalidEnqueue", "InvalidTransition",
    "JobContext", "Keyring", "ManualClock", "NotifyqError", "PayloadTooLarge", "Permanent",
    "PromotionRefused", "RateLimit",
    "ResultTimeout", "RetiredKeyVersion", "RetryPolicy", "RotationInProgress", "Run", "RunFailed",
    "RunInfo", "RunNotFound", "RunStatus", "ScheduleNotFound", "SchemaError", "Scope",
    "SentMessage", "Settings", "Snooze", "Stats", "StepError", "SystemClock", "UnknownJobType",
    "UnknownKeyVersion", "UnknownStep", "WaitTimeout", "WebhookMessage",
    "WebhookNotFound", "__version__",
]
"""The documented surface: a change here is a change of the public API (CHANGELOG it)."""
INTERNAL_ERRORS = {"LeaseLost", "CompleterClosedError", "StaleWriters", "BlockedAddress",
                   "ResolutionFailed", "BenchError"}


def test_notifyq_exports_exactly_the_documented_names_sorted() -> None:
    assert notifyq.__all__ == sorted(PUBLIC, key=lambda n: (n.startswith("_"), n))
    public = {name for name in vars(notifyq) if not name.startswith("_")}
    assert public == set(PUBLIC) - {"__version__"}
    for name in notifyq.__all__:
        assert getattr(notifyq, name) is not None


def test_every_error_is_in_the_one_drawn_tree_and_exported_unless_internal() -> None:
    from notifyq import _errors

    errors = {name for name, value in vars(_errors).items()
              if isinstance(value, type) and issubclass(value, _errors.NotifyqError)}
    drawn = set(re.findall(r"[├└]── (\w+)", _errors.__doc__ or ""))
    assert errors - {"NotifyqError"} == drawn
    assert errors - INTERNAL_ERRORS <= set(PUBLIC)
    assert not INTERNAL_ERRORS & set(PUBLIC)
    for name in errors:  # the tree lives in one module
        assert getattr(_errors, name).__module__ == "notifyq._errors"


def test_the_version_is_the_installed_distributions() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert notifyq.__version__ == project["version"]


def test_the_latest_tick_is_the_same_for_every_moment_in_a_tick() -> None:
    every = Every(timedelta(milliseconds=300))
    start = every.latest(datetime(2030, 1, 1, tzinfo=UTC))
    assert every.latest(start) == start
    assert every.latest(start + every.every - timedelta(microseconds=1)) == start
    assert every.latest(start + every.every) == start + every.every
    assert every.after(start) == start + every.every
    assert every.before(start) == start - every.every


def test_periodic_names_carry_the_exact_interval() -> None:
    assert PeriodicSpec("r.b", Every(timedelta(milliseconds=1001)), {}).name == "r.b@1001ms"
    assert PeriodicSpec("r.b", Every(timedelta(minutes=5)), {}).name == "r.b@300000ms"


def test_periodic_refuses_intervals_under_100_ms() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")
    with pytest.raises(ConfigError, match="at least 100 ms"):
        app.periodic("a.b", every=timedelta(milliseconds=99))


def test_periodic_needs_a_job_type_or_a_handler_below() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")

    def orphan(ctx: JobContext) -> None: ...

    with pytest.raises(ConfigError, match="needs job_type"):
        app.periodic(every=timedelta(seconds=1))(orphan)


def test_periodic_stacked_on_handler_uses_the_handler_type() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")

    @app.periodic(every=timedelta(seconds=5), input={"k": 1})
    @app.handler("report.build")
    async def build(ctx: JobContext) -> None: ...

    assert app._registry.periodic == [PeriodicSpec("report.build", Every(timedelta(seconds=5)),
                                                  {"k": 1})]


def test_handler_registration_validates_type_pool_and_timeout() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")

    async def fn(ctx: JobContext) -> None: ...

    with pytest.raises(ConfigError, match="invalid job type"):
        app.handler("Bad Type")(fn)
    with pytest.raises(ConfigError, match="invalid pool"):
        app.handler("ok", pool="Bad Pool")(fn)
    with pytest.raises(ConfigError, match="timeout_s must be positive"):
        app.handler("ok", timeout_s=0)(fn)


def test_registering_a_type_twice_is_refused_in_production() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x", settings=None)
    assert app.settings.env == "production"

    async def fn(ctx: JobContext) -> None: ...

    app.handler("a.b")(fn)
    with pytest.raises(ConfigError, match="registered twice"):
        app.handler("a.b")(fn)


def test_registering_a_type_twice_warns_and_overwrites_in_development(
        caplog: pytest.LogCaptureFixture) -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x", settings=Settings(env="development"))

    async def first(ctx: JobContext) -> None: ...
    async def second(ctx: JobContext) -> None: ...

    app.handler("a.b")(first)
    with caplog.at_level("WARNING", logger="notifyq"):
        app.handler("a.b")(second)
    spec = app._registry.get("a.b")
    assert spec is not None
    assert spec.call is second
    assert "registered twice" in caplog.text


def test_registering_a_type_twice_silently_overwrites_in_tests(
        caplog: pytest.LogCaptureFixture) -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x", settings=Settings(env="test"))

    async def first(ctx: JobContext) -> None: ...
    async def second(ctx: JobContext) -> None: ...

    app.handler("a.b")(first)
    with caplog.at_level("DEBUG", logger="notifyq"):
        app.handler("a.b")(second)
    spec = app._registry.get("a.b")
    assert spec is not None
    assert spec.call is second
    assert caplog.text == ""


def test_class_handlers_are_instantiated_and_called_through_handle() -> None:
    app = App(dsn="postgresql://x@127.0.0.1/x")

    @app.handler("c.sync")
    class SyncHandler:
        def handle(self, ctx: JobContext) -> int:
            return 1

    @app.handler("c.async", retry=RetryPolicy(attempts=2))
    class AsyncHandler:
        async def handle(self, ctx: JobContext) -> int:
            return 2

    sync_spec, async_spec = app._registry.get("c.sync"), app._registry.get("c.async")
    assert sync_spec is not None
    assert async_spec is not None
    assert not sync_spec.is_async
    assert async_spec.is_async
    assert async_spec.definition()["max_attempts"] == 2
