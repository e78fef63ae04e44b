"""What others read of the router's table, `turn_plans`, straight from Postgres.

The router owns `turn_plans`; every statement naming it lives in this package (repository.py
writes and reads it for the RPCs; see docs/design.md, "Who owns which table", and
tests/unit/test_table_owners.py). Readers go through the router's RPCs (ListTurnPlans,
GetTurnPlan); the one exception is `boomerang status --database-url`, the exact window of
reuse an operator reads from the database (also while the services are down), which calls
`reuse_window` here rather than running SQL of its own.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Reuse over the last `:window` seconds, by decision and reason.
WINDOW_PLANS_SQL = """
SELECT decision, reason, count(*) AS turns, COALESCE(sum(prompt_tokens), 0) AS prompt_tokens,
       COALESCE(sum(reused_tokens), 0) AS reused_tokens
FROM turn_plans WHERE created_at >= now() - make_interval(secs => :window)
GROUP BY decision, reason ORDER BY decision, reason
"""

# Planned against delivered reuse over the window, one row per miss reason (NULL: no miss).
# A turn missed when the plan reused nothing (its reason) or the prefill engine reported
# fewer cached tokens than planned (PREFILL_SHORTFALL).
WINDOW_OUTCOMES_SQL = """
SELECT CASE WHEN decision <> 'PULL' THEN reason
            WHEN delivered_cached_tokens < reused_tokens THEN 'PREFILL_SHORTFALL' END AS miss,
       count(*) AS turns,
       COALESCE(sum(prompt_tokens), 0) AS prompt_tokens,
       COALESCE(sum(reused_tokens), 0) AS planned_tokens,
       COALESCE(sum(delivered_cached_tokens), 0) AS delivered_tokens,
       COALESCE(sum(reused_tokens) FILTER (WHERE delivered_cached_tokens IS NOT NULL), 0) AS planned_reported_tokens,
       count(delivered_cached_tokens) AS reported_turns
FROM turn_plans WHERE created_at >= now() - make_interval(secs => :window)
GROUP BY 1
"""


async def reuse_window(conn: AsyncConnection, window: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last `window` seconds of plans: counts by decision and reason, and by miss reason."""
    params = {"window": window}
    plans = [dict(r._mapping) for r in await conn.execute(text(WINDOW_PLANS_SQL), params)]
    outcomes = [dict(r._mapping) for r in await conn.execute(text(WINDOW_OUTCOMES_SQL), params)]
    return plans, outcomes
