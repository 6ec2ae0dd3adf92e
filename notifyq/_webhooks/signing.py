"""Standard Webhooks v1 signatures.

A secret is ``whsec_`` followed by the base64 of 24 to 64 random bytes (the HMAC key). Every
attempt signs ``"{webhook-id}.{webhook-timestamp}.{body}"`` with HMAC-SHA256 under each valid
secret; ``webhook-signature`` lists them space-separated, each ``v1,<base64>``.

Example::

    secret = generate_secret()
    header = signature_header([secret_key(secret)], "msg_1", 1700000000, b'{"a":1}')
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable

PREFIX = "whsec_"
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64
DEFAULT_KEY_BYTES = 32


def generate_secret(nbytes: int = DEFAULT_KEY_BYTES) -> str:
    """A fresh ``whsec_`` secret of ``nbytes`` random bytes."""
    if not MIN_KEY_BYTES <= nbytes <= MAX_KEY_BYTES:
        raise ValueError(f"secret length must be {MIN_KEY_BYTES}..{MAX_KEY_BYTES} bytes, "
                         f"got {nbytes}")
    return PREFIX + base64.b64encode(secrets.token_bytes(nbytes)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret; ValueError (never echoing it) when malformed."""
    if not isinstance(secret, str) or not secret.startswith(PREFIX):
        raise ValueError(f"a webhook secret must start with {PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a webhook secret must be {PREFIX!r} followed by base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a webhook secret must hold {MIN_KEY_BYTES} to {MAX_KEY_BYTES} "
                         f"bytes, this one holds {len(key)}")
    return key


def signer(key: bytes) -> hmac.HMAC:
    """``key``'s HMAC-SHA256, keyed once: :func:`sign` copies it for each signature rather
    than hashing the key's pads again."""
    return hmac.new(key, digestmod=hashlib.sha256)


def sign(key: bytes | hmac.HMAC, message_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature, under a key or its :func:`signer`."""
    mac = key.copy() if isinstance(key, hmac.HMAC) else signer(key)
    mac.update(f"{message_id}.{timestamp}.".encode())
    mac.update(body)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signature_header(keys: Iterable[bytes | hmac.HMAC], message_id: str, timestamp: int,
                     body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per key, space-separated."""
    return " ".join(sign(key, message_id, timestamp, body) for key in keys)
