"""Registry: find the lease a prompt continues without a conversation id.

A lease records its previous prompt (what the decode engine was asked): its length
(`prompt_tokens`, 0 when the registration did not say), the key of its last whole block's
chain hash (`prompt_key`, the hash's first 8 bytes as a bigint; NULL below one block) and
the SHA-256 of its partial last block chained to that hash (`prompt_tail`, empty when the
prompt ends on a block boundary). A claim without a conversation id probes the tenant's
live leases by key with every whole-block hash of the new prompt: one index scan.

Claims without a conversation id find their own earlier claim (a retry) by claim id alone,
so claim ids get an index of their own.

Adding columns with constant defaults rewrites no table (PostgreSQL 11+).

Revision ID: 0009_lease_prompt_key
Revises: 0007_batch_tenants
Create Date: 2026-12-02
"""

from boomerang_server.db import run_script

revision = "0009_lease_prompt_key"
down_revision = "0007_batch_tenants"

UPGRADE = r"""
ALTER TABLE leases ADD COLUMN prompt_tokens bigint DEFAULT 0 NOT NULL;
ALTER TABLE leases ADD COLUMN prompt_key bigint;
ALTER TABLE leases ADD COLUMN prompt_tail bytea DEFAULT '\x'::bytea NOT NULL;
-- The claim without a conversation id: a tenant's live leases by their prompt's key.
CREATE INDEX ix_leases_live_prompt_key ON leases (tenant, prompt_key)
    WHERE state IN ('RETAINED', 'CLAIMED') AND prompt_key IS NOT NULL;
-- Its retry: the lease a claim id holds, whatever its conversation.
CREATE INDEX ix_leases_claim_id ON leases (tenant, claim_id) WHERE claim_id IS NOT NULL;
"""

DOWNGRADE = r"""
DROP INDEX ix_leases_claim_id;
DROP INDEX ix_leases_live_prompt_key;
ALTER TABLE leases DROP COLUMN prompt_tail;
ALTER TABLE leases DROP COLUMN prompt_key;
ALTER TABLE leases DROP COLUMN prompt_tokens;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
