"""Router: the delivered reuse of a turn, beside the planned reuse (`reused_tokens`).

`delivered_cached_tokens` is the prefill engine's own count of the prompt tokens it did not
compute, as the caller reported it in ReportTurn; NULL until reported, or when the engine
gave no count. Adding a nullable column with no default rewrites no partition.

Revision ID: 0008_turn_delivered_reuse
Revises: 0002_router
Create Date: 2026-12-01
"""

from boomerang_server.db import run_script

revision = "0008_turn_delivered_reuse"
down_revision = "0002_router"

UPGRADE = r"""
ALTER TABLE turn_plans ADD COLUMN delivered_cached_tokens bigint;
"""

DOWNGRADE = r"""
ALTER TABLE turn_plans DROP COLUMN delivered_cached_tokens;
"""


def upgrade() -> None:
    run_script(UPGRADE)


def downgrade() -> None:
    run_script(DOWNGRADE)
