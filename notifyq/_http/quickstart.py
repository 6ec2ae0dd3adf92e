"""The admin token of a quick start: ``notifyq serve`` on a loopback address with no token
configured generates one, keeps it in a file only its user can read, and reuses it on the next
start, so the API is usable at once without the token ever being printed or logged.

Example::

    path, token, created = admin_token(default_dir())
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from notifyq._errors import ConfigError

FILE_NAME = "admin-token"
TOKEN_BYTES = 32  # 43 URL-safe characters


def default_dir() -> Path:
    """``$XDG_DATA_HOME/notifyq``, else ``~/.local/share/notifyq`` (without the embedded
    PostgreSQL; with it the token lives beside its data directory)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "notifyq"


def admin_token(directory: Path) -> tuple[Path, str, bool]:
    """The token kept in ``directory/admin-token``, created (mode 0600) when missing; also
    whether this call created it."""
    path = directory / FILE_NAME
    try:
        try:
            return path, _read(path), False
        except FileNotFoundError:
            return _create(path)
    except OSError as exc:
        raise ConfigError(f"no API token is configured and {path} cannot be used "
                          f"({exc.strerror or exc}): set NOTIFYQ_ADMIN_TOKEN") from None


def _read(path: Path) -> str:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(f"{path} holds the admin token but other users may read it (mode "
                          f"{mode:04o}): run `chmod 600 {path}`, or delete it for a new token")
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < 16:
        raise ConfigError(f"{path} does not hold a token of at least 16 characters: delete it "
                          "for a new token, or set NOTIFYQ_ADMIN_TOKEN")
    return token


def _create(path: Path) -> tuple[Path, str, bool]:
    """Written to a private temporary file, then hard-linked into place: the token is never
    in a file others can read, and of two processes starting at once the second one reads
    the first one's token instead of replacing it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    temporary = path.with_name(f".{FILE_NAME}.{os.getpid()}")
    temporary.unlink(missing_ok=True)  # left by a killed process that had our pid
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(token + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:
        return path, _read(path), False
    finally:
        temporary.unlink()
    return path, token, True
