"""HTTP/1.1 response framing (RFC 9112), sans I/O: the head and the body of a response read out
of a byte buffer, exactly as strict as h11 (httpx's own parser), which
``tests/unit/test_webhook_http11.py`` checks property by property with h11 as the oracle.

The rules that decide where a response ends, and so whether the next one on the connection is
read from the right byte (a lenient parser here is a response-splitting hole):

- The head ends at the first empty line; lines end with CRLF or a bare LF (RFC 9112 §2.2).
  The status line is ``HTTP/1.<digit> <3 digits>[ <reason>]``; other major versions are refused
  (h11 reads ``HTTP/2.0`` as a version above 1.1: the one place we are stricter). Header lines
  are ``token ":" OWS value OWS``; an obsolete line fold is joined with a space (§5.2).
- ``Transfer-Encoding`` must be exactly one ``chunked`` (no other coding, no repeat, no
  ``xchunked``); it beats ``Content-Length``, which must be digits, one value (repeats equal).
- Chunk sizes are 1-20 hex digits (no ``0x``, sign, ``_`` or inner space), the chunk's data
  ends with CRLF, and trailers are read like headers.
- A response keeps its connection only when it is HTTP/1.1 (or a later 1.x) without
  ``Connection: close``, and has a length: HTTP/1.0 never does (with ``Transfer-Encoding`` its
  framing is faulty, §6.1), nor does a body that ends when the connection does. Stricter than
  h11: a response with both ``Transfer-Encoding`` and ``Content-Length`` (a smuggling sign,
  §6.3) closes its connection too.
- 1xx answers are skipped, except 101 (no upgrade was asked for), and codes below 100 are
  refused. At most ``limit`` bytes may wait for a head, chunk line or trailer to complete.

Errors are ``httpx.RemoteProtocolError`` with what was wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_VALUE = rb"[^\x00\s]+(?:[ \t]+[^\x00\s]+)*"
_HEADER = re.compile(rb"(" + _TOKEN + rb"):[ \t]*(" + _VALUE + rb")?[ \t]*")
_STATUS = re.compile(rb"HTTP/([0-9])\.([0-9]) ([0-9]{3})(?: (?:[ \t]|[^\x00\s])*)?")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
_END_OF_HEAD = re.compile(rb"\n\r?\n")
_DIGITS = re.compile(rb"[0-9]{1,20}")
_FOLD = re.compile(rb"[ \t]+")
_NO_BODY = frozenset({204, 304})

Headers = list[tuple[bytes, bytes]]


def _fail(message: str, data: bytes | bytearray = b"") -> httpx.RemoteProtocolError:
    shown = f": {bytes(data[:100])!r}" if data else ""
    return httpx.RemoteProtocolError(message + shown)


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    headers: Headers
    """Names as received, values without surrounding whitespace."""
    version: bytes
    """``b"HTTP/1.0"`` or ``b"HTTP/1.1"`` (a later 1.x reads as 1.1)."""


@dataclass(frozen=True, slots=True)
class Framing:
    kind: str  # "empty" | "length" | "chunked" | "close"
    length: int = 0
    keep_alive: bool = True


def _lines(buf: bytearray, limit: int) -> list[bytes] | None:
    """The lines up to the first empty one (consumed), or None while incomplete."""
    if buf[:1] == b"\n" or buf[:2] == b"\r\n":
        del buf[:1 if buf[:1] == b"\n" else 2]
        return []
    end = _END_OF_HEAD.search(buf, 0, limit + 2)
    if end is None:
        if len(buf) > limit:
            raise _fail(f"a header block larger than {limit} bytes")
        return None
    block = bytes(buf[:end.end()])
    del buf[:end.end()]
    lines = [line[:-1] if line.endswith(b"\r") else line for line in block.split(b"\n")]
    return lines[:-2]


def _unfold(lines: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for line in lines:
        fold = _FOLD.match(line)
        if fold is None:
            out.append(line)
        elif not out:
            raise _fail("a continuation line before any header", line)
        else:
            out[-1] += b" " + line[fold.end():]
    return out


def _header_block(lines: list[bytes]) -> Headers:
    headers: Headers = []
    length: bytes | None = None
    coding = False
    for line in _unfold(lines):
        match = _HEADER.fullmatch(line)
        if match is None:
            raise _fail("malformed header line", line)
        name, value = match[1], match[2] or b""
        lowered = name.lower()
        if lowered == b"content-length":
            values = {v.strip() for v in value.split(b",")}
            if len(values) != 1:
                raise _fail("conflicting Content-Length values", value)
            value = values.pop()
            if not _DIGITS.fullmatch(value) or (length is not None and value != length):
                raise _fail("invalid or conflicting Content-Length", value)
            if length is not None:
                continue
            length = value
        elif lowered == b"transfer-encoding":
            if coding:
                raise _fail("more than one Transfer-Encoding header")
            value = value.lower()
            if value != b"chunked":
                raise _fail("only Transfer-Encoding: chunked is supported", value)
            coding = True
        headers.append((name, value))
    return headers


def read_head(buf: bytearray, limit: int) -> Head | None:
    """One response head, consumed from ``buf``; None while it is incomplete. Informational
    (1xx) heads are returned too: the caller skips them."""
    lines = _lines(buf, limit)
    if lines is None:
        # Like h11, fail early on what cannot become a status line (a TLS answer to plain
        # HTTP, say) instead of waiting for an empty line that may never come.
        if buf and not buf.startswith(b"HTTP/"[:len(buf)]):
            raise _fail("not an HTTP/1.x status line", buf)
        return None
    if not lines:
        raise _fail("an empty line where the status line should be")
    status = _STATUS.fullmatch(lines[0])
    if status is None or status[1] != b"1":
        raise _fail("not an HTTP/1.x status line", lines[0])
    code = int(status[3])
    if code < 100 or code == 101:
        raise _fail(f"status {code} is not a response to this request")
    version = b"HTTP/1.0" if status[2] == b"0" else b"HTTP/1.1"
    return Head(code, _header_block(lines[1:]), version)


def _tokens(headers: Headers, name: bytes) -> list[bytes]:
    return [t.strip() for n, v in headers if n.lower() == name
            for t in v.lower().split(b",") if t.strip()]


def framing(head: Head, method: bytes = b"POST") -> Framing:
    """How the body of a final (>= 200) response is delimited, and whether the connection
    may carry another request after it."""
    names = {n.lower() for n, _ in head.headers}
    keep_alive = (head.version == b"HTTP/1.1"
                  and b"close" not in _tokens(head.headers, b"connection")
                  and not {b"transfer-encoding", b"content-length"} <= names)
    if head.status in _NO_BODY or method == b"HEAD":
        return Framing("empty", keep_alive=keep_alive)
    if b"transfer-encoding" in names:
        return Framing("chunked", keep_alive=keep_alive)
    for name, value in head.headers:
        if name.lower() == b"content-length":
            return Framing("length", int(value), keep_alive)
    return Framing("close", keep_alive=False)


class BodyReader:
    """The body of one response, as its framing delimits it: ``next(buf)`` consumes from
    ``buf`` and returns data, ``b""`` once the body is complete (``done``), or None when it
    needs more bytes; ``eof()`` when the peer has closed and ``buf`` has no more."""

    def __init__(self, framing: Framing, limit: int) -> None:
        self.framing = framing
        self.limit = limit
        self.done = framing.kind == "empty"
        self._left = framing.length
        self._state = "size"
        self._crlf = b""

    def next(self, buf: bytearray) -> bytes | None:
        if self.done:
            return b""
        kind = self.framing.kind
        if kind == "length":
            return self._length(buf)
        if kind == "close":
            return self._take(buf, len(buf)) if buf else None
        return self._chunked(buf)

    def eof(self) -> None:
        if self.done:
            return
        if self.framing.kind != "close":
            raise _fail("the server closed the connection before the end of the body"
                        + (f" ({self._left} bytes missing)" if self.framing.kind == "length"
                           else " (incomplete chunked body)"))
        self.done = True

    @staticmethod
    def _take(buf: bytearray, count: int) -> bytes:
        data = bytes(buf[:count])
        del buf[:count]
        return data

    def _length(self, buf: bytearray) -> bytes | None:
        if not self._left:
            self.done = True
            return b""
        if not buf:
            return None
        data = self._take(buf, self._left)
        self._left -= len(data)
        return data

    def _chunked(self, buf: bytearray) -> bytes | None:
        while True:
            step = {"size": self._size_line, "data": self._chunk_data,
                    "crlf": self._chunk_end, "trailer": self._trailer}[self._state]
            out = step(buf)
            if out is not _AGAIN:
                return out

    def _size_line(self, buf: bytearray) -> bytes | None:
        end = buf.find(b"\r\n")
        if end < 0:
            if len(buf) > self.limit:
                raise _fail(f"a chunk-size line longer than {self.limit} bytes")
            return None
        line = self._take(buf, end + 2)
        size = _CHUNK_SIZE.fullmatch(line)
        if size is None:
            raise _fail("bad chunk size line", line)
        self._left = int(size[1], 16)
        self._state = "data" if self._left else "trailer"
        return _AGAIN

    def _chunk_data(self, buf: bytearray) -> bytes | None:
        if not buf:
            return None
        data = self._take(buf, self._left)
        self._left -= len(data)
        if not self._left:
            self._state, self._crlf = "crlf", b"\r\n"
        return data

    def _chunk_end(self, buf: bytearray) -> bytes | None:
        if not buf:
            return None
        got = self._take(buf, len(self._crlf))
        if got != self._crlf[:len(got)]:
            raise _fail("a chunk does not end with CRLF", got)
        self._crlf = self._crlf[len(got):]
        if self._crlf:
            return None
        self._state = "size"
        return _AGAIN

    def _trailer(self, buf: bytearray) -> bytes | None:
        lines = _lines(buf, self.limit)
        if lines is None:
            return None
        _header_block(lines)  # validated, then ignored
        self.done = True
        return b""


_AGAIN = b"again"
"""A chunked-state step's "go on with the next state" (compared by identity)."""


@dataclass(frozen=True, slots=True)
class Parsed:
    status: int
    headers: Headers
    body: bytes
    keep_alive: bool


def parse_response(data: bytes, *, pieces: list[int] | None = None,
                   limit: int = 65_536) -> Parsed:
    """A whole response from ``data`` followed by the end of the connection (what the
    transport does, without sockets): the tests' entry point. ``pieces`` splits ``data`` into
    reads of these sizes (the rest in one), to check that where reads end does not matter."""
    reads = []
    rest = data
    for size in pieces or []:
        reads.append(rest[:size])
        rest = rest[size:]
    reads.append(rest)
    buf = bytearray()
    head = None
    while head is None or head.status < 200:
        head = read_head(buf, limit)
        if head is None:
            if not reads:
                raise _fail("the server closed the connection before a complete head")
            buf += reads.pop(0)
    reader = BodyReader(framing(head), limit)
    body = bytearray()
    while not reader.done:
        piece = reader.next(buf)
        if piece is None:
            if reads:
                buf += reads.pop(0)
            else:
                reader.eof()
        else:
            body += piece
    return Parsed(head.status, head.headers, bytes(body), reader.framing.keep_alive)
