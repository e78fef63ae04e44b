"""The registry's hot statements, each the one production runs (on claim_store.py's pool).

A lease is one retained turn. `RETAINED → CLAIMED → CONSUMED`, or
`RETAINED → EXPIRED | SUPERSEDED | INVALIDATED | RELEASED`, and `CLAIMED → RETAINED` only when the
prefill node reports it never read. A claimed lease can still expire or be invalidated
(the decode node frees its blocks at its own deadline whoever holds the claim), never be
released. Each transition is one guarded SQL statement (here and in expiry.py): the
state a statement requires is in its WHERE clause.

Every lease state change appends its `lease_events` row in the same statement; the claim
is one statement on the `(tenant, conversation_id)` live-lease index. Tests run these same
constants; nothing else holds a second copy of them.

The failover fence is here too, beside the guard every claim and registration statement
carries (EPOCH_GUARD): no lease used on a lost timeline is ever claimed again.

Single use rests on the database remembering every claim. After a failover to an
asynchronous standby that missed the last commits, a lease claimed and consumed on the old
primary is RETAINED again on the new one, and its decode engine has freed the blocks.

Migration 0011's `database_epoch` row holds the (system identifier, timeline) the registry
last fenced on, and every claim and registration statement checks it (EPOCH_GUARD),
raising SQLSTATE BX001 when the server's differs (a promotion starts a new timeline).
Nothing of that statement is applied. The caller (`fenced`) then runs the fence once for
the whole process and repeats its call:

- in one transaction, under the epoch row's lock (so concurrent fences run it once);
- every live lease (RETAINED or CLAIMED) becomes INVALIDATED, its event naming the reason
  (`TIMELINE_CHANGED` or `SYSTEM_CHANGED`) and both epochs; the RETAINED ones are marked
  for release, so their decode engines free the blocks at their next heartbeat (a CLAIMED
  one may be under a pull right now, and is never released under its puller, as at expiry);
- the row takes the server's values and `fenced_at`, from which registrations of turns that
  finished before the fence are refused (`FINISHED_BEFORE_FAILOVER`): such a turn may have
  been registered, pulled and freed on the lost timeline, and a late repeat of its
  registration (a retry, or the gateway's report of a turn the hook already registered)
  would otherwise make it claimable again.

The cost is one missed pull per conversation with a live lease; never a wrong one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from boomerang_registry.metrics import FENCED_LEASES, FENCES

LEASE_COLUMNS = """
    l.lease_id::text AS lease_id, l.tenant, l.conversation_id, l.model, l.engine_id,
    l.engine_generation, l.remote_request_id, l.block_ids, l.num_blocks, l.num_tokens,
    l.block_size, l.state, l.version, l.claim_id, l.finished_at, l.created_at, l.expires_at,
    l.updated_at, l.remote_host, l.remote_port, l.tp_size, l.dcp_size, l.pp_size
"""

ENGINE_COLUMNS = """
    e.engine_id, e.role, e.model, e.side_channel_host, e.side_channel_port, e.http_base_url,
    e.generation, e.kv_blocks_ttl_seconds, e.block_size, e.tp_size, e.dcp_size, e.pp_size,
    e.bytes_per_block, e.kv_recompute_threshold, e.status, e.registered_at, e.heartbeat_at,
    e.in_flight_requests, e.queued_prompt_tokens, e.free_kv_blocks, e.total_kv_blocks
"""

# Blocks held by live leases, per engine: one scan of the live-lease index for all engines.
RETAINED_SQL = """
SELECT engine_id, sum(num_blocks) AS blocks FROM leases
WHERE state IN ('RETAINED', 'CLAIMED') GROUP BY engine_id
"""


# Moves the leases selected by {where} to :to_state and appends one event per lease.
TRANSITION_SQL = """
WITH old AS (
    SELECT lease_id, tenant, conversation_id, state FROM leases WHERE {where} FOR UPDATE
), moved AS (
    UPDATE leases l SET state = CAST(:to_state AS text), version = l.version + 1,
           updated_at = now() {extra_set}
    FROM old WHERE l.tenant = old.tenant AND l.conversation_id = old.conversation_id
      AND l.lease_id = old.lease_id
    RETURNING l.lease_id, l.tenant, l.conversation_id, l.claim_id, old.state AS from_state
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state,
                              reason, actor, request_id, claim_id)
    SELECT lease_id, tenant, conversation_id, from_state, CAST(:to_state AS text),
           CAST(:reason AS text), CAST(:actor AS text), CAST(:request_id AS text),
           COALESCE(claim_id, CAST(:event_claim_id AS text))
    FROM moved
)
SELECT lease_id::text AS lease_id FROM moved
"""

# A consume (CompleteTurn, the claim read) in one statement: the lease, locked; moved CLAIMED → CONSUMED (one event, as
# TRANSITION_SQL writes it) when `claim_id` holds it, and marked for release (P's read
# normally frees D's blocks already; the release frees them if a read notice went missing). Its row after the move, marked `moved`;
# otherwise its row as locked (after any concurrent consume committed: the statement's own
# snapshot would still read CLAIMED), for the caller to explain why nothing moved; or no row.
CONSUME_SQL = f"""
WITH old AS (
    SELECT {LEASE_COLUMNS} FROM leases l
    WHERE l.tenant = :tenant AND l.lease_id = CAST(:id AS uuid) FOR UPDATE
), moved AS (
    UPDATE leases l SET state = 'CONSUMED', version = l.version + 1, updated_at = now(),
           release_pending = true
    FROM old WHERE l.tenant = old.tenant AND l.conversation_id = old.conversation_id
      AND l.lease_id = CAST(old.lease_id AS uuid) AND old.state = 'CLAIMED' AND old.claim_id = :claim_id
    RETURNING {LEASE_COLUMNS}, true AS moved
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state,
                              reason, actor, request_id, claim_id)
    SELECT CAST(lease_id AS uuid), tenant, conversation_id, 'CLAIMED', 'CONSUMED', 'PREFILL_READ',
           CAST(:actor AS text), CAST(:claim_id AS text), claim_id
    FROM moved
)
SELECT * FROM moved
UNION ALL
SELECT *, false AS moved FROM old WHERE NOT EXISTS (SELECT 1 FROM moved)
"""

# The server's WAL insert timeline (right from the moment of promotion) and system
# identifier (read once per pool connection into the setting, claim_store.py; else from the
# control file). Inline, not SQL functions: one calling the volatile pg_current_wal_lsn()
# would be planned again on every call.
SERVER_TIMELINE = "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer"
SERVER_SYSTEM_IDENTIFIER = (
    "COALESCE(NULLIF(current_setting('boomerang.system_identifier', true), '')::bigint, "
    "(SELECT system_identifier FROM pg_control_system()))"
)
# A statement's gate: an uncorrelated subquery, so a one-time filter evaluated once per
# execution (a few microseconds). It raises SQLSTATE BX001 (boomerang_epoch_changed()) when
# the server's timeline or system identifier is not the one the registry fenced on
# (migration 0011, EpochFence below), so no claim and no registration lands on a new timeline
# before every lease that might have been used on the lost one is invalidated.
EPOCH_GUARD = f"""COALESCE((SELECT CASE WHEN e.timeline = {SERVER_TIMELINE}
                               AND e.system_identifier = {SERVER_SYSTEM_IDENTIFIER}
                          THEN true ELSE boomerang_epoch_changed() END
                   FROM database_epoch e), boomerang_epoch_changed())"""


def claim_statement(lease_key: str, candidates: str, order: str, found_by: str = "") -> str:
    """A claim statement around its own candidate CTEs: one statement, one round trip.

    `candidates` defines `cands` (lease_id, state, expires_at, engine_ok, block_size_ok,
    common_tokens, remaining_seconds, and whatever `order` ranks by); `lease_key` is the
    condition on `leases l` that scopes every lookup to the claim's own index key. The rest
    is every claim's: a retried claim id finds its earlier lease (`prior`) and takes no new
    one; else the best qualifying RETAINED candidate is claimed under its row lock (a
    concurrent claimer re-checks `state = 'RETAINED'` after the lock and finds nothing;
    claim_store.py then asks once more, since the winner may be its own claim id), its CLAIMED
    event (noting `found_by` when given) appended in the same statement. Rows: the claimed
    lease, or the prior one, or every candidate, for claim_store.claim_result to explain. On a
    server whose epoch is not the one fenced on, EPOCH_GUARD refuses the whole statement.
    """
    details = "'reusable_tokens', common_tokens" + (f", 'found_by', '{found_by}'" if found_by else "")
    return f"""
WITH prior AS (
    SELECT l.lease_id FROM leases l
    WHERE {EPOCH_GUARD} AND {lease_key}
      AND l.claim_id = :claim_id AND l.state IN ('CLAIMED', 'CONSUMED')
), {candidates}, pick AS (
    SELECT lease_id, common_tokens FROM cands
    WHERE NOT EXISTS (SELECT 1 FROM prior) AND state = 'RETAINED' AND engine_ok
      AND common_tokens >= :min_tokens AND common_tokens > 0
      AND remaining_seconds > :min_remaining
    ORDER BY {order}
    LIMIT 1
), claimed AS (
    UPDATE leases l SET state = 'CLAIMED', claim_id = :claim_id, version = l.version + 1,
                        updated_at = now()
    FROM pick
    WHERE {lease_key}
      AND l.lease_id = pick.lease_id AND l.state = 'RETAINED'
      AND l.expires_at > now() + make_interval(secs => CAST(:min_remaining AS float8))
    RETURNING {LEASE_COLUMNS}, pick.common_tokens,
              EXTRACT(EPOCH FROM l.expires_at - now())::float8 AS remaining_seconds
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason,
                              actor, request_id, claim_id, details)
    SELECT CAST(lease_id AS uuid), tenant, conversation_id, 'RETAINED', 'CLAIMED', 'CLAIMED',
           :actor, :claim_id, :claim_id, jsonb_build_object({details})
    FROM claimed
)
SELECT 'claimed' AS kind, TRUE AS engine_ok, TRUE AS block_size_ok, claimed.* FROM claimed
UNION ALL
SELECT 'prior', TRUE, TRUE, {LEASE_COLUMNS},
       boomerang_common_tokens(l.chain, l.tail_hash, l.num_tokens, :chain, :tail_hash,
                               :num_tokens, l.block_size),
       EXTRACT(EPOCH FROM l.expires_at - now())::float8
FROM prior JOIN leases l ON {lease_key}
                       AND l.lease_id = prior.lease_id
UNION ALL
SELECT 'candidate', c.engine_ok, c.block_size_ok, {LEASE_COLUMNS}, c.common_tokens,
       c.remaining_seconds
FROM cands c JOIN leases l ON {lease_key}
                       AND l.lease_id = c.lease_id
"""


# ClaimReuse with a conversation id: the conversation's live leases, found on the live-lease
# index, each one's prefix verified against the prompt; the best is claimed. With no live
# lease at all, the conversation's newest lease when the retention policy or memory pressure
# released it (`released`: reuse lost to an early release), one probe of the
# conversation-history index.
CLAIM_SQL = claim_statement(
    lease_key="l.tenant = :tenant AND l.conversation_id = :conversation_id",
    candidates="""cands AS (
    SELECT l.lease_id, l.state, l.expires_at,
           (e.status = 'ACTIVE' AND e.generation = l.engine_generation) AS engine_ok,
           (l.block_size = :block_size) AS block_size_ok,
           CASE WHEN l.block_size = :block_size THEN
               boomerang_common_tokens(l.chain, l.tail_hash, l.num_tokens,
                                       :chain, :tail_hash, :num_tokens, l.block_size)
           ELSE 0 END AS common_tokens,
           EXTRACT(EPOCH FROM l.expires_at - now())::float8 AS remaining_seconds
    FROM leases l JOIN engines e ON e.engine_id = l.engine_id
    WHERE l.tenant = :tenant AND l.conversation_id = :conversation_id
      AND l.state IN ('RETAINED', 'CLAIMED')
      AND (:model = '' OR l.model = :model)
)""",
    order="common_tokens DESC, expires_at DESC",
) + f"""UNION ALL
SELECT 'released', FALSE, TRUE, {LEASE_COLUMNS}, 0, 0::float8
FROM (SELECT * FROM leases n WHERE n.tenant = :tenant AND n.conversation_id = :conversation_id
        AND (:model = '' OR n.model = :model)
      ORDER BY n.created_at DESC LIMIT 1) l
WHERE l.state = 'RELEASED' AND NOT EXISTS (SELECT 1 FROM cands) AND NOT EXISTS (SELECT 1 FROM prior)
"""

# Where a released claim goes: back to RETAINED only while live, valid and newest.
RELEASE_TARGET_SQL = """
SELECT CASE
    WHEN l.expires_at <= now() THEN 'EXPIRED'
    WHEN e.status <> 'ACTIVE' OR e.generation <> l.engine_generation THEN 'INVALIDATED'
    WHEN EXISTS (SELECT 1 FROM leases n WHERE n.tenant = l.tenant
                 AND n.conversation_id = l.conversation_id AND l.conversation_id <> ''
                 AND n.state IN ('RETAINED', 'CLAIMED') AND n.finished_at > l.finished_at)
        THEN 'SUPERSEDED'
    ELSE 'RETAINED' END
FROM leases l JOIN engines e ON e.engine_id = l.engine_id
WHERE l.lease_id = CAST(:id AS uuid)
"""

LIVE_LEASE_FILTER = "state IN ('RETAINED', 'CLAIMED')"

# TRANSITION_SQL's selection for a release (CompleteTurn, the claim not read): the tenant's claimed lease.
CLAIMED_LEASE_WHERE = "tenant = :tenant AND lease_id = CAST(:id AS uuid) AND state = 'CLAIMED'"
# A release's move: back to RETAINED (no longer held by the claim), or to where
# RELEASE_TARGET_SQL says it ends instead (the claim id stays for the record).
RELEASE_SQL = TRANSITION_SQL.format(where=CLAIMED_LEASE_WHERE, extra_set=", claim_id = NULL")
# A claim that ends its lease (unread) leaves nothing anyone will pull: D is told to free it.
RELEASE_ENDED_SQL = TRANSITION_SQL.format(where=CLAIMED_LEASE_WHERE, extra_set=", release_pending = true")

# A lease of the tenant in force (row-level security), by id.
LEASE_SQL = f"SELECT {LEASE_COLUMNS} FROM leases l WHERE l.lease_id = CAST(:id AS uuid)"

# A heartbeat in one statement: the engine's row when `generation` is its current one, else
# no row (the caller then reads why); asked by the engine itself, with the releases pending
# for it (`released`, a JSON array of [lease_id, remote_request_id, state]), taken (cleared)
# in the same statement by migration 0010's owner-run function (an engine's leases belong to
# every tenant).
HEARTBEAT_SQL = f"""
WITH hb AS (
    UPDATE engines e SET heartbeat_at = now(), status = 'ACTIVE',
        in_flight_requests = :in_flight, queued_prompt_tokens = :queued,
        free_kv_blocks = :free_blocks, total_kv_blocks = :total_blocks
    WHERE e.engine_id = :engine_id AND e.generation = :generation
    RETURNING {ENGINE_COLUMNS}
)
SELECT hb.*, CASE WHEN CAST(:take_releases AS boolean)
                 THEN boomerang_take_releases(hb.engine_id, hb.generation) END AS released
FROM hb
"""

# CLAIM_SQL for many claims in one statement: the claims arrive as parallel arrays
# (UNNEST), each row `i` one claim, and every CTE of CLAIM_SQL is the same per claim, joined
# on the claim's own tenant and conversation. Each claim locks and re-checks its pick
# exactly as CLAIM_SQL does, so a concurrent claimer (in another statement) still loses on
# the row lock and reads ALREADY_CLAIMED. The caller puts at most one claim per
# conversation in a statement (two claims on one conversation could pick the same lease,
# and an UPDATE changes a row once). Rows carry `i`; their tenant is the claim's.
CLAIM_BATCH_SQL = f"""
WITH q AS (
    SELECT * FROM unnest(CAST(:i AS int[]), CAST(:tenant AS text[]), CAST(:conversation_id AS text[]),
                         CAST(:claim_id AS text[]), CAST(:block_size AS int[]), CAST(:chain AS bytea[]),
                         CAST(:tail_hash AS bytea[]), CAST(:num_tokens AS bigint[]), CAST(:model AS text[]),
                         CAST(:min_tokens AS bigint[]), CAST(:min_remaining AS float8[]))
        AS q(i, tenant, conversation_id, claim_id, block_size, chain, tail_hash, num_tokens, model,
             min_tokens, min_remaining)
    WHERE {EPOCH_GUARD}
), prior AS (
    SELECT q.i, p.lease_id, q.tenant, q.conversation_id, q.chain, q.tail_hash, q.num_tokens
    FROM q CROSS JOIN LATERAL (
        SELECT l.lease_id FROM leases l
        WHERE l.tenant = q.tenant AND l.conversation_id = q.conversation_id
          AND l.claim_id = q.claim_id AND l.state IN ('CLAIMED', 'CONSUMED') OFFSET 0
    ) p
), cands AS (
    -- OFFSET 0 keeps each claim's lookup a parameterized index scan of its own conversation.
    SELECT q.i, c.* FROM q CROSS JOIN LATERAL (
        SELECT l.lease_id, l.state, l.expires_at,
               (e.status = 'ACTIVE' AND e.generation = l.engine_generation) AS engine_ok,
               (l.block_size = q.block_size) AS block_size_ok,
               CASE WHEN l.block_size = q.block_size THEN
                   boomerang_common_tokens(l.chain, l.tail_hash, l.num_tokens,
                                           q.chain, q.tail_hash, q.num_tokens, l.block_size)
               ELSE 0 END AS common_tokens,
               EXTRACT(EPOCH FROM l.expires_at - now())::float8 AS remaining_seconds
        FROM leases l JOIN engines e ON e.engine_id = l.engine_id
        WHERE l.tenant = q.tenant AND l.conversation_id = q.conversation_id
          AND l.state IN ('RETAINED', 'CLAIMED') AND (q.model = '' OR l.model = q.model)
        OFFSET 0
    ) c
), pick AS (
    SELECT DISTINCT ON (c.i) c.i, c.lease_id, c.common_tokens, q.claim_id, q.min_remaining,
           q.tenant, q.conversation_id
    FROM cands c JOIN q ON q.i = c.i
    WHERE NOT EXISTS (SELECT 1 FROM prior p WHERE p.i = c.i) AND c.state = 'RETAINED' AND c.engine_ok
      AND c.common_tokens >= q.min_tokens AND c.common_tokens > 0
      AND c.remaining_seconds > q.min_remaining
    ORDER BY c.i, c.common_tokens DESC, c.expires_at DESC
), claimed AS (
    UPDATE leases l SET state = 'CLAIMED', claim_id = pick.claim_id, version = l.version + 1,
                        updated_at = now()
    FROM pick
    WHERE l.tenant = pick.tenant AND l.conversation_id = pick.conversation_id
      AND l.lease_id = pick.lease_id AND l.state = 'RETAINED'
      AND l.expires_at > now() + make_interval(secs => pick.min_remaining)
    RETURNING pick.i, {LEASE_COLUMNS}, pick.common_tokens,
              EXTRACT(EPOCH FROM l.expires_at - now())::float8 AS remaining_seconds
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason,
                              actor, request_id, claim_id, details)
    SELECT CAST(lease_id AS uuid), tenant, conversation_id, 'RETAINED', 'CLAIMED', 'CLAIMED',
           :actor, claim_id, claim_id, jsonb_build_object('reusable_tokens', common_tokens)
    FROM claimed
)
SELECT 'claimed' AS kind, TRUE AS engine_ok, TRUE AS block_size_ok, claimed.* FROM claimed
UNION ALL
SELECT 'prior', TRUE, TRUE, prior.i, {LEASE_COLUMNS},
       boomerang_common_tokens(l.chain, l.tail_hash, l.num_tokens, prior.chain, prior.tail_hash,
                               prior.num_tokens, l.block_size),
       EXTRACT(EPOCH FROM l.expires_at - now())::float8
FROM prior JOIN leases l ON l.tenant = prior.tenant AND l.conversation_id = prior.conversation_id
                       AND l.lease_id = prior.lease_id
UNION ALL
SELECT 'candidate', c.engine_ok, c.block_size_ok, c.i, {LEASE_COLUMNS}, c.common_tokens,
       c.remaining_seconds
FROM cands c JOIN q ON q.i = c.i
             JOIN leases l ON l.tenant = q.tenant AND l.conversation_id = q.conversation_id
                          AND l.lease_id = c.lease_id
UNION ALL
SELECT 'released', FALSE, TRUE, q.i, {LEASE_COLUMNS}, 0, 0::float8
FROM q CROSS JOIN LATERAL (
    SELECT * FROM leases n WHERE n.tenant = q.tenant AND n.conversation_id = q.conversation_id
      AND (q.model = '' OR n.model = q.model)
    ORDER BY n.created_at DESC LIMIT 1
) l
WHERE l.state = 'RELEASED' AND NOT EXISTS (SELECT 1 FROM cands c WHERE c.i = q.i)
  AND NOT EXISTS (SELECT 1 FROM prior p WHERE p.i = q.i)
"""


# Claims that match nothing (no tenant is set while they run), to prepare and plan the claim
# statements on each new hot-path connection before traffic needs them.
_NOTHING = {"tenant": "", "conversation_id": "", "claim_id": "", "block_size": 16, "chain": b"",
            "tail_hash": b"", "num_tokens": 0, "model": "", "min_tokens": 1, "min_remaining": 5.0,
            "actor": "warm-up"}
WARM_UP = (
    (CLAIM_SQL, _NOTHING),
    (CLAIM_BATCH_SQL, {**{k: [v] for k, v in _NOTHING.items() if k != "actor"}, "i": [0], "actor": "warm-up"}),
)

# A registration after a failover fence is only of a turn that finished after it (by
# `margin`, the allowance for D's clock): one that finished before may have been
# registered, pulled and freed on the lost timeline (EpochFence). `epoch` is database_epoch's row.
FINISHED_AFTER_FENCE = """(epoch.fenced_at IS NULL OR LEAST(COALESCE(r.finished_at, now()), now())
           >= epoch.fenced_at + make_interval(secs => CAST(:margin AS float8)))"""

# Registration, for one registration or many in one statement (the group commit's): one
# multi-row INSERT from parallel arrays (row `i` one registration), each new lease
# superseding its own conversation's older RETAINED leases, one REGISTERED event per new
# lease and one SUPERSEDED event per superseded one. The caller puts at most one
# registration per conversation in a statement (a second one must see the first's lease to
# supersede it). A lease without a conversation id supersedes nothing: it is found only by
# the prompt that continues it. A registration already recorded, or refused by its engine or
# by the failover fence (FINISHED_AFTER_FENCE), returns no row.
REGISTER_BATCH_SQL = f"""
WITH r AS (
    SELECT * FROM unnest(CAST(:i AS int[]), CAST(:lease_id AS uuid[]), CAST(:tenant AS text[]),
                         CAST(:conversation_id AS text[]), CAST(:model AS text[]), CAST(:engine_id AS text[]),
                         CAST(:generation AS bigint[]), CAST(:remote_request_id AS text[]),
                         CAST(:block_ids AS jsonb[]), CAST(:num_blocks AS int[]), CAST(:num_tokens AS bigint[]),
                         CAST(:block_size AS int[]), CAST(:chain AS bytea[]), CAST(:tail_hash AS bytea[]),
                         CAST(:remote_host AS text[]), CAST(:remote_port AS int[]),
                         CAST(:finished_at AS timestamptz[]), CAST(:request_id AS text[]),
                         CAST(:prompt_tokens AS bigint[]), CAST(:prompt_key AS bigint[]),
                         CAST(:prompt_tail AS bytea[]))
        AS r(i, lease_id, tenant, conversation_id, model, engine_id, generation, remote_request_id,
             block_ids, num_blocks, num_tokens, block_size, chain, tail_hash, remote_host, remote_port,
             finished_at, request_id, prompt_tokens, prompt_key, prompt_tail)
), epoch AS (
    SELECT fenced_at FROM database_epoch WHERE {EPOCH_GUARD}
), eng AS (
    SELECT * FROM engines WHERE engine_id IN (SELECT engine_id FROM r) FOR SHARE
), ins AS (
    INSERT INTO leases AS l (lease_id, tenant, conversation_id, model, engine_id, engine_generation,
                        remote_request_id, block_ids, num_blocks, num_tokens, block_size, chain,
                        tail_hash, remote_host, remote_port, tp_size, dcp_size, pp_size, state,
                        finished_at, expires_at, prompt_tokens, prompt_key, prompt_tail)
    SELECT r.lease_id, r.tenant, r.conversation_id, COALESCE(NULLIF(r.model, ''), eng.model),
           eng.engine_id, r.generation, r.remote_request_id, r.block_ids, r.num_blocks, r.num_tokens,
           r.block_size, r.chain, r.tail_hash,
           COALESCE(NULLIF(r.remote_host, ''), eng.side_channel_host),
           COALESCE(NULLIF(r.remote_port, 0), eng.side_channel_port),
           eng.tp_size, eng.dcp_size, eng.pp_size, 'RETAINED',
           LEAST(COALESCE(r.finished_at, now()), now()),
           LEAST(COALESCE(r.finished_at, now()), now())
             + make_interval(secs => eng.kv_blocks_ttl_seconds - CAST(:margin AS float8)),
           r.prompt_tokens, r.prompt_key, r.prompt_tail
    FROM r JOIN eng ON eng.engine_id = r.engine_id CROSS JOIN epoch
    WHERE eng.generation = r.generation AND eng.status = 'ACTIVE'
      AND eng.role = 'DECODE' AND eng.block_size = r.block_size
      AND {FINISHED_AFTER_FENCE}
    ON CONFLICT (engine_id, engine_generation, remote_request_id) DO NOTHING
    RETURNING {LEASE_COLUMNS}
), sup_old AS (
    SELECT l.lease_id, l.tenant, l.conversation_id, ins.lease_id AS by_lease FROM leases l JOIN ins
      ON l.tenant = ins.tenant AND l.conversation_id = ins.conversation_id
    WHERE l.state = 'RETAINED' AND l.finished_at <= ins.finished_at AND ins.conversation_id <> ''
    FOR UPDATE OF l
), sup AS (
    UPDATE leases l SET state = 'SUPERSEDED', version = l.version + 1, updated_at = now(),
           release_pending = true
    FROM sup_old WHERE l.tenant = sup_old.tenant AND l.conversation_id = sup_old.conversation_id
      AND l.lease_id = sup_old.lease_id
    RETURNING l.lease_id, l.tenant, l.conversation_id, sup_old.by_lease
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state, reason,
                              actor, request_id, details)
    SELECT r.lease_id, ins.tenant, ins.conversation_id, NULL, 'RETAINED', 'REGISTERED', :actor,
           r.request_id, NULL
    FROM ins JOIN r ON r.lease_id = CAST(ins.lease_id AS uuid)
    UNION ALL
    SELECT sup.lease_id, sup.tenant, sup.conversation_id, 'RETAINED', 'SUPERSEDED', 'SUPERSEDED',
           :actor, r.request_id, jsonb_build_object('superseded_by', sup.by_lease)
    FROM sup JOIN r ON r.lease_id = CAST(sup.by_lease AS uuid)
)
SELECT r.i, (SELECT count(*) FROM sup WHERE sup.by_lease = ins.lease_id) AS superseded, ins.*
FROM ins JOIN r ON r.lease_id = CAST(ins.lease_id AS uuid)
"""


# The failover fence.

log = logging.getLogger(__name__)
T = TypeVar("T")

EPOCH_CHANGED_SQLSTATE = "BX001"  # the guard's refusal (boomerang_epoch_changed())

_LOCK_EPOCH_SQL = "SELECT system_identifier, timeline FROM database_epoch FOR UPDATE"
_SERVER_EPOCH_SQL = (
    f"SELECT system_identifier, {SERVER_TIMELINE} AS timeline FROM pg_control_system()"
)
_STORE_EPOCH_SQL = """
INSERT INTO database_epoch (system_identifier, timeline, fenced_at)
VALUES (:system_identifier, :timeline, now())
ON CONFLICT (singleton) DO UPDATE SET system_identifier = EXCLUDED.system_identifier,
    timeline = EXCLUDED.timeline, fenced_at = now(), updated_at = now()
"""
# Every live lease of every tenant to INVALIDATED, one event each with both epochs; the
# unclaimed ones marked for release (SET reads the row before the update).
FENCE_LEASES_SQL = f"""
WITH old AS (
    SELECT lease_id, tenant, conversation_id, state FROM leases WHERE {LIVE_LEASE_FILTER} FOR UPDATE
), moved AS (
    UPDATE leases l SET state = 'INVALIDATED', version = l.version + 1, updated_at = now(),
           release_pending = (l.state = 'RETAINED')
    FROM old WHERE l.tenant = old.tenant AND l.conversation_id = old.conversation_id
      AND l.lease_id = old.lease_id
    RETURNING l.lease_id, l.tenant, l.conversation_id, l.claim_id, old.state AS from_state
), ev AS (
    INSERT INTO lease_events (lease_id, tenant, conversation_id, from_state, to_state,
                              reason, actor, request_id, claim_id, details)
    SELECT lease_id, tenant, conversation_id, from_state, 'INVALIDATED', CAST(:reason AS text),
           CAST(:actor AS text), '', COALESCE(claim_id, ''), CAST(:details AS jsonb)
    FROM moved
)
SELECT count(*) AS fenced, count(*) FILTER (WHERE from_state = 'RETAINED') AS released FROM moved
"""


def epoch_changed(exc: BaseException) -> bool:
    """Whether `exc` is the epoch guard's refusal: the server is on a new epoch."""
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate == EPOCH_CHANGED_SQLSTATE


class EpochFence:
    """Runs the fence at most once at a time per process; callers share the running one."""

    def __init__(self, owner: AsyncEngine, actor: str):
        self.owner = owner
        self.actor = actor
        self._running: asyncio.Task[int | None] | None = None

    async def ensure(self) -> int | None:
        """EpochFence if the server's epoch is not the stored one; the leases fenced, or None if
        the epoch was current (another caller or replica fenced first).

        The fence runs in its own task, shielded: a caller whose deadline passes (a claim's
        is 50 ms) does not cancel a fence of many leases half-way, and the next caller
        waits for the same one instead of starting another."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self.run())
        return await asyncio.shield(self._running)

    async def run(self) -> int | None:
        """One fence transaction (see the module's doc); the leases fenced, or None."""
        async with self.owner.begin() as conn:
            stored = (await conn.execute(text(_LOCK_EPOCH_SQL))).mappings().first()
            server = (await conn.execute(text(_SERVER_EPOCH_SQL))).mappings().one()
            if stored is not None and (stored["system_identifier"], stored["timeline"]) == (
                server["system_identifier"], server["timeline"]
            ):
                return None
            before = {"system_identifier": None, "timeline": None} if stored is None else dict(stored)
            reason = "SYSTEM_CHANGED" if before["system_identifier"] != server["system_identifier"] else "TIMELINE_CHANGED"
            details = {
                "from_system_identifier": str(before["system_identifier"]), "from_timeline": before["timeline"],
                "to_system_identifier": str(server["system_identifier"]), "to_timeline": server["timeline"],
            }
            counts = (
                await conn.execute(
                    text(FENCE_LEASES_SQL),
                    {"reason": reason, "actor": self.actor, "details": json.dumps(details)},
                )
            ).mappings().one()
            await conn.execute(text(_STORE_EPOCH_SQL), dict(server))
        log.warning(
            "database epoch changed (%s: system %s timeline %s -> system %s timeline %s): "
            "%d live leases invalidated, %d marked for release",
            reason, before["system_identifier"], before["timeline"], server["system_identifier"],
            server["timeline"], counts["fenced"], counts["released"],
        )
        FENCES.labels(reason).inc()
        FENCED_LEASES.inc(counts["fenced"])
        return int(counts["fenced"])

    async def fenced(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, and once more after the fence when the server's epoch changed under it."""
        try:
            return await call()
        except asyncpg.PostgresError as exc:
            if not epoch_changed(exc):
                raise
        await self.ensure()
        return await call()
