"""The `tenants` table: create keys, list tenants, resolve a presented key to its tenant.

`TenantAuth` sits in front of the table on the request path: a verified key is cached for
`key_cache_seconds`, so a turn normally costs no database round trip, and a short database
outage does not lock out tenants that were recently seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from boomerang_server.db.models import tenants
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_gateway import keys


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
        keys.check_tenant_name(name)
        made = keys.new_key()
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
        key_id = keys.key_id_of(key)
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
        if row is None or row.disabled_at is not None or not keys.verify(key, bytes(row.key_hash)):
            return None
        return str(row.name)


class AuthUnavailable(Exception):
    """The key could not be checked (the database did not answer)."""


class TenantAuth:
    """Bearer token → tenant, with a cache of verified keys."""

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
        if not token or not keys.looks_like_key(token):
            return keys.ANONYMOUS if self.allow_anonymous else None
        if self.store is None:
            return None
        digest = keys.hash_key(token)
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
