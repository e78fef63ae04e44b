"""The simulated NIXL side channel: reads of another engine's blocks over HTTP.

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

from dataclasses import dataclass

import httpx

from boomerang_tools.sim.kvstore import Clock, ReadError


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
