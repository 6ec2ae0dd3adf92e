"""The wheel carries its SQL: build it, install it in a fresh venv, migrate with its CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.support import ROOT


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 100) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, f"{cmd}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'notifyq'").fetchall()
    return {r[0] for r in rows}


def test_the_installed_wheel_migrates_an_empty_database_from_outside_the_repo(
        tmp_path: Path, empty_dsn: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist),
          str(ROOT)], cwd=elsewhere)
    [wheel] = dist.glob("notifyq-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=elsewhere)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
          str(wheel)], cwd=elsewhere)

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NOTIFYQ_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"NOTIFYQ_DATABASE_URL": empty_dsn, "PYTHONNOUSERSITE": "1"}
    located = _run([str(python), "-c", "import notifyq.db.files as f, notifyq; "
                    "print(notifyq.__file__); print(f.sql_root())"], cwd=elsewhere, env=env)
    module_file, sql_dir = located.stdout.split()
    assert Path(module_file).is_relative_to(venv)  # not the editable checkout
    assert Path(sql_dir) == Path(module_file).parent / "_sql"

    assert _tables(empty_dsn) == set()
    _run([str(venv / "bin" / "notifyq"), "migrate"], cwd=elsewhere, env=env)
    assert {"job", "job_run", "job_step", "leader", "periodic_tick",
            "schema_migration"} <= _tables(empty_dsn)
    _run([str(venv / "bin" / "notifyq"), "migrate", "--check"], cwd=elsewhere, env=env)
