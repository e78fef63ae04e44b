"""Bearer-token credentials of services and engines, stored hashed in Postgres."""

from __future__ import annotations

import time

import grpc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang.auth import (
    ANONYMOUS,
    Principal,
    bearer_token,
    new_token,
    tls_common_name,
    token_digest,
)
from boomerang.errors import BoomerangError, Code


class CredentialStore:
    """Looks tokens up by their SHA-256, caching answers for `cache_seconds`."""

    def __init__(self, engine: AsyncEngine, cache_seconds: float = 30.0):
        self.engine = engine
        self.cache_seconds = cache_seconds
        self._cache: dict[bytes, tuple[float, Principal | None]] = {}

    async def principal_for(self, token: str) -> Principal | None:
        """The principal a token belongs to, or None for an unknown or revoked token."""
        digest = token_digest(token)
        hit = self._cache.get(digest)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.cache_seconds:
            return hit[1]
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    text("SELECT principal FROM credentials WHERE token_sha256 = :d AND revoked_at IS NULL"),
                    {"d": digest},
                )
            ).first()
        principal = Principal.parse(row[0]) if row else None
        self._cache[digest] = (now, principal)
        return principal

    async def create(self, principal: Principal) -> str:
        """Issue a new token for `principal` (shown once; only its hash is kept)."""
        token = new_token()
        async with self.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO credentials (principal, token_sha256) VALUES (:p, :d)"),
                {"p": str(principal), "d": token_digest(token)},
            )
        return token

    async def revoke(self, principal: Principal) -> int:
        """Revoke every live token of `principal`; returns how many."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text("UPDATE credentials SET revoked_at = now() WHERE principal = :p AND revoked_at IS NULL"),
                {"p": str(principal)},
            )
            return int(result.rowcount or 0)

    async def list(self) -> list[tuple[str, str, str]]:
        """(principal, created, revoked) of every token."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT principal, created_at, revoked_at FROM credentials ORDER BY principal, created_at")
            )
            return [(r[0], r[1].isoformat(), r[2].isoformat() if r[2] else "") for r in rows]

    async def authenticate(self, context: grpc.aio.ServicerContext, required: bool) -> Principal:
        """The caller's principal from its TLS certificate or bearer token.

        A presented but unknown token is always refused; no identity at all is refused only
        when authentication is required.
        """
        common_name = tls_common_name(context)
        if common_name:
            try:
                return Principal.parse(common_name)
            except ValueError:
                raise BoomerangError(
                    Code.PERMISSION_DENIED, "UNKNOWN_PRINCIPAL", f"certificate name {common_name!r} is not a principal"
                ) from None
        token = bearer_token(context.invocation_metadata())
        if token:
            principal = await self.principal_for(token)
            if principal is None:
                raise BoomerangError(Code.UNAUTHENTICATED, "BAD_TOKEN", "the bearer token is unknown or revoked")
            return principal
        if required:
            raise BoomerangError(
                Code.UNAUTHENTICATED,
                "NO_CREDENTIALS",
                "this service requires a client certificate or an `authorization: Bearer` token",
            )
        return ANONYMOUS
