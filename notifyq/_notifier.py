"""LISTEN/NOTIFY: the wake-up hints between enqueuers and workers.

The channel is the schema name. Payloads are ``j:<pool>`` (runnable work in a pool),
``c:<run id>`` (cancel a running run) and ``d:<run id>`` (an awaited run is finished: sent
by migration 0011's trigger, read by :class:`~notifyq._awaiter.Awaiter`). A notification is
only a hint: workers also poll, so a lost one delays work by at most one poll interval and
never loses it.

:class:`Notifier` keeps one dedicated LISTEN connection per process, reconnecting with backoff
and re-LISTENing; after every (re)connect it tells its subscribers, which then look at the table
since they may have missed notifications meanwhile.

Enqueuers send ``j:<pool>`` through :class:`~notifyq._enqueue.wake.WakeSender`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import anyio
import psycopg
from anyio.abc import TaskStatus

from notifyq._db.pool import AsyncConn, connect
from notifyq._db.queries import Queries

log = logging.getLogger("notifyq.notifier")

Subscriber = Callable[[str], None]


def wake_payload(pool: str) -> str:
    return f"j:{pool}"


def cancel_payload(run_id: object) -> str:
    return f"c:{run_id}"


class Notifier:
    """Owns the LISTEN connection and fans notifications out to subscribers.

    Subscribers are plain callbacks (they set events); ``on_connect`` callbacks run after each
    successful (re)LISTEN.
    """

    def __init__(self, dsn: str, queries: Queries, *, ping_interval_s: float = 5.0,
                 ping_timeout_s: float = 5.0, max_backoff_s: float = 5.0) -> None:
        self._dsn = dsn
        self._q = queries
        self._ping_interval_s = ping_interval_s
        self._ping_timeout_s = ping_timeout_s
        self._max_backoff_s = max_backoff_s
        self._subscribers: list[Subscriber] = []
        self._on_connect: list[Callable[[], None]] = []
        self.connected = False
        self.reconnects = 0

    def subscribe(self, callback: Subscriber) -> None:
        self._subscribers.append(callback)

    def on_connect(self, callback: Callable[[], None]) -> None:
        self._on_connect.append(callback)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports started after the first connect attempt."""
        backoff = 0.05
        started = False
        while True:
            try:
                conn = await connect(self._dsn, application_name="notifyq-listener")
            except psycopg.Error as exc:
                log.warning("listener cannot connect (%s); polling meanwhile", type(exc).__name__)
                conn = None
            if conn is not None:
                try:
                    async with conn:
                        await conn.execute(self._q.notifier_listen)
                        self._connected(started)
                        if not started:
                            task_status.started()
                            started = True
                        backoff = 0.05
                        await self._pump(conn)
                except (psycopg.Error, TimeoutError) as exc:
                    log.warning("listener connection lost (%s); reconnecting", type(exc).__name__)
                finally:
                    self.connected = False
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(backoff * random.uniform(0.5, 1.0))  # noqa: S311
            backoff = min(backoff * 2, self._max_backoff_s)

    def _connected(self, reconnect: bool) -> None:
        self.connected = True
        if reconnect:
            self.reconnects += 1
            log.info("listener reconnected")
        for callback in self._on_connect:
            callback()

    async def _pump(self, conn: AsyncConn) -> None:
        while True:
            async for note in conn.notifies(timeout=self._ping_interval_s):
                for callback in self._subscribers:
                    callback(note.payload)
            # No traffic for a while: make sure the connection is still alive. A half-open
            # connection (server gone without a FIN, or frozen) never answers: without the
            # timeout the listener would wait here forever and wake-ups would silently stop.
            with anyio.fail_after(self._ping_timeout_s):
                await conn.execute(self._q.notifier_ping)
