"""The cost of each ``webhooks.transport``: POSTs per second and client CPU per POST.

    python bench/webhook_transports.py [--requests 3000] [--concurrency 1,20] [--rounds 3]

No database: :class:`~notifyq._webhooks.client.WebhookClient` (what a delivery calls, SSRF guard
and body cap included) POSTs a 300-byte signed-looking body to a bare asyncio HTTP/1.1 receiver
on 127.0.0.1 in another process (keep-alive, 200 at once). The transports take turns, round
after round, so a noisy neighbour hurts both alike; CPU is this process's own
(``time.process_time``), which a busy machine disturbs less than wall time. The best round of
each is printed (the least disturbed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Literal

import anyio

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
Kind = Literal["notifyq", "httpx"]
HEADERS = {"content-type": "application/json", "webhook-id": "msg_2bTf0W7yQ9",
           "webhook-timestamp": "1764576000",
           "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="}
BODY = b'{"type":"order.paid","data":{"id":"ord_1","amount":1250,"note":"' + b"x" * 220 + b'"}}'


async def one_round(kind: Kind, port: int, requests: int, concurrency: int) -> tuple[float,
                                                                                      float]:
    client = WebhookClient(WebhookSettings(transport=kind, allowed_networks=["127.0.0.0/8"],
                                           max_connections=concurrency))
    url = f"http://127.0.0.1:{port}/hook"
    left = requests

    async def sender() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            result = await client.post(url, HEADERS, BODY)
            assert result.status_code == 200, result

    await client.post(url, HEADERS, BODY)  # connect and warm up outside the measurement
    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(sender)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await client.aclose()
    return requests / wall, cpu / requests * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,20")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                                text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            best: dict[Kind, tuple[float, float]] = {}
            for _ in range(args.rounds):
                for kind in ("notifyq", "httpx"):
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
