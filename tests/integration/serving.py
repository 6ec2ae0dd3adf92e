"""Run ``python -m notifyq serve`` as a real process on a free port, for the HTTP tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support import ROOT, wait_until

ADMIN = "admin-token-for-tests-0123456789"
READER = "read-token-for-tests-0123456789"
SERVICE_APP = "tests.apps.service:app"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """One ``notifyq serve`` process; its stderr goes to ``log_path``.

    By default it is this interpreter's ``-m notifyq`` with the checkout on PYTHONPATH and the
    test service app; ``notifyq`` names another program instead (an installed ``notifyq``,
    run as it is: no PYTHONPATH, no ``--app`` unless ``args`` has one, in ``cwd``)."""

    def __init__(self, dsn: str | None, log_path: Path, *, args: list[str] | None = None,
                 env: dict[str, str] | None = None, wait: bool = True,
                 notifyq: list[str] | None = None, cwd: Path = ROOT,
                 tokens: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("NOTIFYQ_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        if notifyq is None:
            notifyq = [sys.executable, "-m", "notifyq"]
            args = ["--app", SERVICE_APP, *(args or [])]
            base["PYTHONPATH"] = str(ROOT)
        full_env = {
            **base,
            "NOTIFYQ_ENV": "test",
            **({"NOTIFYQ_ADMIN_TOKEN": ADMIN, "NOTIFYQ_READ_TOKEN": READER} if tokens else {}),
            "NOTIFYQ_WORKER__POLL_INTERVAL_S": "0.2",
            "NOTIFYQ_WORKER__LEASE_S": "3",
            "NOTIFYQ_WORKER__SHUTDOWN_GRACE_S": "2",
            "NOTIFYQ_REAPER__INTERVAL_S": "0.3",
            "NOTIFYQ_LEADER__TTL_S": "1",
            "NOTIFYQ_POOL_MAX_SIZE": "4",
            **({"NOTIFYQ_DATABASE_URL": dsn} if dsn else {}),
            **(env or {}),
        }
        cmd = [*notifyq, "serve", "--port", str(self.port), *(args or [])]
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=full_env, cwd=cwd,
                                         stdout=subprocess.DEVNULL, stderr=log)
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = 30.0) -> None:
        def healthy() -> None:
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}:\n{self.log()}"
            try:
                response = httpx.get(f"{self.url}/healthz", timeout=1)
            except httpx.TransportError as exc:
                raise AssertionError(str(exc)) from None
            assert response.status_code == 200
        wait_until(healthy, timeout=timeout)

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    def curl_post(self, path: str, body: bytes, *, token: str = ADMIN,
                  content_type: str | None = "application/x-www-form-urlencoded",
                  ) -> tuple[int, str, bytes]:
        """POST the bytes `curl -H "Authorization: Bearer T" -d BODY URL` sends (curl 7.88:
        form-encoded Content-Type) over a raw socket; returns (status, content type, body)."""
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                "User-Agent: curl/7.88.1\r\nAccept: */*\r\n"
                f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
                + (f"Content-Type: {content_type}\r\n" if content_type else "") + "\r\n")
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(head.encode() + body)
            reader = sock.makefile("rb")
            status = int(reader.readline().split()[1])
            headers = {}
            while (line := reader.readline().strip()):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            answer = reader.read(int(headers.get("content-length", "0")))
        return status, headers.get("content-type", ""), answer

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM once, wait; SIGKILL if it hangs (then the test fails on the code)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
