"""Router schema: `turn_plans`, one row per planned turn, partitioned by day.

Revision ID: 0002_router
Revises: 0001_registry
Create Date: 2026-11-30
"""

from boomerang_server.db import run_script

revision = "0002_router"
down_revision = "0001_registry"

UPGRADE = r"""
CREATE TABLE turn_plans (
    plan_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    tenant text NOT NULL,
    conversation_id text DEFAULT '' NOT NULL,
    model text NOT NULL,
    request_id text DEFAULT '' NOT NULL,
    router text DEFAULT '' NOT NULL,
    decision text NOT NULL,
    reason text NOT NULL,
    prefill_engine_id text NOT NULL,
    prefill_url text DEFAULT '' NOT NULL,
    decode_engine_id text NOT NULL,
    decode_url text DEFAULT '' NOT NULL,
    source_engine_id text,
    lease_id uuid,
    claim_id text,
    prompt_tokens bigint NOT NULL,
    verified_tokens bigint DEFAULT 0 NOT NULL,
    reused_tokens bigint DEFAULT 0 NOT NULL,
    recomputed_tokens bigint NOT NULL,
    kv_recompute_threshold integer NOT NULL,
    plan_micros integer DEFAULT 0 NOT NULL,
    reported_at timestamptz,
    handle_use text,
    claimed_lease_state text,
    retention text,
    new_lease_id uuid,
    outcome text,
    outcome_detail text,
    CONSTRAINT pk_turn_plans PRIMARY KEY (plan_id, created_at),
    CONSTRAINT ck_turn_plans_decision CHECK (decision IN ('PULL', 'RECOMPUTE', 'COLD')),
    CONSTRAINT ck_turn_plans_tokens CHECK (
        reused_tokens >= 0 AND recomputed_tokens >= 0
        AND reused_tokens + recomputed_tokens = prompt_tokens)
) PARTITION BY RANGE (created_at);
CREATE TABLE turn_plans_default PARTITION OF turn_plans DEFAULT;
-- Audit: a tenant's conversation, in order; and a tenant's plans over time.
CREATE INDEX ix_turn_plans_conversation ON turn_plans (tenant, conversation_id, created_at);
CREATE INDEX ix_turn_plans_tenant_created ON turn_plans (tenant, created_at);

-- Daily partitions [day, day + 1) named turn_plans_pYYYYMMDD, from `days_back` days ago to
-- `days_ahead` days ahead (as boomerang_ensure_event_partitions does for lease_events).
CREATE FUNCTION boomerang_ensure_turn_plan_partitions(days_back integer, days_ahead integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    d date;
    made integer := 0;
    name text;
BEGIN
    FOR d IN SELECT generate_series((now() AT TIME ZONE 'UTC')::date - days_back,
                                    (now() AT TIME ZONE 'UTC')::date + days_ahead,
                                    interval '1 day')::date LOOP
        name := 'turn_plans_p' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        BEGIN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF turn_plans FOR VALUES FROM (%L) TO (%L)',
                name, (d::timestamp AT TIME ZONE 'UTC'), ((d + 1)::timestamp AT TIME ZONE 'UTC'));
            made := made + 1;
        EXCEPTION WHEN check_violation THEN
            RAISE NOTICE 'skipping partition %: default partition has rows in it', name;
        WHEN duplicate_table THEN
            NULL;  -- another replica made it at the same moment
        END;
    END LOOP;
    RETURN made;
END $$;
SELECT boomerang_ensure_turn_plan_partitions(1, 7);
"""

DOWNGRADE = r"""
DROP FUNCTION boomerang_ensure_turn_plan_partitions(integer, integer);
DROP TABLE turn_plans;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
