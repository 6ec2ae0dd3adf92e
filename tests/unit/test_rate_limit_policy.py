"""RateLimit's validation and how a handler's limit becomes its stored definition."""

from __future__ import annotations

import pytest

from notifyq import App, ConcurrencyPolicy, ConfigError, RateLimit


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"limit": 0}, "limit must be between 1 and 10000"),
    ({"limit": 10_001}, "limit must be between 1 and 10000"),
    ({"limit": 5, "period_s": 0}, "period_s must be in"),
    ({"limit": 5, "period_s": 86_401}, "period_s must be in"),
    ({"limit": 5, "key": ""}, "key must be a template string"),
])
def test_bad_rate_limits_are_refused_with_the_reason(kwargs: dict[str, object],
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateLimit(**kwargs)  # type: ignore[arg-type]


def test_the_definition_carries_the_limit_the_period_and_the_key_template() -> None:
    app = App()

    @app.handler("t.rated", rate_limit=RateLimit(limit=100, period_s=60, key="smtp:{tenant}"))
    async def rated(ctx: object) -> None: ...

    @app.handler("t.plain")
    async def plain(ctx: object) -> None: ...

    specs = {s.job_type: s.definition() for s in app._registry.specs()}
    assert (specs["t.rated"]["rate_limit"], specs["t.rated"]["rate_period_s"],
            specs["t.rated"]["rate_key_template"]) == (100, 60, "smtp:{tenant}")
    assert specs["t.plain"]["rate_limit"] is None
    assert app._registry.keyed_pools() == {"default"}


def test_a_rate_limit_and_a_concurrency_policy_do_not_combine_yet() -> None:
    app = App()
    with pytest.raises(ConfigError, match="do not combine"):
        app.handler("t.both", rate_limit=RateLimit(limit=1),
                    concurrency=ConcurrencyPolicy(key="k"))(lambda ctx: None)
