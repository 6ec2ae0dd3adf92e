"""The keyring and the ciphertext format: round trips, nonces, tampering, binding to the row,
every bad configuration, and no key material in any message or repr."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from notifyq import (
    ConfigError,
    DecryptionFailed,
    EncryptedColumn,
    Keyring,
    RetiredKeyVersion,
    UnknownKeyVersion,
)
from notifyq._crypto.ciphertext import OVERHEAD, Context, version_of
from notifyq._crypto.keyring import configured_keys, parse_keys
from notifyq._settings import load_settings

K1 = os.urandom(32)
K2 = os.urandom(32)
CTX = Context("public.users", "api_token", "42")


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


@pytest.fixture
def ring() -> Keyring:
    return Keyring({1: K1, 2: K2}, active=2)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("NOTIFYQ_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("plaintext", [b"", b"x", os.urandom(1 << 20)], ids=["empty", "one",
                                                                             "1MiB"])
def test_a_value_round_trips_through_encrypt_and_decrypt(ring: Keyring, plaintext: bytes) -> None:
    blob = ring.encrypt(plaintext, CTX)
    assert len(blob) == len(plaintext) + OVERHEAD
    assert ring.decrypt(blob, CTX) == plaintext
    assert version_of(blob) == ring.version_of(blob) == 2


def test_ten_thousand_encryptions_use_ten_thousand_different_nonces(ring: Keyring) -> None:
    nonces = {ring.encrypt(b"same", CTX)[5:17] for _ in range(10_000)}
    assert len(nonces) == 10_000


def test_flipping_any_single_bit_makes_decryption_fail(ring: Keyring) -> None:
    blob = ring.encrypt(b"attack at dawn", CTX)
    for bit in range(len(blob) * 8):
        tampered = bytearray(blob)
        tampered[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(DecryptionFailed):
            ring.decrypt(bytes(tampered), CTX)


def test_a_truncated_ciphertext_fails_and_says_it_is_too_short(ring: Keyring) -> None:
    blob = ring.encrypt(b"x", CTX)
    for cut in (0, 5, OVERHEAD - 1):
        with pytest.raises(DecryptionFailed, match="too short"):
            ring.decrypt(blob[:cut], CTX)
    with pytest.raises(DecryptionFailed):
        ring.decrypt(blob[:-1], CTX)


@pytest.mark.parametrize("elsewhere", [
    Context("public.users", "api_token", "43"),
    Context("public.users", "password", "42"),
    Context("public.admins", "api_token", "42"),
    Context("public.users.api", "token", "42"),
], ids=["other-row", "other-column", "other-table", "shifted-boundary"])
def test_a_value_moved_to_another_row_or_column_does_not_decrypt(ring: Keyring,
                                                                  elsewhere: Context) -> None:
    blob = ring.encrypt(b"s3cret", CTX)
    with pytest.raises(DecryptionFailed, match="authentication failed"):
        ring.decrypt(blob, elsewhere)


def test_swapping_the_values_of_two_rows_makes_both_fail(ring: Keyring) -> None:
    a, b = Context("public.t", "c", "1"), Context("public.t", "c", "2")
    blob_a, blob_b = ring.encrypt(b"a", a), ring.encrypt(b"b", b)
    for blob, ctx in ((blob_a, b), (blob_b, a)):
        with pytest.raises(DecryptionFailed):
            ring.decrypt(blob, ctx)


def test_the_key_is_chosen_by_the_header_and_old_versions_still_decrypt() -> None:
    old = Keyring({1: K1}, active=1).encrypt(b"v1", CTX)
    ring = Keyring({1: K1, 2: K2}, active=2)
    assert ring.decrypt(old, CTX) == b"v1"
    assert version_of(old) == 1


def test_a_version_that_is_not_configured_is_unknown(ring: Keyring) -> None:
    blob = ring.encrypt(b"x", CTX)
    with pytest.raises(UnknownKeyVersion, match="key version 2 is not configured"):
        Keyring({1: K1}, active=1).decrypt(blob, CTX)


def test_a_retired_version_no_longer_decrypts_even_when_configured(ring: Keyring) -> None:
    old = Keyring({1: K1}, active=1).encrypt(b"v1", CTX)
    ring.set_retired({1})
    with pytest.raises(RetiredKeyVersion, match="key version 1 is retired"):
        ring.decrypt(old, CTX)
    assert ring.decrypt(ring.encrypt(b"v2", CTX), CTX) == b"v2"
    ring.set_retired({2})
    with pytest.raises(RetiredKeyVersion, match="active key version 2 is retired"):
        ring.encrypt(b"x", CTX)


def test_version_of_reads_zero_for_anything_that_is_not_a_ciphertext() -> None:
    assert version_of(b"") == 0
    assert version_of(b"\x02" + bytes(40)) == 0
    assert version_of(b"\x01\xff\xff\xff\xff" + bytes(40)) == 0


def test_configured_keys_parses_versions_commas_newlines_and_comments() -> None:
    text = f"# rotated 2030-01\n1:{b64(K1)}\n 2 : {b64(K2)} ,\n"
    assert parse_keys(text, source="x") == {1: K1, 2: K2}
    assert configured_keys(f"1:{b64(K1)},2:{b64(K2)}", None, 1) == ({1: K1, 2: K2}, 1)
    assert configured_keys(None, None, None) is None


def test_keys_without_an_active_version_are_a_keyring_that_follows_the_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_KEYS", f"1:{b64(K1)}")
    settings = load_settings()
    assert configured_keys(settings.keys.get_secret_value() if settings.keys else None, None,
                           settings.active_key_version) == ({1: K1}, None)


def test_a_keyring_with_no_active_version_decrypts_and_refuses_to_encrypt_saying_what_to_do(
        ring: Keyring) -> None:
    blob = ring.encrypt(b"s3cret", CTX)
    follower = Keyring({1: K1, 2: K2}, active=None)
    assert follower.decrypt(blob, CTX) == b"s3cret"
    with pytest.raises(ConfigError, match=r"no key version is active: set "
                                          r"NOTIFYQ_ACTIVE_KEY_VERSION .* `notifyq keys "
                                          r"promote N`"):
        follower.encrypt(b"x", CTX)


def test_a_keyring_told_to_encrypt_under_a_version_it_lacks_refuses_rather_than_fall_back(
        ring: Keyring) -> None:
    old = Keyring({1: K1}, active=1)
    written_under_1 = old.encrypt(b"old", CTX)
    old.set_active(2)  # the cluster promoted 2; this process was deployed without it
    assert old.decrypt(written_under_1, CTX) == b"old"
    with pytest.raises(ConfigError, match=r"key version 2 is active but this process does not "
                                          r"hold it \(configured: 1\): add version 2 to "
                                          r"NOTIFYQ_KEYS") as raised:
        old.encrypt(b"new", CTX)
    assert b64(K1) not in str(raised.value)
    assert not old.holds(2)
    assert old.holds(1)


BAD_KEYS = {
    "bad-base64": (f"1:{b64(K1)[:-2]}!!", None, 1, "key version 1 is not valid base64"),
    "short-key": (f"1:{b64(K1[:16])}", None, 1, "key version 1 is 16 bytes; keys must be 32"),
    "long-key": (f"1:{b64(K1 + b'x')}", None, 1, "key version 1 is 33 bytes"),
    "duplicate": (f"1:{b64(K1)},1:{b64(K2)}", None, 1, "key version 1 is given twice"),
    "zero": (f"0:{b64(K1)}", None, 1, "key version 0 must be a positive integer"),
    "negative": (f"-2:{b64(K1)}", None, 1, "key version -2 must be a positive integer"),
    "no-version": (b64(K1), None, 1, "entry 1 must look like VERSION:BASE64"),
    "not-a-number": (f"one:{b64(K1)}", None, 1, "entry 1 must look like VERSION:BASE64"),
    "empty": ("", None, 1, "NOTIFYQ_KEYS holds no keys"),
    "only-commas": (" , ,", None, 1, "NOTIFYQ_KEYS holds no keys"),
    "active-not-configured": (f"1:{b64(K1)},2:{b64(K2)}", None, 3,
                              "NOTIFYQ_ACTIVE_KEY_VERSION=3 is not a configured key version "
                              r"\(configured: 1, 2\)"),
    "active-without-keys": (None, None, 2, "no keys are configured"),
    "both-sources": (f"1:{b64(K1)}", "keys.txt", 1, "not both"),
    "missing-file": (None, "nope.txt", 1, "NOTIFYQ_KEY_FILE: no such file"),
}


@pytest.mark.parametrize("case", list(BAD_KEYS), ids=list(BAD_KEYS))
def test_every_bad_keyring_configuration_stops_with_a_message_without_key_material(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    keys, key_file, active, message = BAD_KEYS[case]
    if keys is not None:
        monkeypatch.setenv("NOTIFYQ_KEYS", keys)
    if key_file is not None:
        monkeypatch.setenv("NOTIFYQ_KEY_FILE", key_file)
    if key_file == "keys.txt":
        Path(key_file).write_text(f"1:{b64(K1)}\n")
    if active is not None:
        monkeypatch.setenv("NOTIFYQ_ACTIVE_KEY_VERSION", str(active))
    with pytest.raises(ConfigError, match=message) as raised:
        load_settings()
    _assert_no_key_material(str(raised.value), repr(raised.value))


def test_a_key_file_configures_the_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    Path("keys.txt").write_text(f"# notifyq master keys\n1:{b64(K1)}\n2:{b64(K2)}\n")
    monkeypatch.setenv("NOTIFYQ_KEY_FILE", "keys.txt")
    monkeypatch.setenv("NOTIFYQ_ACTIVE_KEY_VERSION", "1")
    settings = load_settings()
    assert configured_keys(None, settings.key_file, settings.active_key_version) == (
        {1: K1, 2: K2}, 1)


@pytest.mark.parametrize(("keys", "active", "message"), [
    ({}, 1, "the keyring is empty"),
    ({1: K1[:31]}, 1, "key version 1 is 31 bytes"),
    ({0: K1}, 0, "key version 0 must be a positive integer"),
    ({1: K1}, 2, r"active key version 2 is not configured \(configured: 1\)"),
])
def test_the_keyring_constructor_refuses_bad_keys(keys: dict[int, bytes], active: int,
                                                  message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        Keyring(keys, active=active)
    _assert_no_key_material(str(raised.value))


def test_settings_keyring_and_errors_never_show_key_bytes_or_plaintext(
        ring: Keyring, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_KEYS", f"1:{b64(K1)},2:{b64(K2)}")
    monkeypatch.setenv("NOTIFYQ_ACTIVE_KEY_VERSION", "2")
    settings = load_settings()
    texts = [repr(settings), str(settings), repr(ring), str(ring)]
    blob = ring.encrypt(b"PLAINTEXT-MARKER", CTX)
    attempts: list[Callable[[], bytes]] = [
        lambda: ring.decrypt(blob, Context("public.users", "api_token", "1")),
        lambda: Keyring({1: K1}, active=1).decrypt(blob, CTX)]
    for attempt in attempts:
        with pytest.raises(DecryptionFailed) as raised:
            attempt()
        texts += [str(raised.value), repr(raised.value)]
    _assert_no_key_material(*texts)
    assert not any("PLAINTEXT-MARKER" in t for t in texts)


def test_encrypted_columns_must_name_schema_table_and_plain_identifiers() -> None:
    column = EncryptedColumn("public.users", "id", "api_token")
    assert column.name == "public.users.api_token"
    assert column.context(42) == Context("public.users", "api_token", "42")
    for table, pk, col in (("users", "id", "c"), ("public.users", "i d", "c"),
                           ("public.users", "id", 'c"; drop')):
        with pytest.raises(ConfigError, match="not a plain identifier"):
            EncryptedColumn(table, pk, col)


def _assert_no_key_material(*texts: str) -> None:
    for key in (K1, K2):
        for form in (b64(key), b64(key)[:20], key.hex(), key.hex()[:20],
                     base64.urlsafe_b64encode(key).decode()[:20]):
            for text in texts:
                assert form not in text
