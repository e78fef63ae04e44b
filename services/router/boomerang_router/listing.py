"""ListTurnPlans: one conversation's plans, oldest first, a page at a time.

Pages are keyed by the plan id. A plan id is a UUIDv7 that carries its creation time
(plan_store.py) and `created_at` is read from it, so the keyset `(created_at, plan_id)` is the
plan id's own order: a page resumes after the last plan it listed, and plans recorded
meanwhile are listed on a later page, never twice, never in place of another.

The page token is opaque to callers: the last plan id and a digest of the listing it
belongs to (tenant and conversation), so a token passed to another listing is refused
instead of silently skipping or repeating plans. The digest is no secret and needs none:
every read is scoped to the caller's tenant whatever the token says.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from dataclasses import dataclass

from boomerang_router.plan_store import PlanRecord, plan_time
from boomerang_router.repository import AuditWriter, TurnPlanRepository

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_VERSION = 1
_DIGEST_BYTES = 8
_TOKEN_BYTES = 1 + 16 + _DIGEST_BYTES


class PageTokenError(ValueError):
    """A page token that is not one ListTurnPlans issued for this listing."""


def _listing(tenant: str, conversation_id: str) -> bytes:
    return hashlib.sha256(f"{tenant}\x00{conversation_id}".encode()).digest()[:_DIGEST_BYTES]


def encode_page_token(tenant: str, conversation_id: str, last_plan_id: str) -> str:
    """The token of the page after `last_plan_id` in this tenant's conversation."""
    raw = bytes([_VERSION]) + uuid.UUID(last_plan_id).bytes + _listing(tenant, conversation_id)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str, tenant: str, conversation_id: str) -> str:
    """The plan id a token resumes after; PageTokenError when it is garbage or another listing's."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _TOKEN_BYTES or raw[0] != _VERSION:
        raise PageTokenError("is not a next_page_token returned by ListTurnPlans; list again without one")
    if raw[17:] != _listing(tenant, conversation_id):
        raise PageTokenError("was returned for another tenant or conversation_id; pass the same tenant and "
                             "conversation_id as the call that returned it, or no token to start again")
    plan_id = str(uuid.UUID(bytes=raw[1:17]))
    try:
        plan_time(plan_id)
    except ValueError:
        raise PageTokenError("is not a next_page_token returned by ListTurnPlans; list again without one") from None
    return plan_id


@dataclass(frozen=True)
class ListInput:
    """A validated ListTurnPlans request."""

    tenant: str
    conversation_id: str
    page_size: int
    after: str  # the plan id the page starts after; "" for the first page


async def list_plans(
    q: ListInput, audit: AuditWriter, repo: TurnPlanRepository
) -> tuple[list[PlanRecord], str]:
    """One page of the conversation's plans and the next page's token ("" on the last page).

    This replica's pending audit rows are written first, so a plan it made (or an outcome
    it settled) is listed at once; another replica's once that replica has written its row.
    """
    await audit.flush()
    records = await repo.conversation_page(q.tenant, q.conversation_id, q.after, q.page_size + 1)
    if len(records) <= q.page_size:
        return records, ""
    page = records[: q.page_size]
    return page, encode_page_token(q.tenant, q.conversation_id, page[-1].plan_id)
