"""Key-rotation rate: ``secret.reencrypt`` over N rows (default 100,000) of one table.

    python bench/rotation.py [--rows 100000] [--batch-size 500] [--dsn ...]

Drops and recreates the scratch database ``notifyq_bench_rotation``, fills ``public.secrets``
(bigint pk, 64-byte secrets) under key version 1, then times the whole job (pass 1 plus the
verification pass) called directly, as a worker would, and checks every row is on version 2.
"""

from __future__ import annotations

import argparse
import os
import time

import anyio
import psycopg

from notifyq import App, Keyring
from notifyq._crypto.ciphertext import Context
from notifyq._db import migrate as migrations
from notifyq._keys.reencrypt import BatchHook, ReencryptOptions, Reencryptor
from notifyq._settings import Settings


def _reencryptor(app: App, on_batch: BatchHook | None = None) -> Reencryptor:
    """The App's ``secret.reencrypt`` handler, built apart so a test can hook its batches."""
    return Reencryptor(app._runtime, app.keys, app._columns, on_batch=on_batch)


DATABASE = "notifyq_bench_rotation"
K1, K2 = os.urandom(32), os.urandom(32)


def _setup(admin: str, rows: int) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    dsn = psycopg.conninfo.make_conninfo(admin, dbname=DATABASE)
    old = Keyring({1: K1}, active=1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE secrets (id bigint PRIMARY KEY, secret bytea)")
        with conn.cursor() as cur, cur.copy("COPY secrets (id, secret) FROM STDIN") as copy:
            for i in range(1, rows + 1):
                copy.write_row((i, old.encrypt(os.urandom(64),
                                               Context("public.secrets", "secret", str(i)))))
        conn.execute("VACUUM ANALYZE secrets")
    return dsn


async def _rotate(dsn: str, batch_size: int) -> tuple[float, dict[str, object]]:
    import base64

    keys = ",".join(f"{v}:{base64.b64encode(k).decode()}" for v, k in ((1, K1), (2, K2)))
    app = App(settings=Settings(database_url=dsn, keys=keys,  # type: ignore[arg-type]
                                active_key_version=2))
    app.encrypted_column("public.secrets", pk="id", column="secret")
    async with app:
        async with (await app.pool()).connection() as conn:
            await migrations.migrate(conn, "notifyq")
            run, _ = await app.keys.rotate(conn, batch_size=batch_size)
        started = time.perf_counter()
        out = await _reencryptor(app).rotate(run.id, ReencryptOptions(target_version=2,
                                                                     batch_size=batch_size))
        return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--dsn", default=os.environ.get(
        "NOTIFYQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    dsn = _setup(args.dsn, args.rows)
    try:
        elapsed, out = anyio.run(_rotate, dsn, args.batch_size)
        with psycopg.connect(dsn) as conn:
            left = conn.execute("SELECT count(*) FROM secrets "
                                "WHERE notifyq.key_version_of(secret) <> 2").fetchone()
        assert left == (0,), left
        print(f"rotated {args.rows} rows (batch {args.batch_size}) in {elapsed:.2f} s: "
              f"{args.rows / elapsed:,.0f} rows/s; {out['columns']}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    main()
