"""The keyring: versioned 256-bit master keys, one of them active.

Keys come from configuration only (``NOTIFYQ_KEYS="1:<base64>,2:<base64>"`` or a key file
with one ``VERSION:BASE64`` per line) and are never stored in the database; the database keeps
a key check value per version (an HMAC-SHA256 of a constant under the key), so a process given a
different key under a known version refuses to start. Every configured version decrypts; only
the active one encrypts. In an App the active version is the cluster's (promoted in the
database, see notifyq/_keys/check.py), which the key check sets here: a keyring whose active
version is one it does not hold refuses to encrypt rather than fall back to an older key.

Example::

    keyring = Keyring({1: old_key, 2: new_key}, active=2)
    blob = keyring.encrypt(b"s3cret", Context("public.users", "api_token", "42"))
    assert keyring.decrypt(blob, Context("public.users", "api_token", "42")) == b"s3cret"

Nothing here puts key bytes or plaintext in a message or a repr.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from notifyq._crypto.ciphertext import (
    MAX_VERSION,
    NONCE_BYTES,
    Context,
    header,
    parse,
    version_of,
)
from notifyq._errors import ConfigError, DecryptionFailed, RetiredKeyVersion, UnknownKeyVersion

KEY_BYTES = 32
_CHECK_CONSTANT = b"notifyq key check value v1"
_VERSION = re.compile(r"^\s*(-?\d+)\s*$")
_GENERATE = ("generate one with: python -c \"import base64, os; "
             "print(base64.b64encode(os.urandom(32)).decode())\"")


def check_value(key: bytes) -> bytes:
    """The key check value stored for a version: HMAC-SHA256(key, constant)."""
    return hmac.new(key, _CHECK_CONSTANT, hashlib.sha256).digest()


class Keyring:
    """Versioned AES-256-GCM keys. ``encrypt`` uses the active version; ``decrypt`` the version
    named in the ciphertext's header (unless it was retired)."""

    __slots__ = ("_active", "_check_values", "_ciphers", "_guard", "_retired")

    def __init__(self, keys: Mapping[int, bytes], *, active: int | None) -> None:
        if not keys:
            raise ConfigError("the keyring is empty: configure at least one key")
        for version, key in keys.items():
            _check_version(version)
            if len(key) != KEY_BYTES:
                raise ConfigError(f"key version {version} is {len(key)} bytes; keys must be "
                                  f"{KEY_BYTES} bytes (256 bits): {_GENERATE}")
        if active is not None and active not in keys:
            raise ConfigError(f"active key version {active} is not configured (configured: "
                              f"{_listing(keys)})")
        self._ciphers = {v: AESGCM(k) for v, k in keys.items()}
        self._check_values = {v: check_value(k) for v, k in keys.items()}
        self._active: int | None = active
        self._retired: frozenset[int] = frozenset()
        self._guard: Callable[[], None] | None = None

    def guard_with(self, guard: Callable[[], None]) -> None:
        """Call ``guard`` before every encrypt and decrypt (the process's key check: it
        raises to refuse, and loads retirements). A keyring built by hand has none."""
        self._guard = guard

    @property
    def active_version(self) -> int | None:
        """The version ``encrypt`` uses: the cluster's active version as of the last key check
        (before the first one, ``NOTIFYQ_ACTIVE_KEY_VERSION``), which this keyring may not
        hold. None: no version is active yet."""
        return self._active

    def set_active(self, version: int | None) -> None:
        """The cluster's active version, as the key check read it (held here or not)."""
        self._active = version

    def holds(self, version: int) -> bool:
        """Whether ``version`` is configured here (retired or not)."""
        return version in self._ciphers

    @property
    def versions(self) -> list[int]:
        """Every configured version, ascending (the active one included)."""
        return sorted(self._ciphers)

    @property
    def retired(self) -> frozenset[int]:
        return self._retired

    def check_values(self) -> dict[int, bytes]:
        return dict(self._check_values)

    def set_retired(self, versions: Iterable[int]) -> None:
        """Versions retired in the database: they no longer decrypt, even when configured."""
        self._retired = frozenset(versions)

    def encrypt(self, plaintext: bytes, context: Context) -> bytes:
        """Encrypt under the active version with a fresh random nonce."""
        if self._guard is not None:
            self._guard()
        version = self._active
        if version is None:
            raise ConfigError("no key version is active: set NOTIFYQ_ACTIVE_KEY_VERSION (the "
                              "cluster's first active version) or run `notifyq keys promote N`")
        cipher = self._ciphers.get(version)
        if cipher is None:
            raise ConfigError(f"key version {version} is active but this process does not hold "
                              f"it (configured: {_listing(self._ciphers)}): add version "
                              f"{version} to NOTIFYQ_KEYS (or NOTIFYQ_KEY_FILE) and restart; "
                              "meanwhile this process decrypts what it can and encrypts "
                              "nothing, rather than write under an older key")
        if version in self._retired:
            raise RetiredKeyVersion(f"the active key version {version} is retired; activate "
                                    "another version")
        head = header(version)
        nonce = os.urandom(NONCE_BYTES)
        body = cipher.encrypt(nonce, plaintext, context.associated_data(head))
        return head + nonce + body

    def decrypt(self, blob: bytes, context: Context) -> bytes:
        """Decrypt a ciphertext written for ``context``.

        Raises UnknownKeyVersion, RetiredKeyVersion or DecryptionFailed (tampered, truncated,
        or written for another row or column)."""
        if self._guard is not None:
            self._guard()
        parsed = parse(blob, context)
        cipher = self._ciphers.get(parsed.version)
        if cipher is None:
            raise UnknownKeyVersion(f"cannot decrypt {context}: key version {parsed.version} "
                                    f"is not configured (configured: {_listing(self._ciphers)})")
        if parsed.version in self._retired:
            raise RetiredKeyVersion(f"cannot decrypt {context}: key version {parsed.version} "
                                    "is retired")
        try:
            return cipher.decrypt(parsed.nonce, parsed.body,
                                  context.associated_data(parsed.header))
        except InvalidTag:
            raise DecryptionFailed(f"cannot decrypt {context}: authentication failed (corrupted, "
                                   "or written for another row or column)") from None

    @staticmethod
    def version_of(blob: bytes) -> int:
        """The key version in a ciphertext's header (0 when it is not a notifyq ciphertext)."""
        return version_of(blob)

    def __repr__(self) -> str:
        return (f"Keyring(versions={self.versions}, active={self._active}, "
                f"retired={sorted(self._retired)})")


def parse_keys(text: str, *, source: str) -> dict[int, bytes]:
    """``"1:<base64>,2:<base64>"`` (commas or newlines; ``#`` starts a comment line in a key
    file) → {version: key}. ValueError names the problem and ``source``, never key material."""
    keys: dict[int, bytes] = {}
    entries = [e.strip() for line in text.splitlines() if not line.lstrip().startswith("#")
               for e in line.split(",")]
    for position, entry in enumerate((e for e in entries if e), start=1):
        number, sep, encoded = entry.partition(":")
        match = _VERSION.match(number)
        if not sep or match is None:
            raise ValueError(f"{source}: entry {position} must look like VERSION:BASE64 "
                             "(e.g. 1:<44 base64 characters>)")
        version = int(match[1])
        if not 1 <= version <= MAX_VERSION:
            raise ValueError(f"{source}: key version {version} must be a positive integer "
                             f"(1..{MAX_VERSION})")
        if version in keys:
            raise ValueError(f"{source}: key version {version} is given twice")
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{source}: key version {version} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise ValueError(f"{source}: key version {version} is {len(key)} bytes; keys must "
                             f"be {KEY_BYTES} bytes (256 bits): {_GENERATE}")
        keys[version] = key
    if not keys:
        raise ValueError(f"{source} holds no keys: give at least one VERSION:BASE64")
    return keys


def read_key_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"NOTIFYQ_KEY_FILE: no such file {str(path)!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"NOTIFYQ_KEY_FILE: cannot read {str(path)!r} "
                         f"({type(exc).__name__})") from None


def _check_version(version: int) -> None:
    if not 1 <= version <= MAX_VERSION:
        raise ConfigError(f"key version {version} must be a positive integer (1..{MAX_VERSION})")


def _listing(versions: Iterable[int]) -> str:
    return ", ".join(str(v) for v in sorted(versions)) or "none"


def configured_keys(keys: str | None, key_file: Path | None,
                    active: int | None) -> tuple[dict[int, bytes], int | None] | None:
    """The keys and the active version the settings describe (None: follow the cluster's), or
    None when no keyring is configured. ValueError names the setting at fault (and never holds
    key material)."""
    if keys is not None and key_file is not None:
        raise ValueError("set NOTIFYQ_KEYS or NOTIFYQ_KEY_FILE, not both")
    if keys is None and key_file is None:
        if active is not None:
            raise ValueError("NOTIFYQ_ACTIVE_KEY_VERSION is set but no keys are configured: "
                             "set NOTIFYQ_KEYS or NOTIFYQ_KEY_FILE")
        return None
    if keys is not None:
        material = parse_keys(keys, source="NOTIFYQ_KEYS")
    else:
        assert key_file is not None  # noqa: S101 - one of the two is set
        material = parse_keys(read_key_file(key_file), source="NOTIFYQ_KEY_FILE")
    if active is not None and active not in material:
        raise ValueError(f"NOTIFYQ_ACTIVE_KEY_VERSION={active} is not a configured key version "
                         f"(configured: {_listing(material)})")
    return material, active
