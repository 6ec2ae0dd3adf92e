"""A fast webhook receiver for bench/webhooks.py: HTTP/1.1 on 127.0.0.1, keep-alive, 200 at once.

    python bench/webhook_receiver.py [--tls CERT KEY]

Prints its port, then one line per request: ``<path> <webhook-id> <arrival>`` (arrival on
CLOCK_MONOTONIC, which every process of the machine shares). Reads lines on stdin:
``secret <path> <whsec_...>`` registers an endpoint's secret; from then on every tenth request
to that path has its Standard Webhooks signature checked (HMAC-SHA256 over
``id.timestamp.body``), and a request whose signature matches none of the header's ``v1,``
entries prints ``bad <path> <webhook-id>``. Standard library only, so either system's
interpreter could run it; the bench runs it with its own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import ssl
import sys
import time

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
CHECK_EVERY = 10


class Receiver:
    def __init__(self) -> None:
        self.secrets: dict[bytes, bytes] = {}
        self.seen = 0
        self.out = sys.stdout

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrival = time.monotonic()
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1]
                fields: dict[bytes, bytes] = {}
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    fields[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(fields.get(b"content-length", b"0")))
                writer.write(OK)
                msg = fields.get(b"webhook-id", b"-")
                self.out.write(f"{path.decode()} {msg.decode()} {arrival}\n")
                self.seen += 1
                if self.seen % CHECK_EVERY == 0 and path in self.secrets and not self._valid(
                        self.secrets[path], msg, fields, body):
                    self.out.write(f"bad {path.decode()} {msg.decode()}\n")
                self.out.flush()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.close()

    @staticmethod
    def _valid(key: bytes, msg: bytes, fields: dict[bytes, bytes], body: bytes) -> bool:
        signed = msg + b"." + fields.get(b"webhook-timestamp", b"") + b"." + body
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
        return any(part.startswith(b"v1,") and hmac.compare_digest(part[3:], expected)
                   for part in fields.get(b"webhook-signature", b"").split(b" "))

    async def commands(self) -> None:
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            words = line.split()
            if len(words) == 3 and words[0] == "secret":
                secret = words[2].removeprefix("whsec_")
                self.secrets[words[1].encode()] = base64.b64decode(secret)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = parser.parse_args()
    context = None
    if args.tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*args.tls)
    receiver = Receiver()
    server = await asyncio.start_server(receiver.serve, "127.0.0.1", 0, backlog=1024,
                                        ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    await receiver.commands()  # until stdin closes


if __name__ == "__main__":
    asyncio.run(main())
