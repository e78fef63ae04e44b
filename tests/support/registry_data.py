"""Builders for registry requests used across tests."""

from __future__ import annotations

import uuid

from boomerang.tokenchain import build_chain
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

BLOCK = 16


def engine_request(engine_id: str, generation: int = 1, ttl: int = 480, role: int = tpb.ENGINE_ROLE_DECODE,
                   model: str = "qwen3-32b") -> rpb.RegisterEngineRequest:
    """A RegisterEngineRequest for a decode (default) or prefill engine."""
    return rpb.RegisterEngineRequest(
        engine=tpb.Engine(
            engine_id=engine_id,
            role=role,
            model=model,
            side_channel_host="127.0.0.1",
            side_channel_port=5600,
            http_base_url="http://127.0.0.1:8200",
            registration_generation=generation,
            kv_blocks_ttl_seconds=ttl,
            block_size=BLOCK,
            bytes_per_block=4096,
        ),
        request_id=str(uuid.uuid4()),
    )


def chain_proto(tokens: list[int], block_size: int = BLOCK) -> tpb.TokenChain:
    """The TokenChain message of `tokens`."""
    c = build_chain(tokens, block_size)
    return tpb.TokenChain(block_size=c.block_size, num_tokens=c.num_tokens, block_hashes=c.block_hashes,
                          tail_hash=c.tail_hash)


def blocks_request(tenant: str, conversation: str, engine_id: str, tokens: list[int], generation: int = 1,
                   request_id: str | None = None, finish_time_unix: float = 0.0) -> rpb.RegisterRetainedBlocksRequest:
    """A RegisterRetainedBlocksRequest holding `tokens`."""
    n_blocks = -(-len(tokens) // BLOCK)
    return rpb.RegisterRetainedBlocksRequest(
        tenant=tenant,
        conversation_id=conversation,
        engine_id=engine_id,
        engine_generation=generation,
        remote_request_id=request_id or f"cmpl-{uuid.uuid4().hex}",
        block_groups=[tpb.BlockIdGroup(block_ids=list(range(100, 100 + n_blocks)))],
        num_tokens=len(tokens),
        token_chain=chain_proto(tokens),
        finish_time_unix=finish_time_unix,
    )


def claim_request(tenant: str, conversation: str, tokens: list[int], min_tokens: int = 64,
                  min_remaining: float = 5.0, claim_id: str | None = None) -> rpb.ClaimReuseRequest:
    """A ClaimReuseRequest for a new prompt of `tokens`."""
    return rpb.ClaimReuseRequest(
        tenant=tenant,
        conversation_id=conversation,
        prompt_chain=chain_proto(tokens),
        min_reusable_tokens=min_tokens,
        min_remaining_seconds=min_remaining,
        claim_id=claim_id or str(uuid.uuid4()),
    )
