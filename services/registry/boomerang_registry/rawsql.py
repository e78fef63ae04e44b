"""The registry's pool for every tenant-scoped and hot statement: plain asyncpg.

`boomerang bench --profile` showed a claim through SQLAlchemy costing several round trips
besides the statement itself (the pool's pre-ping, BEGIN, `set_config`, COMMIT) and
SQLAlchemy's per-execute work in the registry's event loop. Here a claim is `set_config` of
the tenant for the session, then the claim as one autocommit statement (one statement is
one transaction, so it stays atomic): two short round trips, no BEGIN/COMMIT. Connections
run as the row-level-security role (migration 0006), with generic plans forced so the long
claim statement is planned once per connection rather than on each call.

Every use that reads or changes leases or events sets `boomerang.tenant` and
`boomerang.tenants` (a batch's tenants) before its statement on a connection it holds
exclusively, so a session-level setting left on a pooled connection is never relied on;
that is also why a connection goes back to the pool without asyncpg's reset query. The one
use that sets no tenant (`fetch_global`) touches only `engines`, which has no row-level
security.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import asyncpg
from boomerang import telemetry
from boomerang_server.config import asyncpg_dsn

from boomerang_registry.fence import epoch_changed

Row = Mapping[Any, Any]  # a result row by column name (an asyncpg Record, or SQLAlchemy's RowMapping)

_NAMED = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
# Each sets both settings, so a batch's tenant list never outlives the use that set it.
SET_TENANT_SESSION = "SELECT set_config('boomerang.tenant', $1, false), set_config('boomerang.tenants', '', false)"
SET_TENANT_LOCAL = "SELECT set_config('boomerang.tenant', $1, true), set_config('boomerang.tenants', '', true)"
# A batch's tenants (space-separated), no single tenant (migration 0007).
SET_TENANTS_SESSION = "SELECT set_config('boomerang.tenant', '', false), set_config('boomerang.tenants', $1, false)"
SET_TENANTS_LOCAL = "SELECT set_config('boomerang.tenant', '', true), set_config('boomerang.tenants', :t, true)"

SET_SYSTEM_IDENTIFIER = (
    "SELECT set_config('boomerang.system_identifier', system_identifier::text, false) FROM pg_control_system()"
)


def positional(sql: str) -> tuple[str, list[str]]:
    """`:name` parameters (SQLAlchemy style) as asyncpg's `$n`; the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _NAMED.sub(number, sql), names


def rounds(keys: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Positions of `keys` in rounds holding each (tenant, conversation) at most once, in order.

    A batched statement takes at most one item per conversation (two claims could pick the
    same lease; a second registration must see the first's lease to supersede it); later
    items on the same conversation go in later rounds, which see the earlier ones' effects.
    """
    out: list[list[int]] = []
    seen: list[set[tuple[str, str]]] = []
    for n, key in enumerate(keys):
        k = next((k for k, used in enumerate(seen) if key not in used), len(out))
        if k == len(out):
            out.append([])
            seen.append(set())
        out[k].append(n)
        seen[k].add(key)
    return out


@contextmanager
def db_span(operation: str) -> Iterator[None]:
    """A client span for a statement when tracing is on (SQLAlchemy's instrumentation does not
    see this pool)."""
    if not telemetry.enabled():
        yield
        return
    # deferred: OpenTelemetry loads only once tracing is on
    from opentelemetry import trace

    tracer = trace.get_tracer("boomerang.registry")
    with tracer.start_as_current_span(
        operation, kind=trace.SpanKind.CLIENT,
        attributes={"db.system": "postgresql", "db.operation.name": operation},
    ):
        yield


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without asyncpg's default reset query (a round trip per release): every user
    of this pool sets the tenant before its statement, and asyncpg still rolls back a
    transaction left open."""


async def _init(conn: asyncpg.Connection) -> None:
    # As SQLAlchemy's asyncpg dialect does: jsonb parameters go as the JSON text the
    # repository already made, results come back decoded.
    await conn.set_type_codec("jsonb", encoder=str, decoder=json.loads, schema="pg_catalog")
    # The server's system identifier for the failover fence's per-statement check (migration
    # 0011): read from the control file once per connection, not on every claim. A session
    # lives on one server, so the value never goes stale.
    await conn.execute(SET_SYSTEM_IDENTIFIER)


class TenantPool:
    """An asyncpg pool for tenant-scoped hot-path statements."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool
        self._compiled: dict[str, tuple[str, list[str]]] = {}

    @classmethod
    async def open(
        cls,
        url: str,
        size: int,
        role: str = "",
        application_name: str = "boomerang-registry",
        warm: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> TenantPool:
        """Connect `size` connections (as `role` when given).

        Each new connection runs the `warm` statements once (with no tenant set, so they see
        and change nothing): the hot statements are then prepared and planned, and the
        prefix function compiled, before the first call that needs them."""
        settings = {"application_name": application_name, "plan_cache_mode": "force_generic_plan", "jit": "off"}
        if role:
            settings["role"] = role
        warm_args = []
        for sql, params in warm:
            query, names = positional(sql)
            warm_args.append((query, [params[n] for n in names]))

        async def init(conn: asyncpg.Connection) -> None:
            await _init(conn)
            for query, args in warm_args:
                try:
                    await conn.fetch(query, *args)
                except asyncpg.PostgresError as exc:
                    # A new connection after a failover, before the fence ran: the connection
                    # is sound, and its first claim runs the fence (fence.py).
                    if not epoch_changed(exc):
                        raise
                    return

        dsn = asyncpg_dsn(url)
        pool = await asyncpg.create_pool(dsn, min_size=size, max_size=size, init=init, reset=_keep_session,
                                         server_settings=settings, command_timeout=10, timeout=5)
        return cls(pool)

    async def close(self) -> None:
        """Close every connection."""
        await self.pool.close()

    def compile(self, sql: str) -> tuple[str, list[str]]:
        """The positional form of `sql` (cached)."""
        found = self._compiled.get(sql)
        if found is None:
            found = self._compiled[sql] = positional(sql)
        return found

    def args(self, sql: str, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The positional statement and its arguments."""
        query, names = self.compile(sql)
        return query, [params[n] for n in names]

    async def fetch_as(
        self, tenant: str | Sequence[str], sql: str, params: Mapping[str, Any], operation: str
    ) -> Sequence[asyncpg.Record]:
        """Run one statement (its own transaction) as `tenant`, or as a batch's tenants (a list
        of them, and no single tenant); its rows.

        Two round trips: the setting is the session's, and every use of this pool sets both
        `boomerang.tenant` and `boomerang.tenants` before its statement (SET_TENANT_SESSION,
        SET_TENANTS_SESSION, SET_TENANT_LOCAL), so a tenant list left on a pooled connection
        is never in force for anything else."""
        query, args = self.args(sql, params)
        with db_span(operation):
            async with self.pool.acquire() as conn:
                if isinstance(tenant, str):
                    await conn.execute(SET_TENANT_SESSION, tenant)
                else:
                    await conn.execute(SET_TENANTS_SESSION, " ".join(tenant))
                return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetch_global(self, sql: str, params: Mapping[str, Any], operation: str) -> Sequence[asyncpg.Record]:
        """Run one statement (its own transaction) on `engines` only: no tenant is set, and
        none left on the connection matters, since `engines` has no row-level security."""
        query, args = self.args(sql, params)
        with db_span(operation):
            async with self.pool.acquire() as conn:
                return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    @asynccontextmanager
    async def transaction(self, tenant: str | None = None) -> AsyncIterator[Transaction]:
        """One connection in a transaction, as `tenant` when given (for this transaction only);
        otherwise the caller sets the tenants before each statement (`Transaction.as_tenants`)."""
        async with self.pool.acquire() as conn, conn.transaction():
            tx = Transaction(self, conn)
            if tenant is not None:
                await conn.execute(SET_TENANT_LOCAL, tenant)
            yield tx


class Transaction:
    """Named-parameter statements on one connection of a `TenantPool`, inside its transaction."""

    def __init__(self, pool: TenantPool, conn: asyncpg.Connection):
        self.pool = pool
        self.conn = conn
        self._tenants: str | None = None  # what `as_tenants` last set in this transaction

    async def as_tenants(self, tenants: Sequence[str]) -> None:
        """Scope the rest of the transaction to `tenants` (a batch's), and to no single tenant.

        Setting the same list again is skipped: a turn end sets its tenant for the claim's
        settlement, and its registration would set it once more (a round trip of nothing)."""
        joined = " ".join(tenants)
        if joined == self._tenants:
            return
        await self.conn.execute(self.pool.compile(SET_TENANTS_LOCAL)[0], joined)
        self._tenants = joined

    async def fetch(self, sql: str, params: Mapping[str, Any]) -> list[asyncpg.Record]:
        """The statement's rows."""
        query, args = self.pool.args(sql, params)
        return await self.conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetchrow(self, sql: str, params: Mapping[str, Any]) -> asyncpg.Record | None:
        """The statement's first row, if any."""
        query, args = self.pool.args(sql, params)
        return await self.conn.fetchrow(query, *args)

    async def fetchval(self, sql: str, params: Mapping[str, Any]) -> Any:
        """The first column of the statement's first row."""
        query, args = self.pool.args(sql, params)
        return await self.conn.fetchval(query, *args)
