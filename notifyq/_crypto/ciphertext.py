"""The ciphertext format and its associated data.

A notifyq ciphertext is self-describing, so the key is chosen by the version in its header,
never by trying keys::

    byte 0        format (1)
    bytes 1..4    key version, unsigned big-endian (1 .. 2^31-1)
    bytes 5..16   nonce (96 random bits, fresh for every encryption)
    bytes 17..    AES-256-GCM ciphertext, then its 16-byte tag

33 bytes of overhead. The associated data is the 5-byte header followed by the (table, column,
row id) the value lives at, each length-prefixed: flipping the version byte, or copying the
value to another row or column, fails authentication. In SQL, ``notifyq.key_version_of(col)``
reads the version from the header (0 for anything malformed).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from notifyq._errors import DecryptionFailed

FORMAT_V1 = 1
HEADER = struct.Struct(">BI")
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = HEADER.size + NONCE_BYTES + TAG_BYTES
MAX_VERSION = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Context:
    """Where a ciphertext lives: ``table`` (``schema.table``), ``column`` and the row's primary
    key as text (``str(pk)``). Encrypt and decrypt must be given the same context.

    Example::

        blob = keyring.encrypt(b"s3cret", Context("public.users", "api_token", "42"))
    """

    table: str
    column: str
    row_id: str

    @classmethod
    def of(cls, table: str, column: str, row_id: Any) -> Context:
        return cls(table, column, str(row_id))

    def associated_data(self, header: bytes) -> bytes:
        parts = [header]
        for field in (self.table, self.column, self.row_id):
            data = field.encode()
            parts.append(struct.pack(">I", len(data)))
            parts.append(data)
        return b"".join(parts)

    def __str__(self) -> str:
        return f"{self.table}.{self.column} row {self.row_id}"


@dataclass(frozen=True, slots=True)
class Parsed:
    version: int
    header: bytes
    nonce: bytes
    body: bytes


def header(version: int) -> bytes:
    return HEADER.pack(FORMAT_V1, version)


def parse(blob: bytes, context: Context) -> Parsed:
    """Split a ciphertext into its parts; DecryptionFailed when it is not one."""
    if len(blob) < OVERHEAD:
        raise DecryptionFailed(f"cannot decrypt {context}: {len(blob)} bytes is too short for a "
                               f"notifyq ciphertext (at least {OVERHEAD})")
    fmt, version = HEADER.unpack_from(blob)
    if fmt != FORMAT_V1:
        raise DecryptionFailed(f"cannot decrypt {context}: unknown ciphertext format {fmt}")
    start = HEADER.size
    return Parsed(version, bytes(blob[:start]), bytes(blob[start:start + NONCE_BYTES]),
                  bytes(blob[start + NONCE_BYTES:]))


def version_of(blob: bytes) -> int:
    """The key version in a ciphertext's header; 0 when it is not a notifyq ciphertext
    (the same answer as ``notifyq.key_version_of`` in SQL)."""
    if len(blob) < OVERHEAD or blob[0] != FORMAT_V1:
        return 0
    version: int = HEADER.unpack_from(blob)[1]
    return version if version <= MAX_VERSION else 0
