"""The webhook transport's response parser (notifyq/_webhooks/http11.py) against h11 as the
oracle: for generated responses — well-formed ones, ones built from the framing cases that
parsers disagree on, and mutations of both — notifyq's parser accepts exactly what h11
accepts and reads the same status, headers, body and keep-alive, wherever the reads split.

The deliberate differences, asserted as such: a status line of another major version than 1
(h11 reads ``HTTP/2.0`` as newer than 1.1), and ``Transfer-Encoding`` with ``Content-Length``
closes the connection (h11 would reuse it). Where a body ends with the connection, h11 still
says DONE; the connection is gone either way."""

from __future__ import annotations

import re
from dataclasses import dataclass

import h11
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from notifyq._webhooks.http11 import Parsed, parse_response


@dataclass(frozen=True)
class Refused:
    pass


def h11_reads(data: bytes) -> Parsed | Refused:
    """What httpx's own stack makes of ``data`` as the answer to a POST, then EOF."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"),
                                                              ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    response: h11.Response | None = None
    body = bytearray()
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return Parsed(response.status_code, response.headers.raw_items(), bytes(body),
                              conn.their_state is h11.DONE)
            elif isinstance(event, h11.InformationalResponse):
                continue
            else:  # ConnectionClosed, NEED_DATA, PAUSED: no complete response
                return Refused()
    except h11.RemoteProtocolError:
        return Refused()


def notifyq_reads(data: bytes, pieces: list[int] | None = None) -> Parsed | Refused:
    try:
        return parse_response(data, pieces=pieces)
    except httpx.RemoteProtocolError:
        return Refused()


_OTHER_MAJOR = re.compile(rb"(?:^|\n)HTTP/[02-9]\.")


def agree(data: bytes, pieces: list[int] | None = None) -> None:
    ours, oracle = notifyq_reads(data, pieces), h11_reads(data)
    if isinstance(oracle, Parsed) and isinstance(ours, Refused) and _OTHER_MAJOR.search(
            data):
        return  # another major version: refused on purpose
    if isinstance(ours, Parsed) and isinstance(oracle, Parsed):
        # h11 stays DONE after a body that ended with the connection; it cannot be reused.
        names = {n.lower() for n, _ in oracle.headers}
        both = {b"transfer-encoding", b"content-length"} <= names
        delimited = oracle.status in (204, 304) or bool(
            names & {b"transfer-encoding", b"content-length"})
        expected = Parsed(oracle.status, oracle.headers, oracle.body,
                          oracle.keep_alive and delimited and not both)
        assert ours == expected, data
        return
    assert type(ours) is type(oracle), (data, ours, oracle)


# -- generation: the parts of a response where framing goes wrong ---------------------------

EOL = st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r", b"\n\r", b""])
STATUS_LINE = st.builds(
    lambda version, code, reason: version + b" " + code + reason,
    st.sampled_from([b"HTTP/1.1"] * 6 + [b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"HTTP/1.10",
                                         b"http/1.1", b"HTTP/1", b"HTTP/1.1 "]),
    st.sampled_from([b"200"] * 5 + [b"204", b"304", b"404", b"099", b"999", b"2000", b"20",
                                    b"abc", b"101", b"+20"]),
    st.sampled_from([b" OK", b"", b" ", b" Not\tFound", b" \x01x", b" a\x00b", b" \xff",
                     b" a\rb"]))
LENGTHS = [b"3", b"03", b"3, 3", b"3,3", b"3, 4", b"+3", b"0x3", b"3 ", b" 3", b"", b"-1",
           b"1_1", b"3,", b"99999999999999999999999", b"0"]
CODINGS = [b"chunked", b"Chunked", b"xchunked", b"chunked, chunked", b"gzip, chunked",
           b" chunked", b"chunked ", b"chunked;q=1", b"identity", b""]
CONNECTION = [b"close", b"keep-alive", b"Close", b"upgrade, close", b"closed", b""]
NAMES = [b"content-length", b"Content-Length", b"transfer-encoding", b"Transfer-Encoding",
         b"connection", b"x-a", b"content-length ", b" content-length", b"x a", b"x\x00",
         b"", b"x-\xff"]
HEADER = st.one_of(
    st.tuples(st.just(b"Content-Length"), st.sampled_from(LENGTHS)),
    st.tuples(st.just(b"Transfer-Encoding"), st.sampled_from(CODINGS)),
    st.tuples(st.just(b"Connection"), st.sampled_from(CONNECTION)),
    st.tuples(st.sampled_from(NAMES),
              st.binary(max_size=8) | st.sampled_from([b"v", b" v ", b"a b", b"\tv"])),
).map(lambda pair: pair[0] + b":" + (b" " if pair[1][:1] not in (b" ", b"\t") else b"")
      + pair[1])
FOLD = st.sampled_from([b" folded", b"\tfolded", b"  "])
CHUNK_SIZE = st.sampled_from([b"{n:x}", b"{n:X}", b"0{n:x}", b"0x{n:x}", b"+{n:x}",
                              b"{n:x} ", b"{n:x};ext=1", b"{n:x} ;ext", b" {n:x}",
                              b"{n:x}_0", b"-{n:x}", b"{n:x}\t"])


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    out = b""
    for data in draw(st.lists(st.binary(min_size=1, max_size=12), max_size=3)):
        size = draw(CHUNK_SIZE).decode().format(n=len(data)).encode()
        out += size + draw(EOL) + data + draw(st.sampled_from([b"\r\n"] * 6 + [b"", b"\n",
                                                                                b"xx"]))
    out += draw(st.sampled_from([b"0", b"00", b"0;x", b"0x0", b""])) + draw(EOL)
    trailers = draw(st.lists(HEADER, max_size=2))
    return out + b"".join(t + draw(EOL) for t in trailers) + draw(EOL)


@st.composite
def response(draw: st.DrawFn) -> bytes:
    lines = [draw(STATUS_LINE)]
    for _ in range(draw(st.integers(0, 4))):
        lines.append(draw(st.one_of(HEADER, FOLD)) if draw(st.booleans()) else draw(HEADER))
    head = b"".join(line + draw(EOL) for line in lines) + draw(EOL)
    if draw(st.integers(0, 9)) == 0:
        head = b"HTTP/1.1 100 Continue\r\n\r\n" + head
    body = draw(chunked_body()) if draw(st.booleans()) else draw(st.binary(max_size=10))
    return head + body + draw(st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n\r\n", b"junk"]))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(response()))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        match draw(st.integers(0, 2)):
            case 0:
                data[at:at] = draw(st.sampled_from([b"\r", b"\n", b" ", b"\t", b"\x00", b",",
                                                    b"0", b"a", b":", b";"]))
            case 1:
                del data[at:at + 1]
            case _:
                data[at:at + 1] = bytes([draw(st.integers(0, 255))])
    return bytes(data)


ORACLE = settings(max_examples=600, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


@ORACLE
@given(data=response(), split=st.lists(st.integers(1, 9), max_size=6))
@example(data=b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
         split=[])
@example(data=b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
         split=[])
@example(data=b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1_1\r\n" + b"a" * 17
         + b"\r\n0\r\n\r\n", split=[])
@example(data=b"HTTP/1.1 200 OK\r\ntransfer-encoding: xchunked\r\n\r\nabc", split=[])
@example(data=b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive"
         b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n", split=[])
@example(data=b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok", split=[3])
def test_the_parser_reads_responses_as_h11_does(data: bytes, split: list[int]) -> None:
    agree(data, split)


@ORACLE
@given(data=mutated() | st.binary(max_size=60))
def test_the_parser_refuses_what_h11_refuses_in_mangled_responses(data: bytes) -> None:
    agree(data)


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1_1\r\n" + b"a" * 17
    + b"\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: xchunked\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",
    b"HTTP/1.1 099 Odd\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\nab",
])
def test_framing_that_h11_refuses_is_refused(data: bytes) -> None:
    assert isinstance(h11_reads(data), Refused)
    assert isinstance(notifyq_reads(data), Refused)


def test_http_1_0_never_keeps_its_connection_even_with_transfer_encoding() -> None:
    data = (b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n")
    assert notifyq_reads(data) == Parsed(200, [(b"transfer-encoding", b"chunked"),
                                               (b"connection", b"keep-alive")], b"abc", False)


def test_a_head_with_bare_line_feeds_is_read() -> None:
    data = b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok"
    assert notifyq_reads(data) == h11_reads(data) == Parsed(
        200, [(b"content-length", b"2")], b"ok", True)
