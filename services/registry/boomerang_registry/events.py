"""The lease trail: a conversation's leases and events (GetConversation), ListLeases, and
the registration history (ListRegistrations).

A tenant's reads run on the hot-path pool as that tenant (row-level security); an
operator's listing across tenants and the history run as the owner. Pages are keyed by
(created_at, lease_id), newest first.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from boomerang.errors import not_found
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.claim_store import Row, TenantPool
from boomerang_registry.statements import LEASE_COLUMNS

_CONVERSATION_LEASES_SQL = (
    f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.tenant = :t AND l.conversation_id = :c "
    "ORDER BY l.created_at DESC, l.lease_id DESC LIMIT 100"
)
_CONVERSATION_EVENTS_SQL = (
    "SELECT event_id, lease_id::text AS lease_id, from_state, to_state, reason, actor, "
    "request_id, claim_id, created_at FROM lease_events "
    "WHERE tenant = :t AND conversation_id = :c ORDER BY event_id"
)


# The history window, fixed on the database clock by the first page.
_WINDOW_SQL = "SELECT now() - make_interval(secs => CAST(:hours AS float8) * 3600) AS since, now() AS until"
# Each lease registered in the window with its first claim (one probe of the per-lease event
# index in the window's partitions) and its engine's block size and TTL.
_REGISTRATIONS_SQL = """
SELECT l.created_at, l.lease_id::text AS lease_id, l.tenant, l.model, l.conversation_id, l.num_blocks,
       l.state, l.finished_at,
       (SELECT min(c.created_at) FROM lease_events c
        WHERE c.lease_id = l.lease_id AND c.to_state = 'CLAIMED' AND c.created_at >= :since) AS claimed_at,
       COALESCE(e.bytes_per_block, 0) AS bytes_per_block, COALESCE(e.kv_blocks_ttl_seconds, 0) AS engine_ttl_seconds
FROM leases l LEFT JOIN engines e ON e.engine_id = l.engine_id
WHERE l.created_at >= :since AND l.created_at <= :until AND (:tenant = '' OR l.tenant = :tenant)
  AND (l.created_at, l.lease_id) < (:after_created, CAST(:after_id AS uuid))
ORDER BY l.created_at DESC, l.lease_id DESC LIMIT :limit
"""
_MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"


def _encode(*parts: str) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode()


def _decode(token: str, n: int) -> tuple[list[datetime], str]:
    """The n - 1 instants and the lease id a page token encodes; ValueError when malformed."""
    try:
        parts = json.loads(base64.urlsafe_b64decode(token.encode()))
        if not isinstance(parts, list) or len(parts) != n:
            raise ValueError(token)
        return [datetime.fromisoformat(str(p)) for p in parts[:-1]], str(uuid.UUID(str(parts[-1])))
    except Exception as exc:
        raise ValueError("page_token is not one this service issued") from exc


def decode_page_token(token: str) -> tuple[datetime, str]:
    """The (created_at, lease_id) position a ListLeases page token encodes; ValueError when
    malformed."""
    (created,), lease_id = _decode(token, 2)
    return created, lease_id


def decode_history_token(token: str) -> tuple[datetime, datetime, datetime, str]:
    """The window (since, until) and the position a ListRegistrations page token encodes."""
    (since, until, created), lease_id = _decode(token, 4)
    return since, until, created, lease_id


def _list_leases_sql(
    tenant: str, engine_id: str, states: Sequence[str], page_size: int, page_token: str
) -> tuple[str, dict[str, Any]]:
    clauses = ["TRUE"]
    params: dict[str, Any] = {"limit": page_size + 1}
    if tenant:
        clauses.append("l.tenant = :tenant")
        params["tenant"] = tenant
    if engine_id:
        clauses.append("l.engine_id = :engine_id")
        params["engine_id"] = engine_id
    if states:
        clauses.append("l.state = ANY(CAST(:states AS text[]))")
        params["states"] = list(states)
    if page_token:
        created, last_id = decode_page_token(page_token)
        clauses.append("(l.created_at, l.lease_id) < (:after_created, CAST(:after_id AS uuid))")
        params.update(after_created=created, after_id=last_id)
    sql = (
        f"SELECT {LEASE_COLUMNS} FROM leases l WHERE {' AND '.join(clauses)} "
        "ORDER BY l.created_at DESC, l.lease_id DESC LIMIT :limit"
    )
    return sql, params


class EventStore:
    """GetConversation, ListLeases and ListRegistrations."""

    def __init__(self, owner: AsyncEngine, pool: TenantPool):
        self.owner = owner
        self.pool = pool

    async def conversation(self, tenant: str, conversation_id: str, include_events: bool) -> tuple[list[Row], list[Row]]:
        """A conversation's newest 100 leases and, if asked, their events."""
        params = {"t": tenant, "c": conversation_id}
        async with self.pool.transaction(tenant) as tx:
            leases: list[Row] = list(await tx.fetch(_CONVERSATION_LEASES_SQL, params))
            if not leases:
                raise not_found(
                    "CONVERSATION_NOT_FOUND", f"no leases recorded for conversation {conversation_id!r}"
                )
            events: list[Row] = list(await tx.fetch(_CONVERSATION_EVENTS_SQL, params)) if include_events else []
            return leases, events

    async def list_leases(
        self, tenant: str, engine_id: str, states: Sequence[str], page_size: int, page_token: str
    ) -> tuple[list[Row], str]:
        """A page of leases newest first, and the next page's token."""
        sql, params = _list_leases_sql(tenant, engine_id, states, page_size, page_token)
        rows: list[Row]
        if tenant:
            async with self.pool.transaction(tenant) as tx:
                rows = list(await tx.fetch(sql, params))
        else:  # an operator's listing across tenants
            async with self.owner.connect() as conn:
                rows = [r._mapping for r in await conn.execute(text(sql), params)]
        next_token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            next_token = _encode(rows[-1]["created_at"].isoformat(), rows[-1]["lease_id"])
        return rows, next_token

    async def registrations(
        self, tenant: str, hours: float, page_size: int, page_token: str
    ) -> tuple[list[Row], datetime, datetime, str]:
        """A page of the leases registered in the last `hours` (all tenants' when `tenant` is
        empty), newest first; the window (since, until); the next page's token."""
        async with self.owner.connect() as conn:
            if page_token:
                since, until, after_created, after_id = decode_history_token(page_token)
            else:
                window = (await conn.execute(text(_WINDOW_SQL), {"hours": hours})).one()
                since, until = window.since, window.until
                after_created, after_id = until, _MAX_UUID
            params = {"since": since, "until": until, "tenant": tenant, "after_created": after_created,
                      "after_id": after_id, "limit": page_size + 1}
            rows: list[Row] = [r._mapping for r in await conn.execute(text(_REGISTRATIONS_SQL), params)]
        next_token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            last = rows[-1]
            next_token = _encode(since.isoformat(), until.isoformat(), last["created_at"].isoformat(), last["lease_id"])
        return rows, since, until, next_token
