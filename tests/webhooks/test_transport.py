"""The webhook transport (aiohttp under httpx's interface) against real sockets on 127.0.0.1:
body framings, informational answers, keep-alive and its races, the connection limit, and
malformed answers. What notifyq adds to aiohttp's pool (no reuse of a connection that received
unrequested bytes, a cap on 1xx answers, the limit across destinations, one resend on a stale
connection) is held here, so an aiohttp upgrade that changes its internals fails loudly.

Each test runs a raw asyncio server whose handler writes exactly the bytes under test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
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


async def test_a_request_lost_on_a_reused_connection_is_sent_once_more() -> None:
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
        with pytest.raises(httpx.RemoteProtocolError,
                           match=r"without sending a (complete )?response"):
            await http.post(server.url(), content=b"{}")
    assert len(server.requests) == 1


async def test_malformed_answers_are_protocol_errors() -> None:
    answers = [b"SMTP ready\r\n\r\n",
               b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
               b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 300_000 + b"\r\n\r\n",
               b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"]
    for answer in answers:
        async with serving(answering(answer)) as server, client() as http:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.post(server.url(), content=b"{}")  # reads the body too


async def test_a_body_cut_short_is_an_error() -> None:
    short = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"
    async with serving(answering(short, then_close=True)) as server, client() as http:
        with pytest.raises(httpx.TransportError, match=r"received 3 of 10 bytes"):
            await http.post(server.url(), content=b"{}")


async def test_endless_informational_answers_are_a_protocol_error_not_a_busy_loop() -> None:
    async def floods(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     server: Server, number: int) -> None:
        await read_request(reader, server)
        while True:  # until the client hangs up
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)
            await writer.drain()

    async with serving(floods) as server, client() as http:
        with anyio.fail_after(5), pytest.raises(httpx.RemoteProtocolError,
                                                match=r"more than 10 informational"):
            await http.post(server.url(), content=b"{}")
    assert server.connections == 1


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
        with pytest.raises(httpx.LocalProtocolError, match=r"control character"):
            await http.post(server.url(), content=b"{}",
                            headers={"x-team": "a\r\nx-evil: 1"})
    assert server.requests == []


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"chunked, chunked", b"chunked"])
@pytest.mark.parametrize("size_line", [b"3", b"3 ;x", b"3;ext=1"])
async def test_chunked_framing_ends_where_the_last_chunk_does(coding: bytes,
                                                              size_line: bytes) -> None:
    """Transfer codings and chunk lines llhttp accepts (RFC 9112 allows whitespace before a
    chunk extension; a coding list ending in chunked is chunked): whatever it accepts, each
    request gets its own answer on the reused connection, never bytes of another."""
    answer = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: " + coding + b"\r\n\r\n" + size_line
              + b"\r\nabc\r\n0\r\n\r\n")
    async with serving(answering(answer, OK)) as server, client() as http:
        first = await http.post(server.url(), content=b"{}")
        second = await http.post(server.url(), content=b"{}")
    assert (first.content, second.content, server.connections) == (b"abc", b"ok", 1)


async def test_a_response_framed_by_neither_length_nor_chunked_lasts_until_the_close() -> None:
    for coding in (b"xchunked", b"chunked, gzip"):
        answer = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: " + coding + b"\r\n\r\n"
                  b"3\r\nabc\r\n0\r\n\r\n")
        async with serving(answering(answer, then_close=True)) as server, client() as http:
            for _ in range(2):
                response = await http.post(server.url(), content=b"{}")
                assert response.content == b"3\r\nabc\r\n0\r\n\r\n"
        assert server.connections == 2


async def test_a_head_with_bare_line_feeds_is_read_at_once() -> None:
    answer = b"HTTP/1.1 200 OK\ncontent-length: 2\nx-a: b\n\nok"
    async with serving(answering(answer)) as server, client() as http:
        with anyio.fail_after(2):  # it used to wait for a CRLF CRLF that never came
            response = await http.post(server.url(), content=b"{}")
            again = await http.post(server.url(), content=b"{}")
    assert (response.status_code, response.content, response.headers["x-a"]) == (200, b"ok", "b")
    assert again.content == b"ok"
    assert server.connections == 1


async def test_bytes_sent_after_a_response_never_answer_the_next_request(
        ) -> None:
    forged = b"HTTP/1.1 201 Forged\r\ncontent-length: 6\r\n\r\nforged"
    async with serving(answering(OK + forged)) as server, client() as http:
        first = await http.post(server.url(), content=b"{}")
        second = await http.post(server.url(), content=b"{}")
    assert [(r.status_code, r.content) for r in (first, second)] == [(200, b"ok")] * 2
    assert server.connections == 2


async def test_bytes_that_arrive_while_a_connection_is_idle_never_answer_the_next_request(
        ) -> None:
    forged = b"HTTP/1.1 201 Forged\r\ncontent-length: 6\r\n\r\nforged"
    idle_write = anyio.Event()

    async def answers_then_speaks_up(reader: asyncio.StreamReader,
                                     writer: asyncio.StreamWriter, server: Server,
                                     number: int) -> None:
        while await read_request(reader, server) is not None:
            writer.write(OK)
            await writer.drain()
            if number == 1:
                await asyncio.sleep(0.05)  # the client has put the connection back by now
                writer.write(forged)  # an answer to no request, while it is idle
                await writer.drain()
                idle_write.set()

    async with serving(answers_then_speaks_up) as server, client() as http:
        first = await http.post(server.url(), content=b"{}")
        with anyio.fail_after(5):
            await idle_write.wait()
        await anyio.sleep(0.05)  # the forged bytes have reached the client's socket
        second = await http.post(server.url(), content=b"{}")
    assert [(r.status_code, r.content) for r in (first, second)] == [(200, b"ok")] * 2
    assert server.connections == 2  # the connection that spoke up was not reused
