"""The key format of docs/reference/common.md#keys and how keys are hashed."""

from __future__ import annotations

import pytest

from serve_app.auth.keys import (
    KEY_PREFIX,
    display_prefix,
    generate_key,
    hash_key,
    looks_like_key,
)


def test_generated_key_is_prefix_plus_40_base62_chars() -> None:
    key = generate_key()
    assert key.startswith("gwk_")
    body = key[len("gwk_") :]
    assert len(body) == 40
    assert body.isascii() and body.isalnum()
    assert looks_like_key(key)


def test_generated_keys_are_unique() -> None:
    assert len({generate_key() for _ in range(200)}) == 200


@pytest.mark.parametrize(
    "candidate",
    [
        "",
        "gwk_",
        "sk-" + "a" * 40,
        "gwk_" + "a" * 39,
        "gwk_" + "a" * 41,
        "gwk_" + "a" * 39 + "-",
        "gwk_" + "a" * 39 + "é",
        "gwk_" + "a" * 40 + "\n",
        " gwk_" + "a" * 40,
        "GWK_" + "a" * 40,
    ],
)
def test_malformed_keys_are_rejected(candidate: str) -> None:
    assert not looks_like_key(candidate)


def test_hash_is_stable_hex_sha256_and_depends_on_key_and_pepper() -> None:
    key = generate_key()
    digest = hash_key(key, "pepper")
    assert digest == hash_key(key, "pepper")
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest != hash_key(key, "other pepper")
    assert digest != hash_key(generate_key(), "pepper")
    assert key not in digest


def test_display_prefix_is_the_eight_chars_after_the_vendor_prefix() -> None:
    key = KEY_PREFIX + "AbCdEfGh" + "x" * 32
    assert display_prefix(key) == "AbCdEfGh"
