"""Key-rotation rate: ``secret.reencrypt`` over N rows (default 100,000) of one table, with or
without a rate limit.

    python bench/rotation.py [--rows 100000] [--batch-size 500] [--rate R] [--dsn ...]
    python bench/rotation.py --quick      # seconds: 5,000 rows unthrottled, then at 2,000/s

Drops and recreates the scratch database ``notifyq_bench_rotation``, fills ``public.secrets``
(bigint pk, 64-byte secrets) under key version 1, then times the whole job (pass 1 plus the
verification pass) called directly, as a worker would, and checks every row is on version 2.
``--rate`` sets the rotation's limit (rows per second) as ``notifyq keys rotate --rate`` does.
Exits 1 when a row is left behind or a throttled run went more than 10 % over its limit (what
``--quick`` checks in CI).
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# This checkout's notifyq, whatever else is installed (an older notifyq on the path is how
# this script once failed with a TypeError after a refactor).
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import psycopg  # noqa: E402

from notifyq import App, Keyring  # noqa: E402
from notifyq._crypto.ciphertext import Context  # noqa: E402
from notifyq._db import migrate as migrations  # noqa: E402
from notifyq._keys.reencrypt import ReencryptOptions, Reencryptor  # noqa: E402
from notifyq._settings import Settings  # noqa: E402

DATABASE = "notifyq_bench_rotation"
K1, K2 = os.urandom(32), os.urandom(32)
QUICK_ROWS = 5_000
QUICK_RATE = 2_000.0
OVER_LIMIT = 1.10


@dataclass(frozen=True)
class Result:
    rows: int
    rate_limit: float | None
    elapsed_s: float
    left: int

    @property
    def rate(self) -> float:
        return self.rows / self.elapsed_s

    def line(self, batch_size: int) -> str:
        limit = f"limit {self.rate_limit:,.0f} rows/s" if self.rate_limit else "no limit"
        return (f"rotated {self.rows:,} rows (batch {batch_size}, {limit}) in "
                f"{self.elapsed_s:.2f} s: {self.rate:,.0f} rows/s")

    def ok(self) -> bool:
        return self.left == 0 and (not self.rate_limit
                                   or self.rate <= self.rate_limit * OVER_LIMIT)


def _setup(admin: str, database: str, rows: int) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    dsn = psycopg.conninfo.make_conninfo(admin, dbname=database)
    old = Keyring({1: K1}, active=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE secrets (id bigint PRIMARY KEY, secret bytea)")
        with conn.cursor() as cur, cur.copy("COPY secrets (id, secret) FROM STDIN") as copy:
            for i in range(1, rows + 1):
                copy.write_row((i, old.encrypt(os.urandom(64),
                                               Context("public.secrets", "secret", str(i)))))
        conn.execute("VACUUM ANALYZE secrets")
    return dsn


async def _rotate(dsn: str, batch_size: int, rate: float | None) -> float:
    keys = ",".join(f"{v}:{base64.b64encode(k).decode()}" for v, k in ((1, K1), (2, K2)))
    app = App(settings=Settings(database_url=dsn, keys=keys,  # type: ignore[arg-type]
                                active_key_version=2, log_level="WARNING"))
    app.encrypted_column("public.secrets", pk="id", column="secret")
    async with app:
        async with (await app.pool()).connection() as conn:
            await migrations.migrate(conn, "notifyq")
            run, _ = await app.keys.rotate(conn, batch_size=batch_size, rate_per_s=rate)
        started = time.perf_counter()
        await Reencryptor(app._runtime, app.keys).rotate(
            run.id, ReencryptOptions(target_version=2, batch_size=batch_size))
        return time.perf_counter() - started


def measure(admin: str, database: str, rows: int, batch_size: int,
            rate: float | None) -> Result:
    dsn = _setup(admin, database, rows)
    try:
        elapsed = anyio.run(_rotate, dsn, batch_size, rate)
        with psycopg.connect(dsn) as conn:
            left = conn.execute("SELECT count(*) FROM secrets "
                                "WHERE notifyq.key_version_of(secret) <> 2").fetchone()
        return Result(rows, rate, elapsed, int(left[0]) if left else -1)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rate", type=float, help="rows per second at most (default: none)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ROWS:,} rows without a limit, then at "
                             f"{QUICK_RATE:,.0f} rows/s (a few seconds)")
    parser.add_argument("--database", default=DATABASE,
                        help=f"the scratch database, dropped and made again ({DATABASE})")
    parser.add_argument("--dsn", default=os.environ.get(
        "NOTIFYQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    runs = ([(QUICK_ROWS, None), (QUICK_ROWS, QUICK_RATE)] if args.quick
            else [(args.rows, args.rate)])
    ok = True
    for rows, rate in runs:
        result = measure(args.dsn, args.database, rows, args.batch_size, rate)
        print(result.line(args.batch_size), flush=True)
        if not result.ok():
            print(f"FAILED: {result.left} rows left on another version, or over the limit",
                  file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
