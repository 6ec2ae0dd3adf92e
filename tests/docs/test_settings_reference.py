"""docs/settings.md is the generator's output, complete, and its environment variables work."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel, SecretStr

from notifyq import Settings
from notifyq._settings_reference import Entry, entries, main, render, sections
from tests.support import ROOT

REFERENCE = ROOT / "docs" / "settings.md"
REGENERATE = "python -m notifyq._settings_reference > docs/settings.md"

KEY = base64.b64encode(bytes(range(32))).decode()
# The settings whose default is none: their variable's value, and the setting it makes (the
# others are set to their default).
VALUES: dict[str, tuple[str, Any]] = {
    "database_url": ("postgresql://app@db.internal:5432/app",) * 2,
    "listen_database_url": ("postgresql://app@db.internal:5432/app",) * 2,
    "worker.heartbeat_interval_s": ("5", 5.0),
    "worker.prefetch": ("4", 4),
    "api.admin_token": ("an-admin-token-0123456789",) * 2,
    "api.read_token": ("a-read-token-0123456789",) * 2,
    "embedded.data_dir": ("/srv/notifyq/pg",) * 2,
    "webhooks.enabled": ("false", False),  # true needs a keyring
    "keys": (f"1:{KEY}",) * 2,
    "active_key_version": ("1", 1),
    "webhooks.portal_url": ("https://hooks.example.com",) * 2,
    "webhooks.operator_endpoint_id": ("0193a2f0-7c1e-7a3b-9d2e-3c9e3db5a1f0",
                                      UUID("0193a2f0-7c1e-7a3b-9d2e-3c9e3db5a1f0")),
}
# Settings that only load together with another one.
COMPANIONS = {"keys": {"NOTIFYQ_ACTIVE_KEY_VERSION": "1"},
              "active_key_version": {"NOTIFYQ_KEYS": f"1:{KEY}"},
              "key_file": {"NOTIFYQ_ACTIVE_KEY_VERSION": "1"}}


class _Undocumented(BaseModel):
    size: int = 10
    """How big."""


class _Misstated(BaseModel):
    size: int = 10
    """How big. Defaults to 20."""


class _SaysRequired(BaseModel):
    size: int = 10
    """How big. Required."""


def test_the_settings_reference_is_the_generators_output() -> None:
    assert REFERENCE.read_text() == render(), (
        f"docs/settings.md is out of date: regenerate it with `{REGENERATE}`")


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= _leaf_paths(annotation, f"{prefix}{name}.")
        else:
            paths.add(prefix + name)
    return paths


def test_the_reference_has_every_setting_with_a_description_and_a_default() -> None:
    listed = {e.path for e in entries() if e.env is not None}
    assert listed == _leaf_paths(Settings)
    for entry in entries():
        assert entry.description, f"{entry.path}: no description"
        assert entry.default, f"{entry.path}: no default"
    described = {s.path: s.description for s in sections()}
    for section in ("worker", "reaper", "resumer", "purger", "leader", "api", "embedded",
                    "webhooks", "enqueue", "api.tokens[]", "encrypted_columns[]"):
        assert described.get(section), f"section {section}: missing, or no description"


def _env_value(entry: Entry, tmp_path: Path) -> str:
    if entry.path in VALUES:
        return str(VALUES[entry.path][0])
    if entry.path == "key_file":
        path = tmp_path / "keys"
        path.write_text(f"1:{KEY}\n")
        return str(path)
    value: Any = entry.literal
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value) if "comma-separated" in entry.env_form else json.dumps(value)
    return str(value)


def _value_at(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


@pytest.mark.parametrize("entry", [e for e in entries() if e.env], ids=lambda e: e.path)
def test_every_environment_variable_of_the_reference_sets_its_setting(
        entry: Entry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("NOTIFYQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no notifyq.yaml
    assert entry.env is not None
    for name in (entry.env, *entry.aliases):
        monkeypatch.setenv(name, _env_value(entry, tmp_path))
        for other, value in COMPANIONS.get(entry.path, {}).items():
            monkeypatch.setenv(other, value)
        section, _, field = entry.path.rpartition(".")
        settings = Settings()
        owner = _value_at(settings, section) if section else settings
        assert field in owner.model_fields_set, f"{name} did not set {entry.path}"
        if entry.path in VALUES:
            assert _value_at(settings, entry.path) == VALUES[entry.path][1]
        monkeypatch.delenv(name)


def test_the_check_mode_fails_on_a_stale_reference_and_says_how_to_regenerate_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    current, stale = tmp_path / "current.md", tmp_path / "stale.md"
    current.write_text(render())
    stale.write_text(render().replace("worker.lease_s", "worker.lease"))
    assert main(["--check", str(current)]) == 0
    assert main(["--check", str(stale)]) == 1
    assert main(["--check", str(tmp_path / "missing.md")]) == 1
    assert "python -m notifyq._settings_reference >" in capsys.readouterr().err


@pytest.mark.parametrize(("model", "message"), [
    (_Undocumented, "must end by stating the default"),
    (_Misstated, "the default is 20; the field's is 10"),
    (_SaysRequired, "says it is required; the field has a default"),
])
def test_a_description_that_omits_or_misstates_the_default_is_refused(
        model: type[BaseModel], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sections(model)
