"""The one token-chain ↔ TokenChain-message codec: a round trip keeps every field, and a
message whose fields contradict each other is refused at the field's path."""

from __future__ import annotations

from boomerang import chainproto
from boomerang.errors import Violations
from boomerang.tokenchain import build_chain
from boomerang.v1 import types_pb2 as tpb


def test_round_trip_keeps_every_field() -> None:
    for tokens in ([], list(range(16)), list(range(1000, 1037))):
        chain = build_chain(tokens, 16)
        msg = chainproto.to_proto(chain)
        assert (msg.block_size, msg.num_tokens, msg.block_hashes, msg.tail_hash) == (
            16, len(tokens), chain.block_hashes, chain.tail_hash)
        assert chainproto.from_proto(msg) == chain
        assert chainproto.from_proto(tpb.TokenChain.FromString(msg.SerializeToString())) == chain


def test_validated_records_why_at_the_path() -> None:
    v = Violations()
    good = chainproto.to_proto(build_chain(list(range(40)), 16))
    assert chainproto.validated(v, "prompt_chain", good) == build_chain(list(range(40)), 16)
    assert not v.items
    bad = tpb.TokenChain(block_size=16, num_tokens=40)  # no hashes for its two whole blocks
    assert chainproto.validated(v, "prompt_chain", bad) is None
    assert [item.field for item in v.items] == ["prompt_chain"]
