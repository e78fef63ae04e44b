"""The database schema as SQLAlchemy Core tables (the migrations create it; tests compare).

`leases` holds one row per retained turn, never one per block; `lease_events` is the
append-only audit trail, partitioned by day so retention drops partitions, never rows.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING_CONVENTION)


engines = Table(
    "engines",
    metadata,
    Column("engine_id", Text, primary_key=True),
    Column("role", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("side_channel_host", Text, nullable=False, server_default=""),
    Column("side_channel_port", Integer, nullable=False, server_default="0"),
    Column("http_base_url", Text, nullable=False, server_default=""),
    Column("generation", BigInteger, nullable=False),
    Column("kv_blocks_ttl_seconds", Integer, nullable=False),
    Column("block_size", Integer, nullable=False),
    Column("tp_size", Integer, nullable=False, server_default="1"),
    Column("dcp_size", Integer, nullable=False, server_default="1"),
    Column("pp_size", Integer, nullable=False, server_default="1"),
    Column("bytes_per_block", BigInteger, nullable=False, server_default="0"),
    Column("kv_recompute_threshold", Integer, nullable=False, server_default="64"),
    Column("status", Text, nullable=False),
    Column("registered_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("in_flight_requests", Integer, nullable=False, server_default="0"),
    Column("queued_prompt_tokens", BigInteger, nullable=False, server_default="0"),
)

leases = Table(
    "leases",
    metadata,
    Column("lease_id", UUID(as_uuid=False), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("conversation_id", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("engine_id", Text, nullable=False),
    Column("engine_generation", BigInteger, nullable=False),
    Column("remote_request_id", Text, nullable=False),
    Column("block_ids", JSONB, nullable=False),
    Column("num_blocks", Integer, nullable=False),
    Column("num_tokens", BigInteger, nullable=False),
    Column("block_size", Integer, nullable=False),
    Column("chain", LargeBinary, nullable=False),
    Column("tail_hash", LargeBinary, nullable=False),
    Column("remote_host", Text, nullable=False),
    Column("remote_port", Integer, nullable=False),
    Column("tp_size", Integer, nullable=False),
    Column("dcp_size", Integer, nullable=False),
    Column("pp_size", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("version", BigInteger, nullable=False, server_default="1"),
    Column("claim_id", Text),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Migration 0009: the previous prompt, to find the lease a prompt continues without an id.
    Column("prompt_tokens", BigInteger, nullable=False, server_default="0"),
    Column("prompt_key", BigInteger),
    Column("prompt_tail", LargeBinary, nullable=False, server_default=text("'\\x'::bytea")),
    UniqueConstraint("engine_id", "engine_generation", "remote_request_id"),
)

lease_events = Table(
    "lease_events",
    metadata,
    Column("event_id", BigInteger, primary_key=True),
    Column("created_at", DateTime(timezone=True), primary_key=True, server_default=text("now()")),
    Column("lease_id", UUID(as_uuid=False), nullable=False),
    Column("tenant", Text, nullable=False),
    Column("conversation_id", Text, nullable=False),
    Column("from_state", Text),
    Column("to_state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("request_id", Text, nullable=False, server_default=""),
    Column("claim_id", Text, nullable=False, server_default=""),
    Column("details", JSONB),
    postgresql_partition_by="RANGE (created_at)",
)

from sqlalchemy import CheckConstraint, Index

# One row per turn plan (router), written asynchronously in batches: the plan when made,
# the same row again with its outcome when reported. Partitioned by day on `created_at`,
# which is the time embedded in the plan id (a UUIDv7), so a lookup by id hits one
# partition and retention drops whole partitions.
turn_plans = Table(
    "turn_plans",
    metadata,
    Column("plan_id", UUID(as_uuid=False), primary_key=True),
    Column("created_at", DateTime(timezone=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("conversation_id", Text, nullable=False, server_default=""),
    Column("model", Text, nullable=False),
    Column("request_id", Text, nullable=False, server_default=""),
    Column("router", Text, nullable=False, server_default=""),
    Column("decision", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("prefill_engine_id", Text, nullable=False),
    Column("prefill_url", Text, nullable=False, server_default=""),
    Column("decode_engine_id", Text, nullable=False),
    Column("decode_url", Text, nullable=False, server_default=""),
    Column("source_engine_id", Text),
    Column("lease_id", UUID(as_uuid=False)),
    Column("claim_id", Text),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("verified_tokens", BigInteger, nullable=False, server_default="0"),
    Column("reused_tokens", BigInteger, nullable=False, server_default="0"),
    Column("recomputed_tokens", BigInteger, nullable=False),
    Column("kv_recompute_threshold", Integer, nullable=False),
    Column("plan_micros", Integer, nullable=False, server_default="0"),
    Column("reported_at", DateTime(timezone=True)),
    Column("handle_use", Text),
    Column("claimed_lease_state", Text),
    Column("retention", Text),
    Column("new_lease_id", UUID(as_uuid=False)),
    Column("outcome", Text),
    Column("outcome_detail", Text),
    # Migration 0008: the prefill engine's own count of prompt tokens not computed (reported).
    Column("delivered_cached_tokens", BigInteger),
    # Migration 0011: PREFILL_ON_DECODE.
    CheckConstraint("decision IN ('PULL', 'RECOMPUTE', 'COLD', 'PREFILL_ON_DECODE')", name="decision"),
    CheckConstraint(
        "reused_tokens >= 0 AND recomputed_tokens >= 0 "
        "AND reused_tokens + recomputed_tokens = prompt_tokens",
        name="tokens",
    ),
    Index("ix_turn_plans_conversation", "tenant", "conversation_id", "created_at"),
    Index("ix_turn_plans_tenant_created", "tenant", "created_at"),
    postgresql_partition_by="RANGE (created_at)",
)

# TTL-reaper leader election (migration 0003): one row per election, the holder's fencing
# term and when its leadership lapses, on the database clock; `stats` is what the leader
# last published (expiry lag, counters) so any replica can report it.
reaper_leader = Table(
    "reaper_leader",
    metadata,
    Column("election", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("term", BigInteger, nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("renewed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("stats", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
)

# Gateway tenants (migration 0004): one API key per tenant, stored as SHA-256 and found by
# its public `key_id`; the key itself is shown once and never stored.
tenants = Table(
    "tenants",
    metadata,
    Column("name", Text, primary_key=True),
    Column("key_id", Text, nullable=False, unique=True),
    Column("key_hash", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("disabled_at", DateTime(timezone=True)),
)

credentials = Table(
    "credentials",
    metadata,
    Column("credential_id", BigInteger, primary_key=True),
    Column("principal", Text, nullable=False),
    Column("token_sha256", LargeBinary, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("revoked_at", DateTime(timezone=True)),
)
