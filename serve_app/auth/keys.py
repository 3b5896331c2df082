"""The API key format (docs/reference/common.md#keys) and how keys are stored.

A key is a fixed vendor prefix followed by 40 base62 characters from
``secrets`` (about 238 bits), so it cannot be guessed and needs no slow
password hash: a keyed HMAC-SHA256 is enough and keeps the hot path cheap. The
optional pepper lives outside the database, so a leaked table alone does not
let anyone test candidate keys offline.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string

KEY_PREFIX = "gwk_"
KEY_BODY_LENGTH = 40
DISPLAY_PREFIX_LENGTH = 8
BASE62_ALPHABET = string.digits + string.ascii_letters

_KEY_PATTERN = re.compile(rf"{re.escape(KEY_PREFIX)}[0-9A-Za-z]{{{KEY_BODY_LENGTH}}}")


def generate_key() -> str:
    """A new raw key; it is shown to its owner once and never stored."""
    body = "".join(secrets.choice(BASE62_ALPHABET) for _ in range(KEY_BODY_LENGTH))
    return KEY_PREFIX + body


def hash_key(raw: str, pepper: str) -> str:
    """The value stored and looked up in ``api_keys.key_hash`` (hex HMAC-SHA256)."""
    return hmac.new(pepper.encode(), raw.encode(), hashlib.sha256).hexdigest()


def looks_like_key(raw: str) -> bool:
    """Whether ``raw`` has the key format, so malformed input never reaches the database."""
    return _KEY_PATTERN.fullmatch(raw) is not None


def display_prefix(raw: str) -> str:
    """The characters after the vendor prefix that a key listing may show."""
    return raw[len(KEY_PREFIX) : len(KEY_PREFIX) + DISPLAY_PREFIX_LENGTH]
