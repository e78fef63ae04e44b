"""The tables the services use through SQLAlchemy Core: the router's `turn_plans` and the
gateway's `tenants`.

The migrations (`migrations/versions/`, hand-written SQL) create the schema and are its
truth; every other table is reached with raw SQL by its owner. These two definitions are
checked against the migrated schema (tests/integration/test_schema_models.py), so a column
added to one and not the other fails there.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import UUID

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING_CONVENTION)


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
    # Migration 0012: PREFILL_ON_DECODE.
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
