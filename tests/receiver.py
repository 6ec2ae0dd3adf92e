"""A real HTTP/1.1 receiver on 127.0.0.1 for the webhook tests, on its own thread and event loop
(so async tests, sync tests and worker processes can all reach it).

Each path answers from a script of :class:`Reply` values (then 200 "ok"): any status and
headers, a delay, a body dripped one byte at a time, a huge or gzip body, a reset connection,
and an ``on_request`` hook (e.g. SIGKILL a worker). Every request is kept raw (headers and body
bytes exactly as received) for Standard Webhooks verification.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drip_s: float | None = None
    """Send the body one byte per this many seconds (Content-Length announced up front)."""
    reset: bool = False
    """Close the connection with a TCP RST instead of answering."""
    gzip: bool = False
    on_request: Callable[[], None] | None = None


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int


class Receiver:
    """``tls``: serve HTTPS with this server context (requests reach the handler only after
    a completed handshake)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.requests: list[Received] = []
        self.scripts: dict[str, list[Reply]] = {}
        self.connections = 0
        self.busy = 0
        """Requests being answered now (read, the answer not yet started)."""
        self.most_busy = 0
        """The most requests that were being answered at once."""
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receiver", daemon=True)
        self._lock = threading.Lock()

    # -- control --------------------------------------------------------------------------

    def start(self) -> Receiver:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("receiver did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, path: str = "/hook") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self.scripts[path] = list(replies)

    def at(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # -- server ---------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0,
                                                      ssl=self.tls)
            self.port = self._server.sockets[0].getsockname()[1]

        loop.run_until_complete(start())
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            assert self._server is not None
            self._server.close()
            tasks = list(asyncio.all_tasks(loop))
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    def _next(self, path: str) -> Reply:
        with self._lock:
            queue = self.scripts.get(path)
            return queue.pop(0) if queue else Reply()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
            number = self.connections
        try:
            while True:
                request = await _read_request(reader, number)
                if request is None:
                    return
                reply = self._next(request.path)
                with self._lock:
                    self.requests.append(request)
                    self.busy += 1
                    self.most_busy = max(self.most_busy, self.busy)
                try:
                    if reply.on_request is not None:
                        reply.on_request()
                    if reply.delay_s:
                        await asyncio.sleep(reply.delay_s)
                finally:
                    with self._lock:  # before the answer goes: its client may then send more
                        self.busy -= 1
                if reply.reset:
                    _reset(writer)
                    return
                await _write_reply(writer, reply)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            if not writer.is_closing():
                writer.close()


async def _read_request(reader: asyncio.StreamReader, number: int) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return Received(method, path, headers, body, number)


async def _write_reply(writer: asyncio.StreamWriter, reply: Reply) -> None:
    body = gzip.compress(reply.body) if reply.gzip else reply.body
    headers = {"content-length": str(len(body)), **reply.headers}
    if reply.gzip:
        headers["content-encoding"] = "gzip"
    head = f"HTTP/1.1 {reply.status} X\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    writer.write(head.encode("latin-1"))
    if reply.drip_s is None:
        writer.write(body)
        await writer.drain()
        return
    await writer.drain()
    for i in range(len(body)):
        writer.write(body[i:i + 1])
        await writer.drain()
        await asyncio.sleep(reply.drip_s)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock: Any = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Listener:
    """A bare TCP listener on 127.0.0.1 that only counts the connections made to it (a
    stand-in proxy that must never be used)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


class BlackHole:
    """A TCP listener on 127.0.0.1 that accepts every connection, reads what is sent and never
    answers: the endpoint that holds a delivery until its timeout. Counts the connections
    accepted, those open now and the most open at once."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.open = 0
        self.max_open = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="black-hole", daemon=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _run(self) -> None:
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(0.05):
                    if key.fileobj is self.sock:
                        try:
                            conn, _ = self.sock.accept()
                        except OSError:
                            continue
                        conn.setblocking(False)
                        selector.register(conn, selectors.EVENT_READ)
                        self.accepted += 1
                        self.open += 1
                        self.max_open = max(self.max_open, self.open)
                        continue
                    conn = key.fileobj  # type: ignore[assignment]
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        data = b""
                    if not data:  # the client gave up: forget the connection
                        selector.unregister(conn)
                        conn.close()
                        self.open -= 1
            for key in list(selector.get_map().values()):
                if key.fileobj is not self.sock:
                    key.fileobj.close()  # type: ignore[union-attr]

    def __enter__(self) -> BlackHole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
