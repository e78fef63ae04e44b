"""Router: the delivered reuse of a turn, beside the planned reuse (`reused_tokens`).

`delivered_cached_tokens` is the prefill engine's own count of the prompt tokens it did not
compute, as the caller reported it in ReportTurn; NULL until reported, or when the engine
gave no count. Adding a nullable column with no default rewrites no partition.

Revision ID: 0008_turn_delivered_reuse
Revises: 0002_router
Create Date: 2026-12-01
"""

from alembic import op
from boomerang_server.db import split_statements

revision = "0008_turn_delivered_reuse"
down_revision = "0002_router"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE turn_plans ADD COLUMN delivered_cached_tokens bigint;
"""

DOWNGRADE = r"""
ALTER TABLE turn_plans DROP COLUMN delivered_cached_tokens;
"""


def upgrade() -> None:
    for statement in split_statements(UPGRADE):
        op.execute(statement)


def downgrade() -> None:
    for statement in split_statements(DOWNGRADE):
        op.execute(statement)
