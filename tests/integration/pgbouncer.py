"""A real PgBouncer in front of the test server, in transaction pooling mode, for the tests of
notifyq behind it (tests/integration/test_pgbouncer.py, tests/chaos/test_pgbouncer_restart.py).

Debian's ``pgbouncer`` (1.18 on bookworm: no protocol-level prepared statements, which came in
1.21), started as a process of the test on a free loopback port with a generated config:
``auth_type = any`` (every client logs in as the server's user from the test DSN, no password
file), one wildcard database entry, no system service. When it is not installed the tests fail
and say how to install it; ``.ci/run`` does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.serving import free_port
from tests.support import wait_until


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).is_file()), None)
    if found is None:
        pytest.fail("pgbouncer is missing: `apt-get install -y pgbouncer` (.ci/run does); the "
                    "PgBouncer tests start their own process from it, no service needed")
    return found


class PgBouncer:
    """One pgbouncer process pooling every database of the server in ``dsn``'s in transaction
    mode; its stderr log is in ``self.log_path``. Use as a context manager."""

    def __init__(self, dsn: str, *, pool_size: int = 20) -> None:
        self.binary = pgbouncer_binary()
        target = psycopg.conninfo.conninfo_to_dict(dsn)
        self.server_dsn = dsn
        self.port = free_port()
        # pgbouncer refuses to run as root: as root it switches to the server's OS user, who
        # must read this directory.
        self.dir = Path(tempfile.mkdtemp(prefix="nq-pgbouncer-"))
        self.dir.chmod(0o755)
        self.log_path = self.dir / "pgbouncer.log"
        self.ini = self.dir / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"* = host={target.get('host', '127.0.0.1')} port={target.get('port', 5432)} "
            f"user={target.get('user', 'postgres')}\n\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 1000\n"
            "server_login_retry = 0.2\n")
        self.ini.chmod(0o644)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def dsn(self, database_dsn: str) -> str:
        """``database_dsn`` (a database of the same server) through this PgBouncer."""
        return psycopg.conninfo.make_conninfo(database_dsn, host="127.0.0.1", port=self.port)

    def start(self) -> PgBouncer:
        user = ["-u", _server_os_user()] if os.geteuid() == 0 else []
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([self.binary, *user, str(self.ini)],
                                         stdout=subprocess.DEVNULL, stderr=log)
        self.starts += 1
        wait_until(self._answers, timeout=15, interval=0.05)
        return self

    def _answers(self) -> None:
        assert self.proc is not None
        assert self.proc.poll() is None, self.log()
        try:
            with psycopg.connect(self.dsn(self.server_dsn), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            raise AssertionError(str(exc)) from None

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM: PgBouncer's immediate shutdown (every client and server connection is
        cut, open transactions roll back); SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(15)
        self.proc = None

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def logins(self, database: str) -> int:
        """Client logins to ``database`` in the log (each pooled connection, each reconnect)."""
        return sum(f"login attempt: db={database} " in line
                   for line in self.log().splitlines())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _server_os_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    raise AssertionError("no unprivileged user to run pgbouncer as (it refuses root)")
