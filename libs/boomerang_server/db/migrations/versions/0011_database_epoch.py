"""Registry: the database's epoch, so a failover to a standby that missed commits is fenced.

A lease is single use only as long as the database remembers its claim. An asynchronous
standby promoted after the primary died may lack the last commits: a claim, a consume, a
supersession. On it those leases look RETAINED again, and a claim would hand out blocks a
decode engine already gave to a pull and freed.

`database_epoch` holds the one (system identifier, timeline) the registry last fenced on.
Every claim and registration statement compares it with the server's (statements.EPOCH_GUARD,
a one-time filter: a few microseconds) and, when they differ, calls
`boomerang_epoch_changed()`, which raises SQLSTATE BX001: a promotion starts a new timeline,
and a restore into another cluster has a new system identifier. The registry then fences
(`EpochFence` in `boomerang_registry/statements.py`): every live lease becomes INVALIDATED
(`TIMELINE_CHANGED` or `SYSTEM_CHANGED`), the retained ones are marked for release, and the
row takes the server's values and `fenced_at`.

The server's timeline is the WAL insert timeline in the current WAL file's name (its first
8 hex digits): right from the moment of promotion, where `pg_control_checkpoint()` still
names the old timeline until the first checkpoint after it. The system identifier comes
from `pg_control_system()`, which reads and checksums the control file on every call: the
hot-path pool reads it once per connection into `boomerang.system_identifier`
(`claim_store.py`), and the guard reads the file only on connections that did not.

Revision ID: 0011_database_epoch
Revises: 0010_lease_release
Create Date: 2026-12-04
"""

from boomerang_server.db import run_script

revision = "0011_database_epoch"
down_revision = "0010_lease_release"

UPGRADE = r"""
CREATE TABLE database_epoch (
    singleton boolean DEFAULT true NOT NULL,
    system_identifier bigint NOT NULL,
    timeline integer NOT NULL,
    fenced_at timestamptz,
    updated_at timestamptz DEFAULT now() NOT NULL,
    CONSTRAINT pk_database_epoch PRIMARY KEY (singleton),
    CONSTRAINT ck_database_epoch_singleton CHECK (singleton)
);
INSERT INTO database_epoch (system_identifier, timeline)
SELECT system_identifier, ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
FROM pg_control_system();
-- The guard's refusal (statements.EPOCH_GUARD calls it only when the epochs differ):
-- SQLSTATE BX001, naming both.
CREATE FUNCTION boomerang_epoch_changed() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    stored database_epoch%ROWTYPE;
BEGIN
    SELECT * INTO stored FROM database_epoch;
    RAISE EXCEPTION USING ERRCODE = 'BX001',
        MESSAGE = format('database epoch changed: leases were fenced on system %s timeline %s, '
                         'the server is system %s timeline %s',
                         stored.system_identifier, stored.timeline,
                         (SELECT system_identifier FROM pg_control_system()),
                         ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer);
END
$$;
GRANT SELECT ON database_epoch TO boomerang_service;
GRANT EXECUTE ON FUNCTION boomerang_epoch_changed() TO boomerang_service;
"""

DOWNGRADE = r"""
DROP FUNCTION boomerang_epoch_changed();
DROP TABLE database_epoch;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
