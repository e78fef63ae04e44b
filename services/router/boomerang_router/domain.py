"""The plan decision, free of gRPC and SQL: pull, recompute, prefill on D, or cold, and why.

The registry's claim has already verified, by token chain, how many leading tokens of the
new prompt the lease holds (`verified`). The router then decides how many of them the
prefill engine (P) may load (`remote_num_tokens`):

* whole blocks only, because P maps tokens to D's blocks one block at a time;
* strictly fewer than the prompt, so P always computes at least one prompt token (it needs
  the last position's logits to sample the first output token);
* never more than verified — P does not check that its prompt extends D's sequence.

A pull must reach P's `kv_recompute_threshold` beyond what P's own prefix cache holds
(below it P would recompute anyway, after telling D to free the blocks, and the handle
would be wasted). Among what is allowed, the option with the smallest predicted time to
first token wins (`ttft.choose`): recompute, a pull, or a prefill on the decode engine that
holds the history.

Here too are the values the decision works on: a validated PlanTurn or ReportTurn request
(`PlanInput`, `ReportInput`, built by `rpc_surface`), and vLLM's `kv_transfer_params`
(`KvParams`), exactly as the NixlConnector exchanges them (docs/vllm-contract.md). Two forms
leave the router for P:

* the first-turn form, when there is nothing to pull —
  `{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
  "remote_block_ids": null, "remote_host": null, "remote_port": null}`;
* the pull form, the claimed handle of a decode engine (D) with `remote_num_tokens` set to
  the verified prefix length. `remote_blocks_expiry_time` is left out: it is in D's
  `time.perf_counter()` clock, which the router cannot know; the lease's own deadline
  (D's TTL minus the registry's margin) and the claim's minimum remaining lifetime keep
  the read clear of D's expiry instead.

One form comes back from D at the end of a turn: its retained handle (`remote_num_tokens`
is then the prompt plus generated tokens D holds).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from boomerang.tokenchain import TokenChain
from boomerang_server.leases import ClaimOutcome

from boomerang_router.ttft import Choice, Option, TurnCosts, choose


class PlanDecision(str, enum.Enum):
    """What the prefill engine does with the previous turn's blocks."""

    PULL = "PULL"
    RECOMPUTE = "RECOMPUTE"
    COLD = "COLD"
    # The decode engine that holds the history prefills the new tokens itself; nothing moves.
    PREFILL_ON_DECODE = "PREFILL_ON_DECODE"


class PlanReason(str, enum.Enum):
    """Why the router decided as it did (names match the proto's PlanReason)."""

    VERIFIED_PREFIX = "VERIFIED_PREFIX"
    NO_LEASE = "NO_LEASE"
    BELOW_THRESHOLD = "BELOW_THRESHOLD"
    PREFIX_MISMATCH = "PREFIX_MISMATCH"
    EXPIRING = "EXPIRING"
    ENGINE_UNAVAILABLE = "ENGINE_UNAVAILABLE"
    CONTROL_PLANE_DEGRADED = "CONTROL_PLANE_DEGRADED"
    ALREADY_CLAIMED = "ALREADY_CLAIMED"
    BLOCK_SIZE_MISMATCH = "BLOCK_SIZE_MISMATCH"
    NO_CONVERSATION = "NO_CONVERSATION"
    LEASE_RELEASED = "LEASE_RELEASED"
    RECOMPUTE_FASTER = "RECOMPUTE_FASTER"
    TURN_STARTED = "TURN_STARTED"


@dataclass(frozen=True)
class LeaseHandle:
    """A claimed lease: what P needs to read D's blocks."""

    lease_id: str
    claim_id: str
    engine_id: str
    engine_generation: int
    remote_request_id: str
    block_groups: tuple[tuple[int, ...], ...]
    num_tokens: int
    block_size: int
    remote_host: str
    remote_port: int
    tp_size: int
    dcp_size: int
    pp_size: int


@dataclass(frozen=True)
class ClaimResult:
    """The claim as the router saw it."""

    status: ClaimOutcome
    lease: LeaseHandle | None = None
    verified_tokens: int = 0
    remaining_seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Decision:
    """The plan decision and its token accounting."""

    decision: PlanDecision
    reason: PlanReason
    reusable_tokens: int
    recompute_tokens: int
    verified_tokens: int
    # The claim succeeded but the router will not hand the handle out: give it back.
    release_claim: bool = False
    choice: Choice | None = None  # the prediction it was decided by, when there was one


@dataclass(frozen=True)
class PlanInput:
    """A validated PlanTurn request."""

    tenant: str
    conversation_id: str
    model: str
    token_ids: list[int] | None
    chain: TokenChain | None
    prompt_tokens: int
    request_id: str
    salt: str = ""  # vLLM's cache_salt: chains of two salts never match
    prefill_cached: int = 0  # prompt tokens the prefill engine's own cache holds
    can_prefill_on_decode: bool = False
    prefill_engine_id: str = ""  # the caller's own prefill engine (the vLLM hook's)
    turn_started: bool = False  # the caller went on without this plan: it claims nothing


@dataclass(frozen=True)
class ReportInput:
    """A validated ReportTurn request."""

    tenant: str
    plan_id: str
    created_at: datetime
    handle_use: HandleUse
    decode_params: KvParams | None
    token_ids: list[int] | None  # prompt then output
    chain: TokenChain | None
    finish_time_unix: float
    conversation_id: str
    delivered_cached_tokens: int | None = None  # the prefill engine's own count, if it gave one
    prompt_len: int = 0  # how many of `token_ids` are the prompt (the rest are output)
    salt: str = ""  # the request's cache_salt, as given to PlanTurn
    prefill_seconds: float | None = None  # measured by the caller
    copy_seconds: float | None = None
    inter_token_seconds: float | None = None
    decode_first_token_seconds: float | None = None


def max_reusable_tokens(prompt_tokens: int, block_size: int) -> int:
    """The most tokens P may load: whole blocks, strictly fewer than the prompt."""
    if prompt_tokens <= 1 or block_size <= 0:
        return 0
    return ((prompt_tokens - 1) // block_size) * block_size


def reusable_tokens(verified_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """`remote_num_tokens` for a verified prefix: floored to blocks and capped below the prompt."""
    whole = (max(verified_tokens, 0) // block_size) * block_size
    return min(whole, max_reusable_tokens(prompt_tokens, block_size))


def claim_floor(prompt_tokens: int, block_size: int, threshold: int) -> int:
    """The `min_reusable_tokens` to ask the registry for.

    The threshold, except when even a fully verified prompt would be capped below it: then
    more tokens than the prompt has, so the registry claims nothing yet still says why.
    """
    floor = max(threshold, 1)
    if max_reusable_tokens(prompt_tokens, block_size) < floor:
        return prompt_tokens + 1
    return floor


_NOT_CLAIMED: dict[ClaimOutcome, tuple[PlanDecision, PlanReason]] = {
    ClaimOutcome.NO_LEASE: (PlanDecision.COLD, PlanReason.NO_LEASE),
    ClaimOutcome.NOT_ASKED: (PlanDecision.COLD, PlanReason.NO_CONVERSATION),
    # Nothing is known about the conversation's leases, so nothing was ruled out either.
    ClaimOutcome.UNAVAILABLE: (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED),
    ClaimOutcome.EXPIRING: (PlanDecision.RECOMPUTE, PlanReason.EXPIRING),
    ClaimOutcome.PREFIX_MISMATCH: (PlanDecision.RECOMPUTE, PlanReason.PREFIX_MISMATCH),
    ClaimOutcome.BELOW_THRESHOLD: (PlanDecision.RECOMPUTE, PlanReason.BELOW_THRESHOLD),
    ClaimOutcome.ENGINE_INVALID: (PlanDecision.RECOMPUTE, PlanReason.ENGINE_UNAVAILABLE),
    ClaimOutcome.ALREADY_CLAIMED: (PlanDecision.RECOMPUTE, PlanReason.ALREADY_CLAIMED),
    ClaimOutcome.BLOCK_SIZE_MISMATCH: (PlanDecision.RECOMPUTE, PlanReason.BLOCK_SIZE_MISMATCH),
    # D no longer holds the blocks, so nothing can be pulled; the reason says reuse was lost
    # to an early release (the retention policy's cost), not that there never was a lease.
    ClaimOutcome.LEASE_RELEASED: (PlanDecision.COLD, PlanReason.LEASE_RELEASED),
}


def decide(
    claim: ClaimResult,
    prompt_tokens: int,
    block_size: int,
    threshold: int,
    source_engine_alive: bool = True,
    costs: TurnCosts | None = None,
    prefill_cached: int = 0,
) -> Decision:
    """Turn a claim into a plan decision.

    `source_engine_alive` is the router's own view of the claimed lease's engine (its pool
    may see a stopped heartbeat before the registry marks the engine dead). With `costs` the
    plan is the fastest predicted option (`ttft.choose`; `prefill_cached`: what P's prefix
    cache holds); without, a pull whenever the threshold allows it.
    """
    verified = claim.verified_tokens
    if claim.status is not ClaimOutcome.CLAIMED or claim.lease is None:
        decision, reason = _NOT_CLAIMED.get(
            claim.status, (PlanDecision.COLD, PlanReason.CONTROL_PLANE_DEGRADED)
        )
        return Decision(decision, reason, 0, prompt_tokens, verified)

    def give_back(reason: PlanReason, choice: Choice | None = None) -> Decision:
        return Decision(PlanDecision.RECOMPUTE, reason, 0, prompt_tokens, verified, release_claim=True, choice=choice)

    lease = claim.lease
    if not source_engine_alive:
        return give_back(PlanReason.ENGINE_UNAVAILABLE)
    if lease.block_size != block_size:
        return give_back(PlanReason.BLOCK_SIZE_MISMATCH)
    if not lease.block_groups or not any(lease.block_groups):
        return give_back(PlanReason.ENGINE_UNAVAILABLE)
    reusable = min(reusable_tokens(verified, prompt_tokens, block_size), lease.num_tokens)
    if reusable <= 0:
        return give_back(PlanReason.BELOW_THRESHOLD)
    if costs is None:
        if reusable < threshold:
            return give_back(PlanReason.BELOW_THRESHOLD)
        return Decision(PlanDecision.PULL, PlanReason.VERIFIED_PREFIX, reusable, prompt_tokens - reusable, verified)
    c = choose(prompt_tokens, reusable, prefill_cached, block_size, threshold, costs)
    if c.option is Option.PULL:
        return Decision(
            PlanDecision.PULL, PlanReason.VERIFIED_PREFIX, c.pull_tokens, prompt_tokens - c.pull_tokens, verified,
            choice=c,
        )
    if c.option is Option.PREFILL_ON_DECODE:
        # D reads its own blocks, never the handle: the claim goes back to the conversation.
        return Decision(
            PlanDecision.PREFILL_ON_DECODE, PlanReason.VERIFIED_PREFIX, reusable, prompt_tokens - reusable, verified,
            release_claim=True, choice=c,
        )
    return give_back(PlanReason.RECOMPUTE_FASTER if c.pulls_allowed else PlanReason.BELOW_THRESHOLD, c)


def decide_started(claim: ClaimResult, prompt_tokens: int, block_size: int, threshold: int) -> Decision:
    """The plan of a turn its caller started without it (the live-lease summary ruled it out):
    its claim asked for more than the prompt holds, so nothing was claimed, yet the registry
    said what it found.

    A lease a plan would have pulled is a pull the turn missed: RECOMPUTE, reason TURN_STARTED,
    `verified_tokens` what it would have pulled. A lease that covers every whole block a pull
    may take is the turn's own, registered while this plan was on its way (or the same
    prompt's earlier answer): the turn had nothing to pull, COLD NO_LEASE. Anything else is
    decided as for any claim that failed."""
    if claim.status is ClaimOutcome.BELOW_THRESHOLD:
        if claim.verified_tokens >= max_reusable_tokens(prompt_tokens, block_size):
            return Decision(PlanDecision.COLD, PlanReason.NO_LEASE, 0, prompt_tokens, 0)
        reusable = reusable_tokens(claim.verified_tokens, prompt_tokens, block_size)
        if reusable >= max(threshold, 1):
            return Decision(PlanDecision.RECOMPUTE, PlanReason.TURN_STARTED, 0, prompt_tokens, reusable)
    return decide(claim, prompt_tokens, block_size, threshold)


class HandleUse(str, enum.Enum):
    """What the prefill engine did with a PULL plan's handle."""

    READ = "READ"
    NOT_READ = "NOT_READ"
    UNKNOWN = "UNKNOWN"

    @property
    def consumed(self) -> bool:
        """Whether the handle must be treated as used up (D may have freed the blocks)."""
        return self is not HandleUse.NOT_READ


class Retention(str, enum.Enum):
    """What became of the decode engine's retained blocks at the end of a turn."""

    REGISTERED = "REGISTERED"
    ALREADY_REGISTERED = "ALREADY_REGISTERED"
    NOT_RETAINED = "NOT_RETAINED"
    REJECTED = "REJECTED"
    NO_CONVERSATION = "NO_CONVERSATION"


def turn_outcome(decision: PlanDecision, handle_use: HandleUse, lease_state: str) -> str:
    """The one-word outcome of a reported turn, for the audit row.

    `REUSED` (P read the claimed blocks), `RELEASED` (P never read them; the claim was given
    back), `LEASE_ENDED` (P was told to read, but the registry ended the lease while it was
    claimed — worth an operator's look), or `COMPUTED` (no handle was handed out).
    """
    if decision is not PlanDecision.PULL:
        return "COMPUTED"  # also a prefill on D: it computed the new tokens over its own cache
    if not handle_use.consumed:
        return "RELEASED"
    return "REUSED" if lease_state == "CONSUMED" else "LEASE_ENDED"


Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class KvParams:
    """The `kv_transfer_params` dictionary; None means the key is absent or null."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_block_ids: Groups | None = None
    remote_engine_id: str | None = None
    remote_request_id: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    tp_size: int | None = None
    dcp_size: int | None = None
    pp_size: int | None = None
    remote_num_tokens: int | None = None
    remote_blocks_expiry_time: float | None = None
    remote_registration_generation: int | None = None
    transfer_mode: str | None = None
    # Keys vLLM sent that this version does not know; kept so nothing is silently lost.
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False)


# Keys the first-turn form carries as explicit nulls (vLLM's example proxy sends them so).
_ALWAYS = ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")
# The optional single-valued keys, in the order vLLM writes them; the typed message
# (rpc_surface.params, rpc_surface.params_from_proto) carries each under the same name.
SCALAR_KEYS = (
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "tp_size",
    "dcp_size",
    "pp_size",
    "remote_num_tokens",
    "remote_blocks_expiry_time",
    "remote_registration_generation",
    "transfer_mode",
)
_ORDER = ("do_remote_decode", "do_remote_prefill", "remote_block_ids", *SCALAR_KEYS)
_INT_KEYS = ("remote_port", "tp_size", "dcp_size", "pp_size", "remote_num_tokens", "remote_registration_generation")
_STR_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "transfer_mode")


def first_turn_params() -> KvParams:
    """The params P gets when it computes the whole prompt."""
    return KvParams(do_remote_decode=True, do_remote_prefill=False)


def trim_groups(groups: Groups, tokens: int, block_size: int) -> Groups:
    """Each KV-cache group's ids for the first `tokens` tokens (whole blocks).

    D's handle lists blocks for everything it holds (prompt plus output); P must read only
    the blocks of the verified prefix. Sending exactly those keeps P's mapping right
    whether it counts D's blocks from the front or aligns them to its own from the back.
    """
    keep = -(-tokens // block_size)
    return tuple(tuple(group[:keep]) for group in groups)


def pull_params(lease: LeaseHandle, reusable_tokens: int) -> KvParams:
    """The claimed handle for P, loading exactly `reusable_tokens` (whole blocks)."""
    return KvParams(
        do_remote_decode=True,
        do_remote_prefill=False,
        remote_block_ids=trim_groups(lease.block_groups, reusable_tokens, lease.block_size),
        remote_engine_id=lease.engine_id,
        remote_request_id=lease.remote_request_id,
        remote_host=lease.remote_host,
        remote_port=lease.remote_port,
        tp_size=lease.tp_size,
        dcp_size=lease.dcp_size,
        pp_size=lease.pp_size,
        remote_num_tokens=reusable_tokens,
        remote_registration_generation=lease.engine_generation,
        transfer_mode="pull",
    )


def params_dict(params: KvParams) -> dict[str, Any]:
    """The JSON object vLLM expects: set keys, plus the first-turn form's explicit nulls."""
    out: dict[str, Any] = {}
    for key in _ORDER:
        value = getattr(params, key)
        if key == "remote_block_ids" and value is not None:
            value = [list(group) for group in value]
        if value is not None or key in _ALWAYS:
            out[key] = value
    for key, value in params.extra:
        out.setdefault(key, value)
    return out


def params_json(params: KvParams) -> str:
    """`params_dict` as compact JSON."""
    return json.dumps(params_dict(params), separators=(",", ":"))


def accepts_pull(params: KvParams) -> bool:
    """P's rule for treating a request as a pull from D (docs/vllm-contract.md)."""
    return (
        params.do_remote_decode is True
        and bool(params.remote_block_ids)
        and any(params.remote_block_ids or ())
        and params.remote_engine_id is not None
        and params.remote_request_id is not None
        and params.remote_host is not None
        and params.remote_port is not None
    )


def _groups(value: Any) -> Groups | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError("remote_block_ids must be a list of lists of block ids")
    if all(_is_int(v) for v in value):
        # Older vLLM sent one flat list (a single KV-cache group).
        return (tuple(value),) if value else ()
    if not all(isinstance(g, list) and all(_is_int(v) for v in g) for g in value):
        raise ValueError("remote_block_ids must be a list of lists of block ids")
    return tuple(tuple(g) for g in value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def params_from_dict(data: dict[str, Any]) -> KvParams:
    """Parse vLLM's dictionary; ValueError names the first bad key."""
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    values: dict[str, Any] = {}
    for key in ("do_remote_decode", "do_remote_prefill"):
        value = data.get(key, False)
        if value is None:
            value = False
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        values[key] = value
    values["remote_block_ids"] = _groups(data.get("remote_block_ids"))
    for key in _INT_KEYS:
        value = data.get(key)
        if value is not None and not _is_int(value):
            raise ValueError(f"{key} must be an integer")
        values[key] = value
    for key in _STR_KEYS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{key} must be a string")
        values[key] = value
    expiry = data.get("remote_blocks_expiry_time")
    if expiry is not None and (not isinstance(expiry, (int, float)) or isinstance(expiry, bool) or not math.isfinite(expiry)):
        raise ValueError("remote_blocks_expiry_time must be a number")
    values["remote_blocks_expiry_time"] = None if expiry is None else float(expiry)
    extra = tuple((k, v) for k, v in data.items() if k not in _ORDER)
    return replace(KvParams(**values), extra=extra)


def params_from_json(text: str) -> KvParams | None:
    """Parse the JSON text D returned; None for `null` or an empty string."""
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON: {exc.msg}") from None
    if data is None:
        return None
    return params_from_dict(data)
