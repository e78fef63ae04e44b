"""ClaimReuse without a conversation id: claim the lease whose previous prompt the new one continues.

A lease's previous prompt of `p` tokens is wholly a prefix of the new prompt when
(1) the new prompt's chain equals the lease's through block `p // block_size` (its key, the
    hash of that last whole block, is among the new prompt's; the chain comparison then
    proves it, so an 8-byte key collision claims nothing), and
(2) the prompt's partial last block, `p % block_size` tokens, recurs in the new prompt right
    after those blocks (the lease's `prompt_tail` digest, recomputed from the new prompt's
    token ids).
A lease that shares only a start with the new prompt (a system prompt, a tool list) fails
(1) or (2) and is never a candidate: claiming it would take another conversation's next
turn. Nor is the previous prompt itself, sent again (a regenerated answer, or a client
without an id asking the same thing): a continuation is strictly longer than what it
continues, and that lease stays for its own next turn. Of the leases the prompt continues, the one with the longest previous prompt wins;
the claim then is CLAIM_SQL's, built by the same statements.claim_statement: the verified
prefix, single use, the CLAIMED event in the same statement. One statement, one index: `ix_leases_live_prompt_key`, probed with every
whole-block key of the new prompt (tokenchain.probe_keys).
"""

from __future__ import annotations

from typing import Any

from boomerang.tokenchain import probe_keys

from boomerang_registry.domain import ClaimQuery
from boomerang_registry.statements import claim_statement

# `:keys[k]` is the key of the new prompt's first k whole blocks; a lease qualifies only at
# its own position (its prompt's whole blocks), so a key seen elsewhere in the prompt does
# not. `prompt_tail` is SHA-256(hash of the prompt's last whole block ‖ its tail tokens).
# The longest previous prompt wins; the rest of the claim is every claim's (claim_statement).
CONTINUE_CLAIM_SQL = claim_statement(
    lease_key="l.tenant = :tenant",
    candidates="""hits AS (
    SELECT l.lease_id, l.state, l.expires_at, l.engine_id, l.engine_generation, l.prompt_tokens,
           CASE WHEN l.block_size = :block_size THEN
               boomerang_common_tokens(l.chain, l.tail_hash, l.num_tokens,
                                       :chain, :tail_hash, :num_tokens, l.block_size)
           ELSE 0 END AS common_tokens,
           (l.prompt_tokens / l.block_size)::int AS prompt_blocks, l.prompt_tail, l.chain, l.block_size
    FROM leases l
    WHERE l.tenant = :tenant AND l.prompt_key = ANY(CAST(:keys AS bigint[]))
      AND l.state IN ('RETAINED', 'CLAIMED') AND l.prompt_key IS NOT NULL
      AND l.block_size = :block_size AND l.prompt_tokens < :num_tokens
      AND (CAST(:keys AS bigint[]))[(l.prompt_tokens / l.block_size)::int] = l.prompt_key
      AND (:model = '' OR l.model = :model)
), cands AS (
    SELECT h.lease_id, h.state, h.expires_at, h.prompt_tokens, h.common_tokens,
           (e.status = 'ACTIVE' AND e.generation = h.engine_generation) AS engine_ok,
           TRUE AS block_size_ok,
           EXTRACT(EPOCH FROM h.expires_at - now())::float8 AS remaining_seconds
    FROM hits h JOIN engines e ON e.engine_id = h.engine_id
    WHERE h.common_tokens >= h.prompt_blocks * h.block_size
      AND (length(h.prompt_tail) = 0 OR h.prompt_tail = sha256(
              substring(h.chain FROM (h.prompt_blocks - 1) * 16 + 1 FOR 16)
              || substring(CAST(:tokens AS bytea) FROM h.prompt_blocks * h.block_size * 4 + 1
                           FOR (h.prompt_tokens - h.prompt_blocks * h.block_size)::int * 4)))
)""",
    order="prompt_tokens DESC, common_tokens DESC, expires_at DESC",
    found_by="prompt",
)


def continue_params(q: ClaimQuery) -> dict[str, Any]:
    """CONTINUE_CLAIM_SQL's parameters for a claim without a conversation id, but `actor`."""
    return {
        "tenant": q.tenant,
        "claim_id": q.claim_id,
        "block_size": q.chain.block_size,
        "chain": q.chain.block_hashes,
        "tail_hash": q.chain.tail_hash,
        "num_tokens": q.chain.num_tokens,
        "keys": probe_keys(q.chain),
        "tokens": q.prompt_packed,
        "model": q.model,
        "min_tokens": q.min_reusable_tokens,
        "min_remaining": q.min_remaining_seconds,
    }
