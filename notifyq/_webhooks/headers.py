"""Endpoint headers: the values are receiver credentials (``Authorization: Bearer ...``), so
they are stored as one keyring ciphertext and shown to nobody.

``webhook_endpoint.header_values`` holds the JSON object of names and values, encrypted for
``(schema.webhook_endpoint, header_values, id)``: a registered encrypted column, re-encrypted by
key rotation like the signing secrets. ``webhook_endpoint.headers`` keeps the names, each with
:data:`MASK` as its value; that is what the API, the CLI and the dashboard show. An update
that gives a header the mask keeps its stored value (so a client may send back what it read).

Example::

    blob = seal(keyring, column, endpoint_id, {"Authorization": "Bearer abc"})
    assert unseal(keyring, column, endpoint_id, blob) == {"Authorization": "Bearer abc"}
    assert masked({"Authorization": "Bearer abc"}) == {"Authorization": MASK}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from uuid import UUID

from notifyq._crypto.keyring import Keyring
from notifyq._errors import InvalidEndpoint
from notifyq._keys.columns import EncryptedColumn

MASK = "********"
COLUMN = "header_values"


def masked(headers: Mapping[str, str]) -> dict[str, str]:
    return dict.fromkeys(headers, MASK)


def seal(keyring: Keyring, column: EncryptedColumn, endpoint_id: UUID,
         headers: Mapping[str, str]) -> bytes | None:
    """The ciphertext of ``headers`` (None when there are none)."""
    if not headers:
        return None
    text = json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":"))
    return keyring.encrypt(text.encode(), column.context(endpoint_id))


def unseal(keyring: Keyring, column: EncryptedColumn, endpoint_id: UUID,
           blob: bytes | None) -> dict[str, str]:
    if blob is None:
        return {}
    values = json.loads(keyring.decrypt(bytes(blob), column.context(endpoint_id)))
    return {str(k): str(v) for k, v in values.items()}


def keep_masked(given: Mapping[str, str], stored: Mapping[str, str]) -> dict[str, str]:
    """``given`` with each masked value replaced by the stored one of that name."""
    for name, value in given.items():
        if value == MASK and name not in stored:
            raise InvalidEndpoint(f"headers: {name} is given masked ({MASK}) but has no "
                                  "stored value to keep; give its value")
    return {name: stored[name] if value == MASK else value for name, value in given.items()}
