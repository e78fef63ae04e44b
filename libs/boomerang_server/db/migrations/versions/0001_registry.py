"""Registry schema: engines, leases, the append-only partitioned audit trail, claim SQL.

Revision ID: 0001_registry
Revises:
Create Date: 2026-11-29
"""

from boomerang_server.db import run_script

revision = "0001_registry"
down_revision = None

UPGRADE = r"""
CREATE TABLE engines (
    engine_id text NOT NULL,
    role text NOT NULL,
    model text NOT NULL,
    side_channel_host text DEFAULT '' NOT NULL,
    side_channel_port integer DEFAULT 0 NOT NULL,
    http_base_url text DEFAULT '' NOT NULL,
    generation bigint NOT NULL,
    kv_blocks_ttl_seconds integer NOT NULL,
    block_size integer NOT NULL,
    tp_size integer DEFAULT 1 NOT NULL,
    dcp_size integer DEFAULT 1 NOT NULL,
    pp_size integer DEFAULT 1 NOT NULL,
    bytes_per_block bigint DEFAULT 0 NOT NULL,
    kv_recompute_threshold integer DEFAULT 64 NOT NULL,
    status text NOT NULL,
    registered_at timestamptz DEFAULT now() NOT NULL,
    heartbeat_at timestamptz DEFAULT now() NOT NULL,
    in_flight_requests integer DEFAULT 0 NOT NULL,
    queued_prompt_tokens bigint DEFAULT 0 NOT NULL,
    CONSTRAINT pk_engines PRIMARY KEY (engine_id),
    CONSTRAINT ck_engines_role CHECK (role IN ('PREFILL', 'DECODE')),
    CONSTRAINT ck_engines_status CHECK (status IN ('ACTIVE', 'DEAD'))
);

CREATE TABLE leases (
    lease_id uuid NOT NULL,
    tenant text NOT NULL,
    conversation_id text NOT NULL,
    model text NOT NULL,
    engine_id text NOT NULL,
    engine_generation bigint NOT NULL,
    remote_request_id text NOT NULL,
    block_ids jsonb NOT NULL,
    num_blocks integer NOT NULL,
    num_tokens bigint NOT NULL,
    block_size integer NOT NULL,
    chain bytea NOT NULL,
    tail_hash bytea NOT NULL,
    remote_host text NOT NULL,
    remote_port integer NOT NULL,
    tp_size integer NOT NULL,
    dcp_size integer NOT NULL,
    pp_size integer NOT NULL,
    state text NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    claim_id text,
    finished_at timestamptz NOT NULL,
    created_at timestamptz DEFAULT now() NOT NULL,
    expires_at timestamptz NOT NULL,
    updated_at timestamptz DEFAULT now() NOT NULL,
    CONSTRAINT pk_leases PRIMARY KEY (lease_id),
    CONSTRAINT uq_leases_engine_id_engine_generation_remote_request_id
        UNIQUE (engine_id, engine_generation, remote_request_id),
    CONSTRAINT ck_leases_state CHECK (
        state IN ('RETAINED', 'CLAIMED', 'CONSUMED', 'EXPIRED', 'SUPERSEDED', 'INVALIDATED')),
    CONSTRAINT ck_leases_claim CHECK (state <> 'CLAIMED' OR claim_id IS NOT NULL)
);
-- The claim's only access path: a conversation's live leases.
CREATE INDEX ix_leases_live_conversation ON leases (tenant, conversation_id)
    WHERE state IN ('RETAINED', 'CLAIMED');
-- The reaper's: live leases by deadline.
CREATE INDEX ix_leases_live_expiry ON leases (expires_at) WHERE state IN ('RETAINED', 'CLAIMED');
-- Engine invalidation and retained-block totals.
CREATE INDEX ix_leases_live_engine ON leases (engine_id, engine_generation)
    WHERE state IN ('RETAINED', 'CLAIMED');
-- Audit and listing: a conversation's history, newest first; and the global listing.
CREATE INDEX ix_leases_conversation_history ON leases (tenant, conversation_id, created_at DESC);
CREATE INDEX ix_leases_created ON leases (created_at DESC, lease_id DESC);
-- A claim id names at most one lease in its conversation (retries return the same one).
CREATE UNIQUE INDEX uq_leases_claim ON leases (tenant, conversation_id, claim_id)
    WHERE claim_id IS NOT NULL;

CREATE SEQUENCE lease_events_event_id_seq;
CREATE TABLE lease_events (
    event_id bigint DEFAULT nextval('lease_events_event_id_seq') NOT NULL,
    created_at timestamptz DEFAULT now() NOT NULL,
    lease_id uuid NOT NULL,
    tenant text NOT NULL,
    conversation_id text NOT NULL,
    from_state text,
    to_state text NOT NULL,
    reason text NOT NULL,
    actor text NOT NULL,
    request_id text DEFAULT '' NOT NULL,
    claim_id text DEFAULT '' NOT NULL,
    details jsonb,
    CONSTRAINT pk_lease_events PRIMARY KEY (event_id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE lease_events_event_id_seq OWNED BY lease_events.event_id;
CREATE TABLE lease_events_default PARTITION OF lease_events DEFAULT;
CREATE INDEX ix_lease_events_lease ON lease_events (lease_id, event_id);
CREATE INDEX ix_lease_events_conversation ON lease_events (tenant, conversation_id, created_at);

-- Append-only: the audit trail can grow and whole day partitions can be dropped
-- (retention), but no row is ever changed or deleted.
CREATE FUNCTION boomerang_refuse_event_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'lease_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER lease_events_append_only BEFORE UPDATE OR DELETE ON lease_events
    FOR EACH ROW EXECUTE FUNCTION boomerang_refuse_event_change();
CREATE TRIGGER lease_events_no_truncate BEFORE TRUNCATE ON lease_events
    FOR EACH STATEMENT EXECUTE FUNCTION boomerang_refuse_event_change();

-- Daily partitions [day, day + 1) named lease_events_pYYYYMMDD, from `days_back` days ago
-- to `days_ahead` days ahead. A day that already has rows in the default partition is
-- skipped (they stay there until the default partition is emptied by an operator).
CREATE FUNCTION boomerang_ensure_event_partitions(days_back integer, days_ahead integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    d date;
    made integer := 0;
    name text;
BEGIN
    FOR d IN SELECT generate_series((now() AT TIME ZONE 'UTC')::date - days_back,
                                    (now() AT TIME ZONE 'UTC')::date + days_ahead,
                                    interval '1 day')::date LOOP
        name := 'lease_events_p' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        BEGIN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF lease_events FOR VALUES FROM (%L) TO (%L)',
                name, (d::timestamp AT TIME ZONE 'UTC'), ((d + 1)::timestamp AT TIME ZONE 'UTC'));
            made := made + 1;
        EXCEPTION WHEN check_violation THEN
            RAISE NOTICE 'skipping partition %: default partition has rows in it', name;
        END;
    END LOOP;
    RETURN made;
END $$;
SELECT boomerang_ensure_event_partitions(1, 7);

-- Tokens of the verified common prefix of two token chains (boomerang.tokenchain):
-- binary search for the longest run of equal 16-byte chained block hashes (equality is
-- monotone because each hash covers its whole prefix), plus the partial tail when the
-- sequences have the same length and their tails match.
CREATE FUNCTION boomerang_common_tokens(
    a bytea, a_tail bytea, a_tokens bigint, b bytea, b_tail bytea, b_tokens bigint,
    block_size integer)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    lo integer := 0;
    hi integer := least(length(a), length(b)) / 16;
    mid integer;
BEGIN
    WHILE lo < hi LOOP
        mid := (lo + hi + 1) / 2;
        IF substring(a FROM (mid - 1) * 16 + 1 FOR 16) = substring(b FROM (mid - 1) * 16 + 1 FOR 16) THEN
            lo := mid;
        ELSE
            hi := mid - 1;
        END IF;
    END LOOP;
    IF a_tokens = b_tokens AND lo * 16 = length(a) AND length(a_tail) = 16 AND a_tail = b_tail THEN
        RETURN a_tokens;
    END IF;
    RETURN lo::bigint * block_size;
END $$;
"""

DOWNGRADE = r"""
DROP FUNCTION boomerang_common_tokens(bytea, bytea, bigint, bytea, bytea, bigint, integer);
DROP FUNCTION boomerang_ensure_event_partitions(integer, integer);
DROP TABLE lease_events;
DROP FUNCTION boomerang_refuse_event_change();
DROP TABLE leases;
DROP TABLE engines;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
