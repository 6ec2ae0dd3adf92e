"""The webhook transport's HTTP/1.1 against real sockets on 127.0.0.1: body framings,
informational answers, keep-alive and its races, the connection limit, and malformed answers.

Each test runs a raw asyncio server whose handler writes exactly the bytes under test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from notifyq._webhooks.ssrf import Guard
from notifyq._webhooks.transport import GuardedTransport

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server", int],
                   Awaitable[None]]


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


async def read_request(reader: asyncio.StreamReader, server: Server) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    request = head + await reader.readexactly(length)
    server.requests.append(request)
    return request


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            await handler(reader, writer, server, server.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()


def answering(*responses: bytes, then_close: bool = False) -> Handler:
    """Answer each request on a connection with the next of ``responses`` (the last repeats)."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      server: Server, number: int) -> None:
        served = 0
        while await read_request(reader, server) is not None:
            writer.write(responses[min(served, len(responses) - 1)])
            await writer.drain()
            served += 1
            if then_close:
                return
    return handler


def client(max_connections: int = 100) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=GuardedTransport(Guard(["127.0.0.0/8"]),
                                                        max_connections=max_connections))


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def test_a_chunked_body_is_decoded_and_the_connection_is_reused() -> None:
    chunked = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\ntrailer: x\r\n\r\n")
    async with serving(answering(chunked)) as server, client() as http:
        bodies = [(await http.post(server.url(), content=b"{}")).content for _ in range(3)]
    assert bodies == [b"hello world"] * 3
    assert server.connections == 1


async def test_informational_answers_are_skipped_for_the_final_one() -> None:
    answer = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
              + OK)
    async with serving(answering(answer)) as server, client() as http:
        response = await http.post(server.url(), content=b"{}")
    assert (response.status_code, response.content) == (200, b"ok")


async def test_connection_close_and_http_1_0_are_not_reused() -> None:
    close = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
    async with serving(answering(close)) as server, client() as http:
        for _ in range(2):
            assert (await http.post(server.url(), content=b"{}")).content == b"ok"
    assert server.connections == 2

    until_eof = b"HTTP/1.0 202 Accepted\r\n\r\nread to the end"
    async with serving(answering(until_eof, then_close=True)) as server, client() as http:
        for _ in range(2):
            response = await http.post(server.url(), content=b"{}")
            assert (response.status_code, response.content) == (202, b"read to the end")
    assert server.connections == 2


async def test_a_request_lost_on_a_reused_connection_is_sent_once_more_on_a_new_one() -> None:
    async def closes_on_second_request(reader: asyncio.StreamReader,
                                       writer: asyncio.StreamWriter, server: Server,
                                       number: int) -> None:
        served = 0
        while await read_request(reader, server) is not None:
            if number == 1 and served == 1:
                return  # the keep-alive race: closed just as the request arrived
            writer.write(OK)
            await writer.drain()
            served += 1

    async with serving(closes_on_second_request) as server, client() as http:
        first = await http.post(server.url(), content=b'{"n":1}')
        second = await http.post(server.url(), content=b'{"n":2}')
    assert (first.status_code, second.status_code) == (200, 200)
    assert server.connections == 2
    assert [r.endswith(b'{"n":2}') for r in server.requests] == [False, True, True]


async def test_a_new_connection_closed_without_an_answer_is_an_error_not_a_resend() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       server: Server, number: int) -> None:
        await read_request(reader, server)

    async with serving(hangs_up) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a complete"):
            await http.post(server.url(), content=b"{}")
    assert len(server.requests) == 1


async def test_malformed_answers_are_protocol_errors() -> None:
    answers = [b"SMTP ready\r\n\r\n",
               b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n",
               b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
               b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n",
               b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"]
    for answer in answers:
        async with serving(answering(answer)) as server, client() as http:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.post(server.url(), content=b"{}")  # reads the body too


async def test_a_body_cut_short_is_an_error() -> None:
    short = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"
    async with serving(answering(short, then_close=True)) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError, match="7 bytes before the end"):
            await http.post(server.url(), content=b"{}")


async def test_the_connection_limit_holds_across_destinations() -> None:
    async with serving(answering(OK)) as a, serving(answering(OK)) as b, client(1) as http:
        # A's idle connection is closed to make room for B, then A needs a new one.
        for server in (a, b, a):
            assert (await http.post(server.url(), content=b"{}")).status_code == 200
        assert (a.connections, b.connections) == (2, 1)
        # Concurrent requests to one destination wait for the single connection.
        responses = await asyncio.gather(*(http.post(a.url(), content=b"{}")
                                           for _ in range(5)))
    assert [r.status_code for r in responses] == [200] * 5
    assert a.connections == 2


async def test_header_values_cannot_inject_lines() -> None:
    async with serving(answering(OK)) as server, client() as http:
        with pytest.raises(httpx.LocalProtocolError, match="line break"):
            await http.post(server.url(), content=b"{}",
                            headers={"x-team": "a\r\nx-evil: 1"})
    assert server.requests == []
