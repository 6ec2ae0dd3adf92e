"""Settings: sources, precedence, and errors that name the setting and its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifyq import ConfigError
from notifyq._settings import load_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No NOTIFYQ_* variables and no ./notifyq.yaml from the machine running the tests."""
    import os

    for name in list(os.environ):
        if name.startswith("NOTIFYQ_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults_apply_without_any_source() -> None:
    settings = load_settings()
    assert settings.schema_name == "notifyq"
    assert settings.worker.concurrency == 10
    assert settings.worker.heartbeat_every_s == pytest.approx(10.0)
    assert settings.max_input_bytes == 65_536


def test_environment_variables_override_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("NOTIFYQ_WORKER__CONCURRENCY", "20")
    monkeypatch.setenv("NOTIFYQ_WORKER__POOLS", '["a", "b"]')
    settings = load_settings()
    assert settings.database_url == "postgresql://u@h/db"
    assert settings.worker.concurrency == 20
    assert settings.worker.pools == ["a", "b"]


def test_keyword_arguments_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_SCHEMA_NAME", "from_env")
    assert load_settings(schema_name="from_kwargs").schema_name == "from_kwargs"


def test_invalid_environment_value_names_the_setting_and_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_WORKER__CONCURRENCY", "lots")
    with pytest.raises(ConfigError, match=r"worker\.concurrency \(NOTIFYQ_WORKER__CONCURRENCY\)"):
        load_settings()


def test_out_of_range_value_names_the_setting_and_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_POOL_MAX_SIZE", "0")
    with pytest.raises(ConfigError, match=r"pool_max_size \(NOTIFYQ_POOL_MAX_SIZE\): .*greater"):
        load_settings()


def test_every_bad_setting_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_POOL_MAX_SIZE", "0")
    monkeypatch.setenv("NOTIFYQ_REAPER__INTERVAL_S", "-1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "NOTIFYQ_POOL_MAX_SIZE" in str(info.value)
    assert "NOTIFYQ_REAPER__INTERVAL_S" in str(info.value)


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"worker\.concurency"):
        load_settings(worker={"concurency": 3})


def test_heartbeat_must_be_shorter_than_the_lease() -> None:
    with pytest.raises(ConfigError, match=r"worker \(NOTIFYQ_WORKER\): .*heartbeat_interval_s "
                                          r"\(10\.0\) must be less than lease_s \(10\.0\)"):
        load_settings(worker={"lease_s": 10, "heartbeat_interval_s": 10})
    assert load_settings(worker={"lease_s": 10, "heartbeat_interval_s": 9}
                         ).worker.heartbeat_every_s == 9


def test_bad_schema_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="schema_name 'Bad-Name' must match"):
        load_settings(schema_name="Bad-Name")


def test_bad_pool_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="pool name 'Emails' must match"):
        load_settings(worker={"pools": ["Emails"]})


def test_yaml_file_named_by_notifyq_config_file_is_read(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "conf" / "nq.yaml"
    config.parent.mkdir()
    config.write_text("schema_name: from_yaml\nworker:\n  concurrency: 7\n  lease_s: 12\n")
    monkeypatch.setenv("NOTIFYQ_CONFIG_FILE", str(config))
    settings = load_settings()
    assert settings.schema_name == "from_yaml"
    assert settings.worker.concurrency == 7
    assert settings.worker.lease_s == 12


def test_environment_overrides_the_yaml_file(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    config = tmp_path / "nq.yaml"
    config.write_text("schema_name: from_yaml\nworker:\n  concurrency: 7\n")
    monkeypatch.setenv("NOTIFYQ_CONFIG_FILE", str(config))
    monkeypatch.setenv("NOTIFYQ_SCHEMA_NAME", "from_env")
    settings = load_settings()
    assert settings.schema_name == "from_env"
    assert settings.worker.concurrency == 7


def test_notifyq_yaml_in_the_current_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "notifyq.yaml").write_text("pool_max_size: 3\n")
    assert load_settings().pool_max_size == 3


def test_invalid_value_in_the_yaml_file_names_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    config = tmp_path / "nq.yaml"
    config.write_text("worker:\n  lease_s: 0\n")
    monkeypatch.setenv("NOTIFYQ_CONFIG_FILE", str(config))
    with pytest.raises(ConfigError, match=r"worker\.lease_s \(NOTIFYQ_WORKER__LEASE_S\)"):
        load_settings()


def test_missing_config_file_is_an_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NOTIFYQ_CONFIG_FILE", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="NOTIFYQ_CONFIG_FILE: no such file"):
        load_settings()
