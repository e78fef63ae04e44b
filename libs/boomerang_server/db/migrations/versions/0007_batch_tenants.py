"""Row-level security for batched claims: a statement may act for a named set of tenants.

ClaimReuseBatch claims for several tenants in one statement. It runs as `boomerang_service`
with `boomerang.tenants` set for its transaction to the batch's tenants (separated by
spaces, which no tenant id contains) and `boomerang.tenant` empty; this second permissive
policy then lets the statement see and change those tenants' rows and no others. Each
claim still matches leases on its own tenant (the statement's join), so the policy is the
wall below the query, as for single-tenant statements. Unset (every other statement), the
setting is NULL and the policy admits nothing.

Revision ID: 0007_batch_tenants
Revises: 0006_tenant_rls
Create Date: 2026-12-01
"""

from boomerang_server.db import run_script

revision = "0007_batch_tenants"
down_revision = "0006_tenant_rls"

_IN_BATCH = "tenant = ANY (string_to_array(current_setting('boomerang.tenants', true), ' '))"

UPGRADE = f"""
CREATE POLICY tenant_batch ON leases TO boomerang_service
    USING ({_IN_BATCH}) WITH CHECK ({_IN_BATCH});
CREATE POLICY tenant_batch ON lease_events TO boomerang_service
    USING ({_IN_BATCH}) WITH CHECK ({_IN_BATCH});
"""

DOWNGRADE = """
DROP POLICY tenant_batch ON lease_events;
DROP POLICY tenant_batch ON leases;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
