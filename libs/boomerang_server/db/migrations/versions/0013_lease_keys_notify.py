"""Registry: notify each new lease's summary keys, for WatchLeaseKeys.

Prefill hooks and gateways keep a summary of which prompts may have a live lease
(`boomerang.leasekeys`), so a turn with nothing to pull starts without a plan. The summary
must hold a lease's keys by the time its conversation's next turn arrives, a second or less
after the turn ended, and on every registry replica: every new lease NOTIFYs channel
`boomerang_lease_keys` with its tenant, conversation id and prompt key (unit separator
between them), delivered at commit to each registry's listener, which hashes them into keys
and sends them down its watch streams.

Revision ID: 0013_lease_keys_notify
Revises: 0010_lease_release
Create Date: 2026-12-04
"""

from boomerang_server.db import run_script

revision = "0013_lease_keys_notify"
down_revision = "0011_database_epoch"

UPGRADE = r"""
CREATE FUNCTION boomerang_notify_lease_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('boomerang_lease_keys',
                      NEW.tenant || chr(31) || NEW.conversation_id || chr(31) || coalesce(NEW.prompt_key::text, ''));
    RETURN NULL;
END $$;
CREATE TRIGGER leases_notify_keys AFTER INSERT ON leases
    FOR EACH ROW EXECUTE FUNCTION boomerang_notify_lease_keys();
"""

DOWNGRADE = r"""
DROP TRIGGER leases_notify_keys ON leases;
DROP FUNCTION boomerang_notify_lease_keys();
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
