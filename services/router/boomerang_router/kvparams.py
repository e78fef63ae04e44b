"""vLLM's `kv_transfer_params`, exactly as the NixlConnector exchanges them
(docs/vllm-contract.md).

Two forms leave the router for the prefill engine (P):

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

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from boomerang_router.domain import LeaseHandle

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
# (servicer.params, requests.params_from_proto) carries each under the same name.
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


def first_turn() -> KvParams:
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


def pull(lease: LeaseHandle, reusable_tokens: int) -> KvParams:
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


def to_dict(params: KvParams) -> dict[str, Any]:
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


def to_json(params: KvParams) -> str:
    """`to_dict` as compact JSON."""
    return json.dumps(to_dict(params), separators=(",", ":"))


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


def from_dict(data: dict[str, Any]) -> KvParams:
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


def from_json(text: str) -> KvParams | None:
    """Parse the JSON text D returned; None for `null` or an empty string."""
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON: {exc.msg}") from None
    if data is None:
        return None
    return from_dict(data)
