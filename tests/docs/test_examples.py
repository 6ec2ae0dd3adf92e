"""The examples of README.md (and docs/*.md) run for real, so the docs cannot drift.

Every fenced block of a file runs, in document order, against one fresh database (migrated by
``notifyq migrate``) and one real ``notifyq serve`` on 127.0.0.1 (a free port, an admin token)
started for the file, from a scratch directory outside the repository with PYTHONPATH unset:

* ``sh`` blocks run in ``bash -euo pipefail`` (``-x``: the log shows each command);
* ``python`` blocks run in a fresh interpreter; top-level ``await`` works (the block runs in
  ``asyncio.run``);
* ``sql`` blocks run on a psycopg autocommit connection to the database;
* ``yaml`` blocks are ``notifyq.yaml`` files: notifyq's settings must load them;
* ``text`` blocks are output or synopses and do not run. Any other fence is refused.

What the blocks find (tests/docs/markdown.py parses the marks):

* Environment: ``NOTIFYQ_DATABASE_URL``, ``NOTIFYQ_ADMIN_TOKEN`` (the server's), keys
  ``NOTIFYQ_KEYS`` with versions 1 and 2 (2 active, so the API's retire of 1 works),
  ``NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS`` = loopback. ``python``, ``python3`` and ``notifyq``
  on PATH are the interpreter under test; ``curl`` fails on an HTTP error
  (``--fail-with-body``), so a 4xx in an example fails it.
* Addresses are rewritten: ``http://127.0.0.1:8080`` is the harness's server,
  ``https://example.com`` a loopback receiver (webhooks are delivered, and nothing leaves
  the machine).
* Marks, an HTML comment right above the fence (setup lines may follow the first line)::

    <!-- example: name=myapp file=myapp.py -->     also written to ./myapp.py before anything
                                                    runs (so `--app myapp:app` finds it)
    <!-- example: after=myapp                       the named block(s) run first, in the same
    emails = ["a@b.c"]                              interpreter, then these setup lines
    -->
    <!-- example: background -->                   one long-running command (a worker): it
                                                    must still run when the file's examples are
                                                    done, then exit 0 on SIGTERM
    <!-- example: covered-by=".ci/run (wheel job)" -->   not run here: the named repo file
                                                    runs it for real (pip installs, the test
                                                    command itself)
    <!-- examples: serve="--app myapp:app" -->     for the whole file: arguments of its serve

The interpreter under test is this one, or the venv named by ``NOTIFYQ_WHEEL_VENV`` (its
``bin/python`` and ``bin/notifyq``): ``.ci/run`` points it at the venv where it installed the
built wheel.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests import vault
from tests.docs.markdown import Block, Document, parse
from tests.integration.serving import ADMIN, Served
from tests.receiver import Receiver
from tests.support import ROOT

BLOCK_TIMEOUT_S = 90
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Top-level await: compile with the flag; a module that awaits evaluates to a coroutine.
RUN_PYTHON = """\
import ast, asyncio, inspect, sys
path = sys.argv[1]
code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
scope = {"__name__": "__main__", "__file__": path}
result = eval(code, scope)
if inspect.iscoroutine(result):
    asyncio.run(result)
"""
LOAD_SETTINGS = "from notifyq._settings import load_settings; load_settings()"


@dataclass
class Tools:
    """The interpreter under test: the command lines of its python and notifyq."""

    python: list[str]
    notifyq: list[str]

    @classmethod
    def under_test(cls) -> Tools:
        venv = os.environ.get("NOTIFYQ_WHEEL_VENV")
        if venv:
            bin_dir = Path(venv).absolute() / "bin"
            return cls([str(bin_dir / "python")], [str(bin_dir / "notifyq")])
        return cls([sys.executable], [sys.executable, "-m", "notifyq"])

    def shims(self, directory: Path) -> Path:
        """``python``, ``python3``, ``notifyq`` and a failing-on-errors ``curl``, as
        scripts (a symlink to a venv's python would not find the venv)."""
        directory.mkdir()
        curl = shutil.which("curl")
        assert curl, "the examples need curl"
        for name, command in (("python", self.python), ("python3", self.python),
                              ("notifyq", self.notifyq),
                              ("curl", [curl, "--silent", "--show-error", "--fail-with-body",
                                        "--max-time", "30"])):
            script = directory / name
            script.write_text(f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n')
            script.chmod(0o755)
        return directory


@dataclass
class Session:
    """One Markdown file's run: its directory, environment, server and receiver."""

    document: Document
    workdir: Path
    env: dict[str, str]
    dsn: str
    rewrites: dict[str, str]
    background: list[tuple[Block, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def code(self, block: Block) -> str:
        text = self.document.source(block)
        for old, new in self.rewrites.items():
            text = text.replace(old, new)
        return text

    def run(self, block: Block) -> None:
        if block.runner is None:
            return
        if "background" in block.options:
            self._start(block)
            return
        script = self.workdir / f".example-{block.line}"
        script.write_text(self.code(block) + "\n")
        match block.runner:
            case "sh":
                self._call(block, ["bash", "-euxo", "pipefail", str(script)])
            case "python":
                self._call(block, ["python", "-c", RUN_PYTHON, str(script)])
            case "yaml":
                self._call(block, ["python", "-c", LOAD_SETTINGS],
                           env={"NOTIFYQ_CONFIG_FILE": str(script)})
            case "sql":
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    try:
                        conn.execute(self.code(block))
                    except psycopg.Error as exc:
                        pytest.fail(f"{block.where}: {exc}\n{self.code(block)}")

    def _call(self, block: Block, cmd: list[str], env: dict[str, str] | None = None) -> None:
        try:
            result = subprocess.run(cmd, cwd=self.workdir, env=self.env | (env or {}),
                                    capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                                    check=False)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S} s\n"
                        f"{exc.stdout!r}\n{exc.stderr!r}")
        if result.returncode != 0:
            pytest.fail(f"{block.where} ({block.language}) exited {result.returncode}\n"
                        f"--- code\n{self.code(block)}\n--- stdout\n{result.stdout[-3000:]}\n"
                        f"--- stderr\n{result.stderr[-5000:]}")

    def _start(self, block: Block) -> None:
        log = self.workdir / f".example-{block.line}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(["bash", "-c", "exec " + self.code(block).strip()],
                                    cwd=self.workdir, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.background.append((block, proc, log))

    def stop_background(self) -> None:
        """Each long-running block still runs, and stops cleanly on SIGTERM."""
        problems = []
        for block, proc, log in self.background:
            if proc.poll() is not None:
                problems.append(f"{block.where} exited {proc.returncode} early")
            else:
                proc.terminate()
                try:
                    code = proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
                if code != 0:
                    problems.append(f"{block.where} exited {code} on SIGTERM")
            if problems and problems[-1].startswith(block.where):
                problems[-1] += "\n" + log.read_text(errors="replace")[-3000:]
        assert not problems, "\n".join(problems)


def _environment(tools_bin: Path, dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NOTIFYQ_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {
        "PATH": f"{tools_bin}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONNOUSERSITE": "1",
        "NOTIFYQ_DATABASE_URL": dsn,
        "NOTIFYQ_ADMIN_TOKEN": ADMIN,
        "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        **vault.keys_env(1, 2, active=2),
    }


@pytest.fixture
def session(request: pytest.FixtureRequest, empty_dsn: str, tmp_path: Path,
            ) -> Iterator[Session]:
    dsn = empty_dsn
    document = parse(request.param, ROOT)
    workdir = tmp_path / "work"
    workdir.mkdir()
    for block in document.blocks:
        if "file" in block.options:
            (workdir / block.options["file"]).write_text(block.code + "\n")
    tools = Tools.under_test()
    env = _environment(tools.shims(tmp_path / "bin"), dsn)
    migrated = subprocess.run([*tools.notifyq, "migrate"], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert migrated.returncode == 0, migrated.stderr
    keys = {k: env[k] for k in ("NOTIFYQ_KEYS", "NOTIFYQ_ACTIVE_KEY_VERSION",
                                "NOTIFYQ_WEBHOOKS__ALLOWED_NETWORKS", "PYTHONNOUSERSITE")}
    with Receiver() as receiver, Served(
            dsn, tmp_path / "serve.log", notifyq=tools.notifyq, cwd=workdir, env=keys,
            args=shlex.split(document.options.get("serve", ""))) as served:
        yield Session(document, workdir, env, dsn, {
            "http://127.0.0.1:8080": served.url,
            "https://example.com": receiver.url(""),
        })
        assert served.proc.poll() is None, f"serve died:\n{served.log()}"
        assert served.terminate() == 0, served.log()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("session", DOCUMENTS, ids=lambda p: p.name, indirect=True)
def test_every_example_of_the_document_runs_as_written(session: Session) -> None:
    try:
        for block in session.document.blocks:
            session.run(block)
    finally:
        session.stop_background()


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_every_block_of_the_document_runs_or_is_marked_as_output_or_covered_elsewhere(
        path: Path) -> None:
    document = parse(path, ROOT)  # refuses unknown languages, dangling marks, bad references
    assert document.blocks
    for block in document.blocks:
        assert block.runner is not None or block.language == "text" or (
            "covered-by" in block.options), block.where
