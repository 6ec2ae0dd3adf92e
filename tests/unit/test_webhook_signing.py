"""Standard Webhooks v1 signatures, checked by the reference ``standardwebhooks`` package."""

from __future__ import annotations

import base64
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from notifyq._webhooks.signing import generate_secret, secret_key, sign, signature_header

BODY = b'{"id": 42, "name": "caf\xc3\xa9"}'


def _headers(secret: str, body: bytes, timestamp: int, msg_id: str = "msg_1") -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature_header([secret_key(secret)], msg_id, timestamp, body)}


def test_a_signed_body_verifies_with_the_reference_library() -> None:
    secret = generate_secret()
    now = int(time.time())
    assert Webhook(secret).verify(BODY, _headers(secret, BODY, now)) == {"id": 42,
                                                                         "name": "café"}


def test_a_tampered_body_a_wrong_secret_and_a_stale_timestamp_all_fail() -> None:
    secret = generate_secret()
    now = int(time.time())
    headers = _headers(secret, BODY, now)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY.replace(b"42", b"43"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY, _headers(secret, BODY, now - 3600))


def test_the_signature_header_lists_one_v1_signature_per_secret_and_either_verifies() -> None:
    old, new = generate_secret(), generate_secret()
    now = int(time.time())
    header = signature_header([secret_key(new), secret_key(old)], "msg_2", now, BODY)
    parts = header.split(" ")
    assert len(parts) == 2
    assert all(p.startswith("v1,") for p in parts)
    for secret in (old, new):
        Webhook(secret).verify(BODY, {"webhook-id": "msg_2", "webhook-timestamp": str(now),
                                      "webhook-signature": header})


def test_the_signed_content_is_id_dot_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    key = b"k" * 32
    expected = hmac.new(key, b"msg_3.1700000000." + BODY, hashlib.sha256).digest()
    assert sign(key, "msg_3", 1700000000, BODY) == "v1," + base64.b64encode(expected).decode()


@pytest.mark.parametrize("nbytes", [24, 32, 64])
def test_generated_secrets_are_whsec_and_base64_of_the_requested_length(nbytes: int) -> None:
    secret = generate_secret(nbytes)
    assert secret.startswith("whsec_")
    assert len(secret_key(secret)) == nbytes


@pytest.mark.parametrize("bad", ["", "whsec_", "sk_abc", "whsec_!!!",
                                 "whsec_" + base64.b64encode(b"x" * 23).decode(),
                                 "whsec_" + base64.b64encode(b"x" * 65).decode()])
def test_malformed_secrets_are_refused_without_echoing_them(bad: str) -> None:
    with pytest.raises(ValueError, match="webhook secret") as caught:
        secret_key(bad)
    if len(bad) > 8:
        assert bad not in str(caught.value)
