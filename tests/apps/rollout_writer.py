"""The application of the key-rollout test (tests/chaos/test_key_rollout.py), run as its own
process (``python -m tests.apps.rollout_writer``) with its own keys, until SIGTERM.

In a loop, as a web application would: it writes a new encrypted row of ``vault_a`` (the id
range starts at ``ROLLOUT_WRITER_BASE``), rewrites a random earlier one, reads one back and
decrypts it, sends a webhook message to every endpoint, and every 25th turn creates an endpoint
(its secret is encrypted) at ``ROLLOUT_RECEIVER_URL``. Whatever fails is counted in SQL
(``rollout_failure``), never raised; every message sent is recorded (``rollout_sent``).
"""

from __future__ import annotations

import os
import random
import signal

import anyio
import psycopg

from notifyq import App
from notifyq._crypto.keyring import Keyring
from tests.vault import TABLE_A, TABLE_B

DDL = """
CREATE TABLE IF NOT EXISTS rollout_failure (id bigserial PRIMARY KEY, pid integer NOT NULL,
                                            step text NOT NULL, error text NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_sent (message_id text PRIMARY KEY, pid integer NOT NULL);
"""
PACE_S = 0.02
"""A turn every 20 ms (with the work itself, some 30 writes and 30 messages a second): a
steady load beside the rotation, not a benchmark."""
STEPS = ("endpoint", "write", "rewrite", "read", "send")
OLD_ROWS = 2000
"""The rows the test wrote before the writer started (ids 1..2000): rewritten and read."""


class Writer:
    def __init__(self) -> None:
        self.app = App()
        self.column = self.app.encrypted_column(TABLE_A, column="secret")
        self.app.encrypted_column(TABLE_B, column="token")
        self.base = int(os.environ["ROLLOUT_WRITER_BASE"])
        self.url = os.environ["ROLLOUT_RECEIVER_URL"]
        self.rng = random.Random(self.base)

    async def run(self, stop: anyio.Event) -> None:
        async with (await self.app.pool()).connection() as conn:
            await conn.execute(DDL)
        turn = 0
        while not stop.is_set():
            turn += 1
            for step in STEPS:
                if step == "endpoint" and turn % 25 != 1:
                    continue
                try:
                    await self.step(step, self.base + turn)
                except Exception as exc:
                    await self.failed(step, exc)
            await anyio.sleep(PACE_S)

    async def step(self, step: str, row_id: int) -> None:
        app, column = self.app, self.column
        async with (await app.pool()).connection() as conn:
            if step == "endpoint":
                await app.webhooks.create_endpoint(self.url, description=f"rollout {row_id}")
            elif step == "write":
                blob = (await self.keyring()).encrypt(b"app-%d" % row_id, column.context(row_id))
                await conn.execute("INSERT INTO vault_a (id, secret) VALUES (%s, %s)",
                                   (row_id, blob))
            elif step == "rewrite":
                target = self.rng.randint(1, OLD_ROWS)
                blob = (await self.keyring()).encrypt(b"rewritten-%d" % target,
                                                      column.context(target))
                await conn.execute("UPDATE vault_a SET secret = %s WHERE id = %s",
                                   (blob, target))
            elif step == "read":
                target = self.rng.randint(1, OLD_ROWS)
                cur = await conn.execute("SELECT secret FROM vault_a WHERE id = %s", (target,))
                row = await cur.fetchone()
                if row is not None:
                    (await self.keyring()).decrypt(bytes(row["secret"]), column.context(target))
            else:
                sent = await app.webhooks.send("rollout.tick", {"row": row_id})
                await conn.execute("INSERT INTO rollout_sent (message_id, pid) VALUES (%s, %s)",
                                   (sent.id, os.getpid()))

    async def keyring(self) -> Keyring:
        """The keyring, its check (when due) awaited here rather than run by its guard."""
        return await self.app._runtime.checked_keyring()

    async def failed(self, step: str, exc: Exception) -> None:
        try:
            async with (await self.app.pool()).connection() as conn:
                await conn.execute("INSERT INTO rollout_failure (pid, step, error) "
                                   "VALUES (%s, %s, %s)",
                                   (os.getpid(), step, f"{type(exc).__name__}: {exc}"[:500]))
        except psycopg.Error:
            pass


async def main() -> None:
    writer = Writer()
    stop = anyio.Event()
    async with writer.app, anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_sigterm, stop)
        await writer.run(stop)
        tg.cancel_scope.cancel()


async def _stop_on_sigterm(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop.set()
            return


if __name__ == "__main__":
    anyio.run(main)
