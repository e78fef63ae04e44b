"""TTL reaper: the leader-election row and the lease-deadline notifications.

`reaper_leader` holds one row per election: the replica that leads, its fencing term, and
the moment its leadership lapses, all on the database clock. The registry's fenced
statements (ExpireLeases, SweepEngines, EnforceEventRetention) check this row in their own
transaction, so a paused leader's late writes are refused.

The deadline notifications let the reaper sleep until the next deadline instead of
polling: every new lease NOTIFYs channel `boomerang_lease_deadlines` with its deadline
(epoch seconds), delivered at commit. A registration batch commits once, so it takes the
notification lock once; claims and other state changes notify nothing (a lease that ends
early only costs the reaper a wake-up that expires nothing, and ExpireLeases then reports
the exact next deadline).

Revision ID: 0003_reaper
Revises: 0001_registry
Create Date: 2026-11-29
"""

from boomerang_server.db import run_script

revision = "0003_reaper"
down_revision = "0001_registry"

UPGRADE = r"""
CREATE TABLE reaper_leader (
    election text NOT NULL,
    holder text NOT NULL,
    term bigint NOT NULL,
    acquired_at timestamptz DEFAULT now() NOT NULL,
    renewed_at timestamptz DEFAULT now() NOT NULL,
    expires_at timestamptz NOT NULL,
    stats jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT pk_reaper_leader PRIMARY KEY (election),
    CONSTRAINT ck_reaper_leader_term CHECK (term >= 1)
);

CREATE FUNCTION boomerang_notify_lease_deadline() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('boomerang_lease_deadlines', extract(epoch FROM NEW.expires_at)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER leases_notify_deadline AFTER INSERT ON leases
    FOR EACH ROW EXECUTE FUNCTION boomerang_notify_lease_deadline();
-- A deadline moved earlier must wake the reaper too (none does today; later ones need not).
CREATE TRIGGER leases_notify_deadline_moved AFTER UPDATE OF expires_at ON leases
    FOR EACH ROW WHEN (NEW.expires_at < OLD.expires_at AND NEW.state IN ('RETAINED', 'CLAIMED'))
    EXECUTE FUNCTION boomerang_notify_lease_deadline();
"""

DOWNGRADE = r"""
DROP TRIGGER leases_notify_deadline_moved ON leases;
DROP TRIGGER leases_notify_deadline ON leases;
DROP FUNCTION boomerang_notify_lease_deadline();
DROP TABLE reaper_leader;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
