"""Tenant API keys: made once, stored only as a hash, checked in constant time.

A key is `bmr_<key_id>_<secret>`: `key_id` (12 hex digits) is public and finds the tenant's
row; `secret` carries 256 random bits. The row keeps SHA-256 of the whole key. With that
much entropy a fast hash is safe (nothing to brute-force), and comparing digests with
`hmac.compare_digest` leaks nothing through timing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "bmr_"
ANONYMOUS = "anonymous"
_KEY = re.compile(r"^bmr_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class NewKey:
    """A freshly made key: the secret to show once, and what to store."""

    key: str
    key_id: str
    key_hash: bytes


def hash_key(key: str) -> bytes:
    """SHA-256 of the whole key (what the database stores)."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def new_key() -> NewKey:
    """A new random key."""
    key_id = secrets.token_hex(6)
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return NewKey(key, key_id, hash_key(key))


def key_id_of(key: str) -> str | None:
    """The public id of a well-formed key, or None when it is not a Boomerang key."""
    match = _KEY.match(key)
    return match.group(1) if match else None


def looks_like_key(token: str) -> bool:
    """Whether a bearer token claims to be a Boomerang key (starts with `bmr_`)."""
    return token.startswith(PREFIX)


def verify(key: str, stored_hash: bytes) -> bool:
    """Whether `key` hashes to `stored_hash`, compared in constant time."""
    return hmac.compare_digest(hash_key(key), stored_hash)


def check_tenant_name(name: str) -> str:
    """The name if valid, else ValueError: 1–128 of letters, digits, `.`, `_`, `-`."""
    if not _NAME.match(name):
        raise ValueError(
            "tenant names are 1-128 characters of letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    if name == ANONYMOUS:
        raise ValueError(f"{ANONYMOUS!r} is reserved for requests without a key")
    return name
