"""`kv_transfer_params` as vLLM's NixlConnector reads and writes them (docs/vllm-contract.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from boomerang_tools.sim.protocol import ProtocolError


class Mode(enum.Enum):
    """What a request's `kv_transfer_params` ask of this engine."""

    PLAIN = "plain"  # no params: an ordinary request
    PREFILL = "prefill"  # do_remote_decode, nothing to pull: compute, hold blocks for D
    PULL = "pull"  # do_remote_decode with a handle: pull D's retained blocks, then as PREFILL
    DECODE = "decode"  # do_remote_prefill: load P's blocks, decode, retain on finish


@dataclass(frozen=True)
class RemoteHandle:
    """The remote engine's blocks named by the params."""

    engine_id: str | None
    request_id: str | None
    host: str | None
    port: int | None
    block_ids: list[int]
    num_tokens: int | None
    expiry_time: float | None
    generation: int | None

    @property
    def complete(self) -> bool:
        """Whether the handle names everything a read needs."""
        return bool(self.block_ids) and None not in (self.engine_id, self.request_id, self.host, self.port)


class ParamsError(ProtocolError):
    """Malformed kv_transfer_params (HTTP 400)."""

    def __init__(self, message: str):
        super().__init__(400, message, param="kv_transfer_params")


def first_group(block_ids: Any) -> list[int]:
    """Block ids of the first KV-cache group; accepts vLLM's list of lists or a flat list."""
    if block_ids is None:
        return []
    if not isinstance(block_ids, list):
        raise ParamsError("kv_transfer_params.remote_block_ids: must be a list")
    if block_ids and isinstance(block_ids[0], list):
        block_ids = block_ids[0]
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in block_ids):
        raise ParamsError("kv_transfer_params.remote_block_ids: must hold integers")
    return list(block_ids)


def _opt(params: dict[str, Any], key: str, kind: type) -> Any:
    value = params.get(key)
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ParamsError(f"kv_transfer_params.{key}: must be {kind.__name__}")
    return value


def classify(params: Any) -> tuple[Mode, RemoteHandle | None]:
    """The mode a request asks for and the remote handle it names, if any."""
    if params is None:
        return Mode.PLAIN, None
    if not isinstance(params, dict):
        raise ParamsError("kv_transfer_params: must be an object")
    handle = RemoteHandle(
        engine_id=_opt(params, "remote_engine_id", str),
        request_id=_opt(params, "remote_request_id", str),
        host=_opt(params, "remote_host", str),
        port=_opt(params, "remote_port", int),
        block_ids=first_group(params.get("remote_block_ids")),
        num_tokens=_opt(params, "remote_num_tokens", int),
        expiry_time=_opt(params, "remote_blocks_expiry_time", float),
        generation=_opt(params, "remote_registration_generation", int),
    )
    if params.get("do_remote_decode"):
        return (Mode.PULL if handle.complete else Mode.PREFILL), handle
    if params.get("do_remote_prefill"):
        return Mode.DECODE, handle
    return Mode.PLAIN, None


def prefill_params(block_ids: list[int], engine_id: str, request_id: str, host: str, port: int, tp_size: int) -> dict[str, Any]:
    """What a prefill node returns for the decode node (forwarded by the proxy)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [block_ids],
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
    }


def retained_params(
    block_ids: list[int],
    engine_id: str,
    request_id: str,
    host: str,
    port: int,
    num_tokens: int,
    expiry_time: float,
    generation: int,
    tp_size: int = 1,
) -> dict[str, Any]:
    """What a decode node returns when a turn ends with bidirectional transfer on: a prefill
    node's params in the other direction, with what a pull checks."""
    return {
        **prefill_params(block_ids, engine_id, request_id, host, port, tp_size),
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": num_tokens,
        "remote_blocks_expiry_time": expiry_time,
        "remote_registration_generation": generation,
        "transfer_mode": "pull",
    }
