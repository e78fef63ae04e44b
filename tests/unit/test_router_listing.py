"""ListTurnPlans' page tokens and request validation: a token resumes its own listing only."""

from __future__ import annotations

import base64
import uuid

import pytest
from boomerang.errors import BoomerangError, Code
from boomerang.v1 import router_service_pb2 as rtpb
from boomerang_router import rpc_surface
from boomerang_router.listing import PageTokenError, decode_page_token, encode_page_token
from boomerang_router.plan_store import new_plan_id


def violations(req: rtpb.ListTurnPlansRequest) -> dict[str, str]:
    with pytest.raises(BoomerangError) as err:
        rpc_surface.list_plans(req)
    assert err.value.code is Code.INVALID_ARGUMENT
    return {v.field: v.description for v in err.value.violations}


def test_a_token_resumes_after_its_plan() -> None:
    plan_id = new_plan_id()
    token = encode_page_token("acme", "c1", plan_id)
    assert decode_page_token(token, "acme", "c1") == plan_id
    q = rpc_surface.list_plans(rtpb.ListTurnPlansRequest(tenant="acme", conversation_id="c1", page_token=token))
    assert (q.tenant, q.conversation_id, q.page_size, q.after) == ("acme", "c1", 100, plan_id)


@pytest.mark.parametrize(("tenant", "conversation"), [("other", "c1"), ("acme", "c2"), ("acme\x00c", "1")])
def test_a_token_of_another_listing_is_refused(tenant: str, conversation: str) -> None:
    token = encode_page_token("acme", "c1", new_plan_id())
    with pytest.raises(PageTokenError, match="another tenant or conversation_id"):
        decode_page_token(token, tenant, conversation)


def _raw(version: int, plan: uuid.UUID) -> str:
    good = base64.urlsafe_b64decode(encode_page_token("acme", "c1", new_plan_id()) + "==")
    return base64.urlsafe_b64encode(bytes([version]) + plan.bytes + good[17:]).decode()


@pytest.mark.parametrize("token", ["", "!!!", "AQ", "a" * 5000, _raw(2, uuid.UUID(new_plan_id())), _raw(1, uuid.uuid4())])
def test_garbage_is_refused(token: str) -> None:
    with pytest.raises(PageTokenError, match="not a next_page_token returned by ListTurnPlans"):
        decode_page_token(token, "acme", "c1")


def test_every_bad_field_is_named_at_once() -> None:
    bad = rtpb.ListTurnPlansRequest(tenant="", conversation_id="", page_size=1001, page_token="junk")
    # The token names a listing; with no valid listing to judge it against, it is not judged.
    assert set(violations(bad)) == {"tenant", "conversation_id", "page_size"}
    bad = rtpb.ListTurnPlansRequest(tenant="acme", conversation_id="c1", page_size=-1, page_token="junk")
    assert set(violations(bad)) == {"page_size", "page_token"}


def test_page_size_bounds() -> None:
    for size, expected in ((0, 100), (1, 1), (1000, 1000)):
        req = rtpb.ListTurnPlansRequest(tenant="acme", conversation_id="c1", page_size=size)
        assert rpc_surface.list_plans(req).page_size == expected
