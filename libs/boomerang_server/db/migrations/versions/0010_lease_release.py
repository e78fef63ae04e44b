"""Registry: release decode memory that will never be pulled.

A lease that can never be handed out again (superseded, invalidated one by one, expired,
consumed, or released early by the retention policy or memory pressure) still pins its
blocks on the decode engine until vLLM's own TTL runs out. The statement that ends such a
lease also sets `release_pending`; the engine's next heartbeat takes its pending releases
in the same statement that records the heartbeat (clearing the flag) and D's hook moves
those requests' send expiry to now. A lost answer costs nothing but memory: D still frees
at its TTL.

`RELEASED` is the state of a lease the retention policy or memory pressure ended early.
Engines report their free and total KV blocks in heartbeats (0: not reported).

Adding columns with constant defaults rewrites no table (PostgreSQL 11+).

Revision ID: 0010_lease_release
Revises: 0009_lease_prompt_key
Create Date: 2026-12-02
"""

from boomerang_server.db import run_script

revision = "0010_lease_release"
down_revision = "0009_lease_prompt_key"

UPGRADE = r"""
ALTER TABLE leases DROP CONSTRAINT ck_leases_state;
ALTER TABLE leases ADD CONSTRAINT ck_leases_state CHECK (
    state IN ('RETAINED', 'CLAIMED', 'CONSUMED', 'EXPIRED', 'SUPERSEDED', 'INVALIDATED', 'RELEASED'));
ALTER TABLE leases ADD COLUMN release_pending boolean DEFAULT false NOT NULL;
-- A heartbeat takes its engine's pending releases: a few rows, found without a scan.
CREATE INDEX ix_leases_release_pending ON leases (engine_id) WHERE release_pending;
ALTER TABLE engines ADD COLUMN free_kv_blocks bigint DEFAULT 0 NOT NULL;
ALTER TABLE engines ADD COLUMN total_kv_blocks bigint DEFAULT 0 NOT NULL;
-- The heartbeat's releases: an engine's leases belong to every tenant, so the hot-path role
-- (row-level security) takes them through this owner-run function, in the heartbeat's own
-- statement. Releases of older generations are dropped (that process holds no blocks).
CREATE FUNCTION boomerang_take_releases(p_engine text, p_generation bigint) RETURNS jsonb
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH taken AS (
        UPDATE leases SET release_pending = false
        WHERE engine_id = p_engine AND release_pending
        RETURNING lease_id, remote_request_id, state, engine_generation
    )
    SELECT COALESCE(jsonb_agg(jsonb_build_array(lease_id::text, remote_request_id, state)), '[]'::jsonb)
    FROM taken WHERE engine_generation = p_generation
$$;
REVOKE ALL ON FUNCTION boomerang_take_releases(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION boomerang_take_releases(text, bigint) TO boomerang_service;
"""

DOWNGRADE = r"""
DROP FUNCTION boomerang_take_releases(text, bigint);
ALTER TABLE engines DROP COLUMN total_kv_blocks;
ALTER TABLE engines DROP COLUMN free_kv_blocks;
DROP INDEX ix_leases_release_pending;
ALTER TABLE leases DROP COLUMN release_pending;
UPDATE leases SET state = 'EXPIRED' WHERE state = 'RELEASED';
ALTER TABLE leases DROP CONSTRAINT ck_leases_state;
ALTER TABLE leases ADD CONSTRAINT ck_leases_state CHECK (
    state IN ('RETAINED', 'CLAIMED', 'CONSUMED', 'EXPIRED', 'SUPERSEDED', 'INVALIDATED'));
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
