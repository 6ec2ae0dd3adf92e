"""What one webhook POST costs the client: the delivery engine against the candidates.

    python bench/webhook_transports.py [--requests 3000] [--concurrency 1,20] [--rounds 3]
    python bench/webhook_transports.py --quick      # a smoke run (CI)

No database: each candidate POSTs a 300-byte signed-looking body to a bare asyncio HTTP/1.1
receiver on 127.0.0.1 in another process (keep-alive, 200 at once):

- ``notifyq``: :class:`~notifyq._webhooks.client.WebhookClient`, what a delivery calls (aiohttp
  under httpx's interface through httpx-aiohttp, SSRF guard and body cap included);
- ``aiohttp``: a bare ``aiohttp.ClientSession``, the engine alone (what the adapter and the
  guard cost on top of it);
- ``httpx``: ``httpx.AsyncClient`` with its own transport (httpcore and h11), as its docs show.

They take turns, round after round, so a noisy neighbour hurts all alike; CPU is this process's
own (``time.process_time``), which a busy machine disturbs less than wall time. The best round
of each is printed (the least disturbed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import aiohttp
import anyio
import httpx

from notifyq._settings import WebhookSettings
from notifyq._webhooks.client import WebhookClient

RECEIVER = r'''
import asyncio
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    await reader.readexactly(int(line.split(b":", 1)[1]))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
'''
Kind = Literal["notifyq", "aiohttp", "httpx"]
KINDS: tuple[Kind, ...] = ("notifyq", "aiohttp", "httpx")
HEADERS = {"content-type": "application/json", "webhook-id": "msg_2bTf0W7yQ9",
           "webhook-timestamp": "1764576000",
           "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="}
BODY = b'{"type":"order.paid","data":{"id":"ord_1","amount":1250,"note":"' + b"x" * 220 + b'"}}'
Post = Callable[[], Awaitable[int]]
Close = Callable[[], Awaitable[None]]


def candidate(kind: Kind, url: str, concurrency: int) -> tuple[Post, Close]:
    """(one POST, returning its status; close)."""
    if kind == "notifyq":
        client = WebhookClient(WebhookSettings(allowed_networks=["127.0.0.0/8"],
                                               max_connections=concurrency))

        async def notifyq_post() -> int:
            return (await client.post(url, HEADERS, BODY)).status_code or 0
        return notifyq_post, client.aclose
    if kind == "aiohttp":
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

        async def aiohttp_post() -> int:
            async with session.post(url, headers=HEADERS, data=BODY) as response:
                await response.read()
                return response.status
        return aiohttp_post, session.close
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency))

    async def httpx_post() -> int:
        return (await http.post(url, headers=HEADERS, content=BODY)).status_code
    return httpx_post, http.aclose


async def one_round(kind: Kind, port: int, requests: int, concurrency: int) -> tuple[float,
                                                                                      float]:
    post, close = candidate(kind, f"http://127.0.0.1:{port}/hook", concurrency)
    left = requests

    async def sender() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            status = await post()
            assert status == 200, status

    await post()  # connect and warm up outside the measurement
    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(sender)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await close()
    return requests / wall, cpu / requests * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,20")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="300 requests, one round")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 300, 1
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                                text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            best: dict[Kind, tuple[float, float]] = {}
            for _ in range(args.rounds):
                for kind in KINDS:
                    rate, cpu = anyio.run(one_round, kind, port, args.requests, concurrency)
                    if kind not in best or rate > best[kind][0]:
                        best[kind] = (rate, cpu)
            for kind, (rate, cpu) in best.items():
                print(f"{kind:>7}, concurrency {concurrency:>3}: {rate:7.0f} POSTs/s, "
                      f"{cpu:5.0f} us CPU per POST (client)")
    finally:
        receiver.terminate()
        receiver.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
