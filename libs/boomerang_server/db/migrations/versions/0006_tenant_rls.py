"""Row-level security: tenant-scoped statements see and change only their tenant's rows.

The registry runs every tenant-scoped statement (claims, registrations, releases, reads of
a conversation) as the `boomerang_service` role with `boomerang.tenant` set for the
transaction; the policies below then refuse any row of another tenant even if a query
forgot its tenant predicate. Cross-tenant work by design (engine invalidation, expiry,
retention) runs as the owner, which row-level security does not restrict.

Revision ID: 0006_tenant_rls
Revises: 0001_registry
Create Date: 2026-11-29
"""

from boomerang_server.db import run_script

revision = "0006_tenant_rls"
down_revision = "0001_registry"

UPGRADE = r"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'boomerang_service') THEN
        CREATE ROLE boomerang_service NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- roles are cluster-wide: another database's migration created it meanwhile
END $$;
DO $$
BEGIN
    EXECUTE format('GRANT boomerang_service TO %I', current_user);
EXCEPTION WHEN duplicate_object OR invalid_grant_operation THEN
    NULL;
END $$;
GRANT USAGE ON SCHEMA public TO boomerang_service;
GRANT SELECT, INSERT, UPDATE ON leases TO boomerang_service;
GRANT SELECT, INSERT ON lease_events TO boomerang_service;
GRANT SELECT, UPDATE ON engines TO boomerang_service;
GRANT USAGE, SELECT ON SEQUENCE lease_events_event_id_seq TO boomerang_service;
GRANT EXECUTE ON FUNCTION boomerang_common_tokens(bytea, bytea, bigint, bytea, bytea, bigint, integer)
    TO boomerang_service;
ALTER TABLE leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE lease_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON leases TO boomerang_service
    USING (tenant = current_setting('boomerang.tenant', true))
    WITH CHECK (tenant = current_setting('boomerang.tenant', true));
CREATE POLICY tenant_isolation ON lease_events TO boomerang_service
    USING (tenant = current_setting('boomerang.tenant', true))
    WITH CHECK (tenant = current_setting('boomerang.tenant', true));
"""

DOWNGRADE = r"""
DROP POLICY tenant_isolation ON lease_events;
DROP POLICY tenant_isolation ON leases;
ALTER TABLE lease_events DISABLE ROW LEVEL SECURITY;
ALTER TABLE leases DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON leases, lease_events, engines FROM boomerang_service;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
