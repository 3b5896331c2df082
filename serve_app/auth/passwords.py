"""Dashboard passwords: argon2id (``argon2-cffi``), a memory-hard hash.

API keys need no slow hash (``serve_app.auth.keys``: 238 random bits), but people
choose passwords, so a stolen table must be expensive to attack offline. The
library's defaults are RFC 9106's second recommended profile (64 MiB, 3 passes);
``needs_rehash`` lets a sign-in upgrade a hash made under older parameters.
"""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from serve_app.protocol.errors import InvalidRequestError

MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024  # an unbounded input would make hashing a denial of service

_HASHER = PasswordHasher()
_DUMMY_HASH = _HASHER.hash("an unknown user's sign-in costs the same as a known one's")


def check_new_password(password: str, param: str = "password") -> None:
    """400 ``invalid_password`` for a password too short or too long to accept."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise InvalidRequestError(
            f"A password needs {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters.",
            code="invalid_password",
            param=param,
        )


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


def verify_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches; a user without a password costs one hash all the same,
    so timing does not tell which user names exist."""
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    try:
        return _HASHER.verify(stored or _DUMMY_HASH, password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(stored: str) -> bool:
    return _HASHER.check_needs_rehash(stored)
