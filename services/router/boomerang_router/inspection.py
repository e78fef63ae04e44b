"""The SQL others run against the router's table, `turn_plans`.

The router owns `turn_plans`; every statement naming it lives in this package (repository.py
writes and reads it for the RPCs; see docs/design.md, "Who owns which table", and
tests/unit/test_table_owners.py). The statements here are run outside the router's process,
by `boomerang status --database-url` and `boomerang audit --database-url`.
"""

from __future__ import annotations

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

# A conversation's plans (`{tenant}` is "" or " AND tenant = :tenant").
CONVERSATION_PLANS_SQL = """
SELECT plan_id::text AS plan_id, tenant, created_at, decision, reason, prompt_tokens, reused_tokens,
       recomputed_tokens, verified_tokens, prefill_engine_id, decode_engine_id,
       COALESCE(source_engine_id, '') AS source_engine_id, COALESCE(lease_id::text, '') AS lease_id,
       COALESCE(claim_id, '') AS claim_id, reported_at, COALESCE(handle_use, '') AS handle_use,
       COALESCE(claimed_lease_state, '') AS claimed_lease_state, COALESCE(retention, '') AS retention,
       COALESCE(new_lease_id::text, '') AS new_lease_id, COALESCE(outcome, '') AS outcome,
       COALESCE(outcome_detail, '') AS outcome_detail, plan_micros
FROM turn_plans WHERE conversation_id = :conversation{tenant} ORDER BY created_at, plan_id LIMIT 10000
"""
