"""``bench/rotation.py --quick``, the rotation benchmark's smoke run, as CI runs it: it once
broke unnoticed (a TypeError after a refactor)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

from tests.conftest import ADMIN_DSN
from tests.support import ROOT


def test_the_rotation_benchmarks_quick_run_rotates_every_row_and_keeps_to_its_limit() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NOTIFYQ_KEYS")}
    result = subprocess.run([sys.executable, "bench/rotation.py", "--quick", "--dsn", ADMIN_DSN,
                             "--database", f"nq_bench_{uuid.uuid4().hex[:12]}"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=100,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [re.sub(r"[\d.,]+ s: [\d,]+ rows/s", "T", line) for line in lines] == [
        "rotated 5,000 rows (batch 500, no limit) in T",
        "rotated 5,000 rows (batch 500, limit 2,000 rows/s) in T"]
