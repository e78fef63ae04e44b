"""The one codec between token chains (`boomerang.tokenchain`) and their TokenChain message.

`tokenchain` stays free of protobuf; every service, the hook and the tools convert here.
"""

from __future__ import annotations

from boomerang.errors import Violations
from boomerang.tokenchain import TokenChain
from boomerang.v1 import types_pb2 as tpb


def to_proto(chain: TokenChain) -> tpb.TokenChain:
    """The TokenChain message of a chain."""
    return tpb.TokenChain(
        block_size=chain.block_size,
        num_tokens=chain.num_tokens,
        block_hashes=chain.block_hashes,
        tail_hash=chain.tail_hash,
    )


def from_proto(msg: tpb.TokenChain) -> TokenChain:
    """The chain a TokenChain message carries, unchecked (see `validated`)."""
    return TokenChain(msg.block_size, msg.num_tokens, msg.block_hashes, msg.tail_hash)


def validated(v: Violations, path: str, msg: tpb.TokenChain) -> TokenChain | None:
    """The chain a message carries once it validates, or None after recording why not at `path`."""
    chain = from_proto(msg)
    try:
        chain.validate()
    except ValueError as exc:
        v.add(path, str(exc))
        return None
    return chain
