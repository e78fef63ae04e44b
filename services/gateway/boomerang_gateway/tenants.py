"""Who may call the gateway: tenants, their API keys, and each tenant's rate.

A key is `bmr_<key_id>_<secret>`: `key_id` (12 hex digits) is public and finds the tenant's
row in the `tenants` table; `secret` carries 256 random bits. The row keeps SHA-256 of the
whole key. With that much entropy a fast hash is safe (nothing to brute-force), and comparing
digests with `hmac.compare_digest` leaks nothing through timing.

`TenantAuth` sits in front of the table on the request path: a verified key is cached for
`key_cache_seconds`, so a turn normally costs no database round trip, and a short database
outage does not lock out tenants that were recently seen.

`TenantRateLimiter` keeps a token bucket per tenant, refilled continuously: a tenant may send
`rate` requests per second on average and up to `burst` at once; past that it gets HTTP 429
with `Retry-After`. One noisy tenant cannot starve the others of the gateway, the control
plane or the engines. Buckets of idle tenants are forgotten (a full bucket holds no
information), so memory stays bounded by the active tenants.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from boomerang_server.db.models import tenants
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

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


class TenantExists(Exception):
    """`tenants create` for a name that is taken."""


@dataclass(frozen=True)
class TenantRow:
    """A tenant as listed (never with its key)."""

    name: str
    key_id: str
    created_at: datetime
    disabled: bool


class TenantStore:
    """SQL for the `tenants` table."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def create(self, name: str) -> str:
        """Create a tenant and return its new key (the only time it is visible)."""
        check_tenant_name(name)
        made = new_key()
        try:
            async with self.engine.begin() as conn:
                await conn.execute(
                    insert(tenants).values(name=name, key_id=made.key_id, key_hash=made.key_hash)
                )
        except IntegrityError as exc:
            if "pk_tenants" in str(exc.orig):
                raise TenantExists(f"tenant {name!r} already exists") from None
            raise
        return made.key

    async def list(self) -> list[TenantRow]:
        """Every tenant by name."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(tenants.c.name, tenants.c.key_id, tenants.c.created_at, tenants.c.disabled_at).order_by(
                    tenants.c.name
                )
            )
            return [TenantRow(r.name, r.key_id, r.created_at, r.disabled_at is not None) for r in rows]

    async def resolve(self, key: str) -> str | None:
        """The tenant owning `key`, or None for an unknown, wrong or disabled key."""
        key_id = key_id_of(key)
        if key_id is None:
            return None
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(tenants.c.name, tenants.c.key_hash, tenants.c.disabled_at).where(
                        tenants.c.key_id == key_id
                    )
                )
            ).first()
        if row is None or row.disabled_at is not None or not verify(key, bytes(row.key_hash)):
            return None
        return str(row.name)


class AuthUnavailable(Exception):
    """The key could not be checked (the database did not answer)."""


class TenantAuth:
    """Bearer token → tenant, with a cache of verified """

    def __init__(self, store: TenantStore | None, allow_anonymous: bool, cache_seconds: float):
        self.store = store
        self.allow_anonymous = allow_anonymous
        self.cache_seconds = cache_seconds
        # SHA-256 of the key → (tenant, cached until); the key itself is never kept.
        self._cache: dict[bytes, tuple[str, float]] = {}

    async def tenant_for(self, authorization: str | None) -> str | None:
        """The tenant for an `Authorization` header value, or None (401).

        With `allow_anonymous`, a missing token, or one that is not a Boomerang key (such as
        the `EMPTY` placeholder vLLM clients send), is tenant `anonymous`; a token that looks
        like a Boomerang key must verify.
        """
        token = _bearer(authorization)
        if not token or not looks_like_key(token):
            return ANONYMOUS if self.allow_anonymous else None
        if self.store is None:
            return None
        digest = hash_key(token)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        try:
            tenant = await self.store.resolve(token)
        except Exception as exc:
            raise AuthUnavailable(str(exc)) from exc
        if tenant is not None and self.cache_seconds > 0:
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[digest] = (tenant, now + self.cache_seconds)
        return tenant


def _bearer(authorization: str | None) -> str:
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class TenantRateLimiter:
    """Token buckets keyed by tenant; `rate` ≤ 0 turns limiting off."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic, max_tenants: int = 100_000):
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.max_tenants = max_tenants
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant → (tokens, at)

    @property
    def enabled(self) -> bool:
        """Whether any limit applies."""
        return self.rate > 0

    def acquire(self, tenant: str) -> float:
        """Take one request's token: 0.0 when allowed, else seconds until one is available."""
        if not self.enabled:
            return 0.0
        now = self.clock()
        tokens, at = self._buckets.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[tenant] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_tenants:
                self._forget_full(now)
            return 0.0
        self._buckets[tenant] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        full_after = self.burst / self.rate
        for tenant, (_, at) in list(self._buckets.items()):
            if now - at >= full_after:
                del self._buckets[tenant]


def retry_after_header(wait: float) -> dict[str, str]:
    """`Retry-After` in whole seconds (at least 1), as HTTP wants it."""
    return {"Retry-After": str(max(1, math.ceil(wait)))}
