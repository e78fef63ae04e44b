"""What the hook reads from a vLLM request and from the NixlConnector's `kv_transfer_params`.

A request names its conversation in `kv_transfer_params["boomerang"]`:

    {"conversation_id": "c-123", "tenant": "acme"}      # tenant optional

which a gateway or client puts beside (or instead of) the NixlConnector's own keys. vLLM
passes the request body's `kv_transfer_params` to the connector untouched, and the
NixlConnector ignores keys it does not know. Clients that cannot set `kv_transfer_params`
may use vLLM's `vllm_xargs` instead: `{"boomerang_conversation_id": "c-123",
"boomerang_tenant": "acme"}` (they arrive in `sampling_params.extra_args`).

Without a conversation id (a stock proxy in front of vLLM sends none) the turn is still
planned and registered: the router finds the retained turn its prompt continues. The tenant
is then the configured one, the request's `boomerang.tenant`, or, on an engine with no
tenant, one named after vLLM's `cache_salt`; the salt also seeds the token chain, so two
salts never share a lease, as they never share vLLM's prefix cache.

Everything here is plain Python over duck-typed objects shaped like vLLM's `Request`
(`request_id`, `kv_transfer_params`, `prompt_token_ids`, `all_token_ids`).
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from boomerang.tokenchain import salt_key

KEY = "boomerang"
XARG_CONVERSATION = "boomerang_conversation_id"
XARG_TENANT = "boomerang_tenant"
MAX_CONVERSATION_ID = 256
MAX_TENANT = 128


class Skip(str, enum.Enum):
    """Why a request gets no Boomerang treatment (the name is the counter's)."""

    NO_CONVERSATION = "no_conversation"
    BAD_CONTEXT = "bad_context"
    FOREIGN_TENANT = "foreign_tenant"


@dataclass(frozen=True)
class TurnContext:
    """Whose conversation a request continues ("" when it names none), its salt, its prompt's length."""

    tenant: str
    conversation_id: str
    salt: str = ""  # vLLM's cache_salt: it seeds the chain
    # len(prompt_token_ids): where a registered turn's prompt ends (a fact of the request, not of whose it is)
    prompt_tokens: int = field(default=0, compare=False)

    def as_params(self) -> dict[str, str]:
        """The `kv_transfer_params["boomerang"]` object that carries it to the next engine."""
        return {"tenant": self.tenant, "conversation_id": self.conversation_id}


def _requested(request: Any) -> tuple[Any, Any]:
    params = getattr(request, "kv_transfer_params", None)
    if isinstance(params, dict) and isinstance(params.get(KEY), dict):
        ctx = params[KEY]
        return ctx.get("conversation_id"), ctx.get("tenant")
    sampling = getattr(request, "sampling_params", None)
    xargs = getattr(sampling, "extra_args", None)
    if isinstance(xargs, dict) and XARG_CONVERSATION in xargs:
        return xargs.get(XARG_CONVERSATION), xargs.get(XARG_TENANT)
    return None, None


def turn_context(request: Any, tenant: str, trust_request_tenant: bool) -> TurnContext | Skip:
    """The request's conversation and tenant, or why it has none usable.

    The tenant is the configured one unless `trust_request_tenant`; a request that names a
    different tenant on an engine that does not trust it is refused rather than remapped,
    so a mislabelled request can never touch another tenant's conversation.
    """
    conversation, asked = _requested(request)
    salt = getattr(request, "cache_salt", None)
    # Never "" for a salt it cannot send as it is: that would pool long salts into one.
    salt = salt_key(salt) if isinstance(salt, str) else ""
    prompt = getattr(request, "prompt_token_ids", None)
    found = _context(conversation or "", asked, tenant, trust_request_tenant, salt)
    if isinstance(found, Skip):
        return found
    return TurnContext(found[0], found[1], salt, len(prompt) if prompt is not None else 0)


def salt_tenant(salt: str) -> str:
    """The tenant of an engine with none configured, for requests salted with `salt`."""
    return "salt-" + hashlib.sha256(salt.encode()).hexdigest()[:32]


def _context(conversation: Any, asked: Any, tenant: str, trust_request_tenant: bool, salt: str) -> tuple[str, str] | Skip:
    if not conversation and not (tenant or asked or salt):
        return Skip.NO_CONVERSATION  # nothing names whose turn this is
    if not isinstance(conversation, str) or len(conversation) > MAX_CONVERSATION_ID:
        return Skip.BAD_CONTEXT
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in conversation):
        return Skip.BAD_CONTEXT
    if asked is not None and (not isinstance(asked, str) or len(asked) > MAX_TENANT):
        return Skip.BAD_CONTEXT
    if trust_request_tenant and asked:
        return asked, conversation
    if asked and asked != tenant:
        return Skip.FOREIGN_TENANT
    if not tenant and salt and not conversation:
        return salt_tenant(salt), conversation
    if not tenant:
        return Skip.BAD_CONTEXT  # a trusting engine without a default, and the request named none
    return tenant, conversation


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def block_groups(value: Any) -> tuple[tuple[int, ...], ...] | None:
    """`remote_block_ids` as groups, or None when malformed.

    Inside the engine vLLM 0.33.0 hands over a tuple of lists (one per KV-cache group,
    `KVCacheConfig.select_transfer_block_ids`); in JSON it is a list of lists; older vLLM
    sent one flat list. Any sequence of sequences of ints is accepted.
    """
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(_is_int(v) for v in value):
        return (tuple(value),)
    if all(isinstance(g, (list, tuple)) and g and all(_is_int(v) for v in g) for g in value):
        return tuple(tuple(g) for g in value)
    return None


def has_pull_handle(params: Any) -> bool:
    """P's rule for a pull from D (docs/vllm-contract.md, "What P does with a handle"): the request already carries a handle."""
    if not isinstance(params, dict):
        return False
    return (
        params.get("do_remote_decode") is True
        and bool(params.get("remote_block_ids"))
        and all(params.get(k) is not None for k in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port"))
    )


@dataclass(frozen=True)
class RetainedHandle:
    """A decode engine's bidirectional handle, as `request_finished` returned it."""

    engine_id: str
    remote_request_id: str
    block_groups: tuple[tuple[int, ...], ...]
    remote_host: str
    remote_port: int
    num_tokens: int | None
    expiry_time: float | None  # D's time.perf_counter() seconds
    generation: int | None


def retained_handle(params: Any) -> RetainedHandle | None:
    """The handle when `params` is D's bidirectional form, else None (P's form, aborts, junk)."""
    if not isinstance(params, dict) or params.get("do_remote_decode") is not True:
        return None
    groups = block_groups(params.get("remote_block_ids"))
    engine, rid = params.get("remote_engine_id"), params.get("remote_request_id")
    if groups is None or not isinstance(engine, str) or not engine or not isinstance(rid, str) or not rid:
        return None
    host, raw_port = params.get("remote_host"), params.get("remote_port")
    port = raw_port if isinstance(raw_port, int) and not isinstance(raw_port, bool) else 0
    num, gen, expiry = params.get("remote_num_tokens"), params.get("remote_registration_generation"), params.get(
        "remote_blocks_expiry_time"
    )
    if expiry is not None and (isinstance(expiry, bool) or not isinstance(expiry, (int, float)) or not math.isfinite(expiry)):
        expiry = None
    return RetainedHandle(
        engine_id=engine,
        remote_request_id=rid,
        block_groups=groups,
        remote_host=host if isinstance(host, str) else "",
        remote_port=port,
        num_tokens=num if _is_int(num) else None,
        expiry_time=None if expiry is None else float(expiry),
        generation=gen if _is_int(gen) else None,
    )

