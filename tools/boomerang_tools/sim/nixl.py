"""vLLM's NixlConnector as the simulator speaks it: the `kv_transfer_params` it reads and
writes (docs/vllm-contract.md), and the side channel: reads of another engine's blocks over HTTP.

In vLLM the NixlConnector connects to a remote engine's side channel (`remote_host`,
`remote_port`), exchanges agent metadata once per remote engine (the handshake), then reads
blocks by RDMA and notifies the remote engine, which frees them. Here the side channel is a
second HTTP port of the remote simulator:

- `GET /sim/nixl/clock` — the handshake: the remote engine id, registration generation and
  its monotonic clock; the reader records `remote clock − own clock` (taken at the middle
  of the round trip) once per remote engine, to convert `remote_blocks_expiry_time`;
- `POST /sim/nixl/read` `{"request_id", "block_ids", "num_tokens",
  "registration_generation"?, "engine_id"?}` — the token contents of the blocks (200), after
  which the remote engine frees them; or 410 with a reason (`FREED`, `STALE_GENERATION`,
  `UNKNOWN_BLOCKS`) when they are gone — the case where real hardware returns garbage; or 409
  when `engine_id` is not this engine's (a restarted engine on the same address: the
  transfer fails, as an RDMA read of a dead agent's memory does);
- `POST /sim/nixl/free` `{"request_id"}` — free without reading (the reader recomputed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import httpx

from boomerang_tools.sim.kvstore import Clock, ReadError
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


class Unreachable(Exception):
    """The remote side channel did not answer (vLLM: a failed transfer; it recomputes)."""


@dataclass(frozen=True)
class Peer:
    """What the handshake learned about a remote engine."""

    engine_id: str
    generation: int
    clock_offset: float  # remote clock minus this engine's clock, seconds


class NixlClient:
    """Reads from other simulated engines' side channels."""

    def __init__(self, clock: Clock, timeout: float = 5.0):
        self.clock = clock
        self.http = httpx.AsyncClient(timeout=timeout)
        self.peers: dict[tuple[str, str, int], Peer] = {}
        self.handshakes = 0

    async def close(self) -> None:
        """Close connections."""
        await self.http.aclose()

    async def peer(self, engine_id: str, host: str, port: int) -> Peer:
        """Handshake once per remote engine; later calls return the cached result."""
        key = (engine_id, host, port)
        if key not in self.peers:
            before = self.clock.now()
            body = await self._call("GET", host, port, "/sim/nixl/clock", None)
            after = self.clock.now()
            if engine_id and body.get("engine_id") != engine_id:
                # vLLM's handshake refuses another agent ("Remote NIXL agent engine ID mismatch"):
                # the address now belongs to a restarted engine.
                raise Unreachable(f"{host}:{port} is engine {body.get('engine_id')!r}, not {engine_id!r}")
            offset = float(body["perf_counter"]) - (before + after) / 2
            self.peers[key] = Peer(str(body["engine_id"]), int(body["registration_generation"]), offset)
            self.handshakes += 1
        return self.peers[key]

    async def read(
        self, host: str, port: int, request_id: str, block_ids: list[int], num_tokens: int, generation: int | None,
        engine_id: str = "",
    ) -> list[int]:
        """Read blocks' token contents; the remote engine frees them. Raises Unreachable, or
        ReadError when the blocks are gone (its `reason` says why).

        With `engine_id`, the read is bound to that engine as an RDMA read is to the memory its
        agent registered: an engine restarted on the same address (another id) fails it (409).
        """
        body = await self._call(
            "POST",
            host,
            port,
            "/sim/nixl/read",
            {"request_id": request_id, "block_ids": block_ids, "num_tokens": num_tokens, "registration_generation": generation,
             **({"engine_id": engine_id} if engine_id else {})},
        )
        return [int(t) for t in body["tokens"]]

    async def free(self, host: str, port: int, request_id: str) -> None:
        """Tell the remote engine to free a handle without reading it."""
        await self._call("POST", host, port, "/sim/nixl/free", {"request_id": request_id})

    async def _call(self, method: str, host: str, port: int, path: str, payload: dict | None) -> dict:  # type: ignore[type-arg]
        if host not in ("127.0.0.1", "localhost", "::1"):
            # The simulator never leaves this machine.
            raise Unreachable(f"side channel host {host!r} is not local")
        url = f"http://{'[::1]' if host == '::1' else host}:{port}{path}"
        try:
            resp = await self.http.request(method, url, json=payload)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{url}: {exc!r}") from exc
        if resp.status_code == 410:
            body = resp.json()
            raise ReadError(str(body.get("reason", "FREED")), str(body.get("message", "")))
        if resp.status_code != 200:
            raise Unreachable(f"{url}: HTTP {resp.status_code}")
        result: dict = resp.json()  # type: ignore[type-arg]
        return result
