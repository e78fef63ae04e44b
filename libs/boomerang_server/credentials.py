"""Bearer-token credentials of services and engines, stored hashed in Postgres."""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
from boomerang.auth import (
    AnonymousAccess,
    Principal,
    anonymous_access,
    bearer_token,
    is_loopback,
    new_token,
    tls_common_name,
    token_digest,
)
from boomerang.errors import BoomerangError, Code
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)


class CredentialStore:
    """Looks tokens up by their SHA-256, caching answers for `cache_seconds`."""

    def __init__(
        self,
        engine: AsyncEngine,
        cache_seconds: float = 30.0,
        anonymous: AnonymousAccess = AnonymousAccess.REFUSED,
        listen: str = "",
    ):
        self.engine = engine
        self.cache_seconds = cache_seconds
        self.anonymous = anonymous
        self.listen = listen
        self._cache: dict[bytes, tuple[float, Principal | None]] = {}

    @classmethod
    def for_listener(cls, engine: AsyncEngine, service: str, listen: str, settings: Any) -> CredentialStore:
        """The store of a gRPC service on `listen`, its anonymous policy from `settings` (logged)."""
        access = anonymous_policy(service, listen, settings.require_auth, settings.insecure_allow_anonymous)
        return cls(engine, anonymous=access, listen=listen)

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

    async def authenticate(self, context: grpc.aio.ServicerContext, required: bool = False) -> Principal:
        """The caller's principal from its TLS certificate or bearer token.

        A presented but unknown token is always refused; no identity at all is refused when
        `required` or when the store's `anonymous` policy refuses it (beyond loopback).
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
        admitted = None if required else self.anonymous.principal
        if admitted is None:
            raise BoomerangError(Code.UNAUTHENTICATED, "NO_CREDENTIALS", self._refusal())
        return admitted

    def _refusal(self) -> str:
        why = (
            f"it listens on {self.listen}, beyond loopback"
            if self.listen and not is_loopback(self.listen)
            else "BOOMERANG_REQUIRE_AUTH is set"
        )
        return (
            f"this service requires a client certificate or an `authorization: Bearer` token ({why}): "
            "issue one with `boomerang credentials create service:NAME` (or engine:ENGINE_ID) and give it "
            "to the caller as BOOMERANG_AUTH_TOKEN or BOOMERANG_AUTH_TOKEN_FILE "
            "(development only: BOOMERANG_INSECURE_ALLOW_ANONYMOUS=true on the service)"
        )


def anonymous_policy(service: str, listen: str, require_auth: bool, insecure_allow_anonymous: bool) -> AnonymousAccess:
    """The anonymous policy of `service` on `listen`, logged at start-up (loudly when insecure).

    Contradictory settings stop the process with a message.
    """
    try:
        access = anonymous_access(listen, require_auth, insecure_allow_anonymous)
    except ValueError as exc:
        raise SystemExit(f"boomerang {service}: {exc}") from None
    if access is AnonymousAccess.INSECURE:
        log.warning(
            "INSECURE: %s on %s serves anonymous callers as trusted services, who may act for any engine "
            "(BOOMERANG_INSECURE_ALLOW_ANONYMOUS=true). Development only: never expose this port.",
            service, listen,
        )
    elif access is AnonymousAccess.LOOPBACK:
        log.info("%s on loopback %s: anonymous local callers allowed (BOOMERANG_REQUIRE_AUTH=true refuses them)",
                 service, listen)
    else:
        log.info("%s on %s: callers must present a client certificate or a bearer token", service, listen)
    return access
