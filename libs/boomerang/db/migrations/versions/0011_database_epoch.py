"""Registry: the database's epoch, so a failover to a standby that missed commits is fenced.

A lease is single use only as long as the database remembers its claim. An asynchronous
standby promoted after the primary died may lack the last commits: a claim, a consume, a
supersession. On it those leases look RETAINED again, and a claim would hand out blocks a
decode engine already gave to a pull and freed.

`database_epoch` holds the one (system identifier, timeline) the registry last fenced on.
Every claim and registration calls `boomerang_check_epoch()`, which raises SQLSTATE BX001
when the server's own differs: a promotion starts a new timeline, and a restore into
another cluster a new system identifier. The registry then fences (fence.py): every live
lease becomes INVALIDATED (`TIMELINE_CHANGED` or `SYSTEM_CHANGED`), the retained ones are
marked for release, and the row takes the server's values and `fenced_at`.

The server's timeline is the WAL insert timeline in the current WAL file's name (the first
8 hex digits): right from the moment of promotion, where `pg_control_checkpoint()` still
names the old timeline until the first checkpoint after it. The system identifier comes
from `pg_control_system()`, which reads the control file (about 30 µs): the hot-path pool
reads it once per connection into `boomerang.system_identifier` (rawsql.py), and the check
reads the file only on connections that did not.

Revision ID: 0011_database_epoch
Revises: 0010_lease_release
Create Date: 2026-12-04
"""

from alembic import op
from boomerang.db.sqlscript import split_statements

revision = "0011_database_epoch"
down_revision = "0010_lease_release"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE FUNCTION boomerang_server_timeline() RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;
CREATE FUNCTION boomerang_server_system_identifier() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT COALESCE(NULLIF(current_setting('boomerang.system_identifier', true), '')::bigint,
                    (SELECT system_identifier FROM pg_control_system()))
$$;
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
SELECT boomerang_server_system_identifier(), boomerang_server_timeline();
-- true, or SQLSTATE BX001 when the server is not the one the registry last fenced on.
CREATE FUNCTION boomerang_check_epoch() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    stored database_epoch%ROWTYPE;
    server_timeline integer := boomerang_server_timeline();
    server_system bigint := boomerang_server_system_identifier();
BEGIN
    SELECT * INTO stored FROM database_epoch;
    IF stored.timeline IS DISTINCT FROM server_timeline
       OR stored.system_identifier IS DISTINCT FROM server_system THEN
        RAISE EXCEPTION USING ERRCODE = 'BX001',
            MESSAGE = format('database epoch changed: leases were fenced on system %s timeline %s, '
                             'the server is system %s timeline %s',
                             stored.system_identifier, stored.timeline, server_system, server_timeline);
    END IF;
    RETURN true;
END
$$;
GRANT SELECT ON database_epoch TO boomerang_service;
GRANT EXECUTE ON FUNCTION boomerang_check_epoch() TO boomerang_service;
"""

DOWNGRADE = r"""
DROP FUNCTION boomerang_check_epoch();
DROP TABLE database_epoch;
DROP FUNCTION boomerang_server_system_identifier();
DROP FUNCTION boomerang_server_timeline();
"""


def upgrade() -> None:
    for statement in split_statements(UPGRADE):
        op.execute(statement)


def downgrade() -> None:
    for statement in split_statements(DOWNGRADE):
        op.execute(statement)
