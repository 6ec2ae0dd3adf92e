"""The installed notifyq's version, looked up once (``notifyq.__version__``, the worker
registry, the dashboard's footer and the benchmark's metadata all show this one)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("notifyq")
except PackageNotFoundError:  # pragma: no cover - imported from a checkout, never installed
    VERSION = "0+unknown"
