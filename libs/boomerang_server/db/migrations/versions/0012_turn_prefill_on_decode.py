"""Router: a plan may prefill on the decode engine that holds the history (PREFILL_ON_DECODE).

Only the decision's check constraint changes; no row is rewritten (the new constraint is
checked against the existing rows, which all satisfy it).

Revision ID: 0012_turn_prefill_on_decode
Revises: 0008_turn_delivered_reuse
Create Date: 2026-12-04
"""

from boomerang_server.db import run_script

revision = "0012_turn_prefill_on_decode"
down_revision = "0008_turn_delivered_reuse"

UPGRADE = r"""
ALTER TABLE turn_plans DROP CONSTRAINT ck_turn_plans_decision;
ALTER TABLE turn_plans ADD CONSTRAINT ck_turn_plans_decision
    CHECK (decision IN ('PULL', 'RECOMPUTE', 'COLD', 'PREFILL_ON_DECODE'));
"""

DOWNGRADE = r"""
ALTER TABLE turn_plans DROP CONSTRAINT ck_turn_plans_decision;
ALTER TABLE turn_plans ADD CONSTRAINT ck_turn_plans_decision CHECK (decision IN ('PULL', 'RECOMPUTE', 'COLD'));
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
