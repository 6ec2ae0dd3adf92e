"""What a user installs is what works: the built wheel, installed with its declared dependencies
(resolved by pip as for any user) into a clean venv without system site-packages, used from
outside the repository with PYTHONPATH unset: it migrates, runs a worker that delivers a signed
webhook to a loopback receiver and re-encrypts under a new key, and serves the API.

The venv is built once per test session (about 12 s with pip's cache warm) and shared by the
tests here, also across xdist workers (a file lock next to their temp directories). With
``NOTIFYQ_WHEEL_VENV`` set, the tests use that venv instead: ``.ci/run``'s wheel job installs
the wheel itself and runs them (and the README's examples) against it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from tests import vault
from tests.integration.serving import ADMIN, Served
from tests.receiver import Receiver
from tests.support import ROOT, scalar, stop, wait_until

pytestmark = pytest.mark.timeout(420)  # the first test also builds the venv

APP_MODULE = '''
from notifyq import App, JobContext

app = App()


@app.handler("wheel.echo")
async def echo(ctx: JobContext) -> dict:
    return {"echo": ctx.input}
'''


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, f"{cmd}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def clean_env(**settings: str) -> dict[str, str]:
    """The environment of a user's shell: nothing of the checkout (no PYTHONPATH, no active
    venv, no NOTIFYQ_* of the test run), no user site-packages."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NOTIFYQ_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"PYTHONNOUSERSITE": "1", **settings}


@dataclass(frozen=True)
class Installed:
    venv: Path
    elsewhere: Path
    """A directory outside the repository to run from."""

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def notifyq(self, *args: str, env: dict[str, str], cwd: Path | None = None,
                timeout: float = 60) -> str:
        return _run([self.bin("notifyq"), *args], cwd=cwd or self.elsewhere, env=env,
                    timeout=timeout).stdout


def _install(root: Path) -> None:
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(root / "dist"), str(ROOT)],
         cwd=elsewhere)
    [wheel] = (root / "dist").glob("notifyq-*.whl")
    _run([sys.executable, "-m", "venv", str(root / "venv")], cwd=elsewhere)  # no system site
    _run([str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
          str(wheel)], cwd=elsewhere, env=clean_env())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    given = os.environ.get("NOTIFYQ_WHEEL_VENV")
    if given:
        return Installed(Path(given).absolute(), tmp_path_factory.mktemp("elsewhere"))
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's directory, above every xdist worker's own
    root = shared / "wheel-venv"
    root.mkdir(exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / "ready").exists():
            started = time.monotonic()
            _install(root)
            (root / "ready").write_text(f"{time.monotonic() - started:.1f} s\n")
    return Installed(root / "venv", root / "elsewhere")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as server:
        yield server


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'notifyq'").fetchall()
    return {r[0] for r in rows}


def test_the_installed_wheel_imports_everything_and_migrates_from_outside_the_repo(
        installed: Installed, empty_dsn: str) -> None:
    env = clean_env(NOTIFYQ_DATABASE_URL=empty_dsn)
    _run([installed.bin("python"), "-m", "pip", "check"], cwd=installed.elsewhere, env=env)
    located = _run([installed.bin("python"), "-c", "import notifyq._db.files as f, notifyq; "
                    "print(notifyq.__file__); print(f.sql_root())"],
                   cwd=installed.elsewhere, env=env)
    module_file, sql_dir = located.stdout.split()
    assert Path(module_file).is_relative_to(installed.venv)  # not the checkout
    assert Path(sql_dir) == Path(module_file).parent / "_sql"
    version = _run([installed.bin("python"), "-c", "import notifyq; print(notifyq.__version__)"],
                   cwd=installed.elsewhere, env=env).stdout.strip()
    assert installed.notifyq("--version", env=env) == f"notifyq {version}\n"
    # Every module imports with the declared dependencies alone (httpx was test-only once).
    _run([installed.bin("python"), "-c",
          "import importlib, pkgutil, notifyq\n"
          "for m in pkgutil.walk_packages(notifyq.__path__, 'notifyq.'):\n"
          "    if not m.name.endswith('__main__'): importlib.import_module(m.name)"],
         cwd=installed.elsewhere, env=env)

    assert _tables(empty_dsn) == set()
    installed.notifyq("migrate", env=env)
    assert {"job", "job_run", "job_step", "leader", "periodic_tick", "webhook_endpoint",
            "schema_migration"} <= _tables(empty_dsn)
    assert installed.notifyq("migrate", "--check", env=env).strip() == "schema is current"


class WheelWorker:
    """``notifyq worker`` of the installed wheel on an app module in ``app_dir``."""

    def __init__(self, installed: Installed, app_dir: Path, env: dict[str, str],
                 log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [installed.bin("notifyq"), "worker", "--app", "wheelapp:app"], cwd=app_dir,
                env=env, stdout=subprocess.DEVNULL, stderr=out)

    def stop(self) -> int:
        return stop(self.proc)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _received(receiver: Receiver, count: int) -> list[Any]:
    requests = receiver.at("/hook")
    assert len(requests) >= count
    return requests


def test_a_worker_from_the_wheel_runs_handlers_delivers_a_signed_webhook_and_rotates_a_key(
        installed: Installed, dsn: str, sql: psycopg.Connection[Any], receiver: Receiver,
        tmp_path: Path) -> None:
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "wheelapp.py").write_text(APP_MODULE)
    common = {"NOTIFYQ_DATABASE_URL": dsn, "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS":
              "127.0.0.0/8,::1/128", "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.2"}
    one_key = clean_env(**common, **vault.keys_env(1, active=1))
    worker = WheelWorker(installed, app_dir, one_key, tmp_path / "worker.log")
    try:
        run_id = installed.notifyq("enqueue", "wheel.echo", "--input", '{"n": 1}',
                                   env=one_key).strip()
        wait_until(lambda: _assert_equal(scalar(
            sql, "SELECT output FROM notifyq.job_run WHERE id = %s AND status = 'completed'",
            (run_id,)), {"echo": {"n": 1}}), timeout=30)

        endpoint = json.loads(installed.notifyq(
            "webhooks", "endpoints", "add", receiver.url("/hook"), "--json", env=one_key))
        message = installed.notifyq("webhooks", "send", "invoice.paid", "--payload",
                                    '{"id": 42}', env=one_key).strip()
        [first] = wait_until(lambda: _received(receiver, 1), timeout=30)
        assert first.headers["webhook-id"] == message
        assert Webhook(endpoint["secret"]).verify(first.body, first.headers) == {"id": 42}
        assert worker.stop() == 0, worker.logs()

        # The README's rotation: a second key deployed, promoted, then `keys rotate --wait`.
        two_keys = clean_env(**common, **vault.keys_env(1, 2, active=2))
        worker = WheelWorker(installed, app_dir, two_keys, tmp_path / "worker.log")
        installed.notifyq("keys", "promote", "2", env=two_keys)
        out = installed.notifyq("keys", "rotate", "--wait", "--json", env=two_keys)
        rotation = json.loads(out)
        assert rotation["run"]["status"] == "completed", out
        assert rotation["run"]["job_type"] == "secret.reencrypt"
        assert scalar(sql, "SELECT array_agg(DISTINCT notifyq.key_version_of(ciphertext)) "
                           "FROM notifyq.webhook_secret") == [2]

        # The re-encrypted secret still signs (the worker decrypts it under version 2).
        installed.notifyq("webhooks", "send", "invoice.paid", "--payload", '{"id": 43}',
                          env=two_keys)
        second = wait_until(lambda: _received(receiver, 2), timeout=30)[1]
        assert Webhook(endpoint["secret"]).verify(second.body, second.headers) == {"id": 43}
        assert worker.stop() == 0, worker.logs()
    finally:
        worker.stop()


def _assert_equal(actual: object, expected: object) -> None:
    assert actual == expected


def test_serve_from_the_wheel_answers_probes_v1_calls_and_serves_the_dashboard(
        installed: Installed, dsn: str, tmp_path: Path) -> None:
    with Served(dsn, tmp_path / "serve.log", notifyq=[installed.bin("notifyq")],
                cwd=installed.elsewhere, env={"PYTHONNOUSERSITE": "1"}) as served:
        with served.client(None) as anonymous:
            assert anonymous.get("/healthz").json()["status"] == "ok"
            assert anonymous.get("/readyz").status_code == 200
            assert anonymous.get("/v1/stats").status_code == 401
        with served.client() as http:
            # No worker of this serve handles wheel.later: enqueued with the opt-out.
            created = http.post("/v1/jobs?allow_unknown_type=true",
                                json={"job_type": "wheel.later",
                                      "run_at": "2999-01-01T00:00:00Z"})
            assert created.status_code == 201, created.text
            got = http.get(f"/v1/jobs/{created.json()['id']}")
            assert (got.status_code, got.json()["status"]) == (200, "pending")
        # The dashboard: its URL on stderr, its pages and vendored assets from the package.
        assert f"dashboard at {served.url}/ui/" in served.log()
        with served.client(None) as browser:
            assert browser.get("/ui/").status_code == 303
            assert "Sign in" in browser.get("/ui/signin").text
            htmx = browser.get("/ui/static/vendor/htmx/htmx.min.js")
            assert htmx.status_code == 200
            assert b"htmx" in htmx.content
        assert served.terminate() == 0, served.log()
    assert ADMIN not in served.log()
