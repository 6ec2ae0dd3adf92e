"""Where the SQL files live: inside the wheel (``notifyq/_sql``) or, from a source checkout,
the repository's ``db/`` directory."""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path


def sql_root() -> Traversable:
    packaged = resources.files("notifyq") / "_sql"
    if packaged.is_dir():
        return packaged
    source = Path(__file__).resolve().parents[2] / "db"
    if source.is_dir():
        return source
    raise FileNotFoundError(
        "notifyq's SQL files are missing: reinstall the package (pip install --force-reinstall "
        "notifyq)"
    )
