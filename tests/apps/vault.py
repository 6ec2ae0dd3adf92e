"""A worker app for the key-rotation process tests: keys from NOTIFYQ_KEYS /
NOTIFYQ_ACTIVE_KEY_VERSION, and the two vault tables of tests/vault.py registered in code."""

from __future__ import annotations

from notifyq import App
from tests.vault import register_tables

app = App()
register_tables(app)
