"""The services under test as child processes, the benchmark's engines, and their memory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import types_pb2 as tpb

from boomerang_tools.bench.preload import EngineRow
from boomerang_tools.bench.workload import BLOCK_SIZE, MODEL
from boomerang_tools.stack.children import Child, ChildFailed, stop_all

log = logging.getLogger(__name__)

ENGINE_TTL_SECONDS = 3600  # long enough that nothing preloaded expires during a run


def memory_mb(pid: int) -> dict[str, float]:
    """Resident and peak resident memory of a process, MB (Linux /proc)."""
    out = {"rss_mb": 0.0, "peak_rss_mb": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("VmHWM:"):
                out["peak_rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used by groups of processes between `start()` and `stop()`, seconds per group.

    Each process counts from its value at `start()` (or from zero when it started later);
    `refresh` re-lists a group's processes at `stop()` (Postgres backends come and go). A
    process that ended in between is not counted, so a figure may fall short, never over.
    """

    def __init__(self, pids: dict[str, list[int]], refresh: dict[str, Callable[[], list[int]]] | None = None):
        self.pids = pids
        self.refresh = refresh or {}
        self.before: dict[int, float] = {}

    def start(self) -> CpuMeter:
        """Take the starting point."""
        self.before = {p: cpu_seconds(p) for pids in self.pids.values() for p in pids}
        return self

    def stop(self) -> dict[str, float]:
        """CPU seconds used since `start()`, per group."""
        out = {}
        for name, pids in self.pids.items():
            now = self.refresh[name]() if name in self.refresh else pids
            out[name] = round(sum(max(0.0, cpu_seconds(p) - self.before.get(p, 0.0)) for p in set(now)), 3)
        return out


@dataclass
class Services:
    """Children started by the benchmark, stopped in reverse order."""

    log_dir: Path
    env: dict[str, str]
    children: dict[str, Child] = field(default_factory=dict)
    restarted: list[str] = field(default_factory=list)  # children started twice (see `_ready`)

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        """Start `boomerang <args>` (does not wait)."""
        child = Child(name, args, self.log_dir, {**self.env, **(env or {})})
        child.start()
        self.children[name] = child
        return child

    async def ready(self, *names: str, timeout: float = 60.0) -> list[str]:
        """Wait until the named children listen; their addresses."""
        return list(await asyncio.gather(*(self._ready(n, timeout) for n in names)))

    async def _ready(self, name: str, timeout: float) -> str:
        """One child's address; a child that exited before it was ready is started once more.

        Rarely (once in the runs we kept) a simulated engine died between fork and exec with
        only a gRPC poller error in its log, never having run: started from a process full
        of gRPC threads, the forked child runs Python (the parent-death signal's preexec_fn)
        before it execs. A second start of the same command is the same measurement; a
        child that fails twice, or does not start in time, fails the run.
        """
        child = self.children[name]
        try:
            return await asyncio.to_thread(child.wait_ready, timeout)
        except ChildFailed as exc:
            if child.alive():
                raise
            child.finish(5)
            log.warning("%s exited before it was ready (exit code %s); starting it once more:\n%s",
                        name, child.proc.returncode if child.proc else None, exc)
            self.restarted.append(name)
            again = self.start(name, child.args, child.env)
            return await asyncio.to_thread(again.wait_ready, timeout)

    def memory(self) -> dict[str, dict[str, float]]:
        """Memory of every running child."""
        return {n: memory_mb(c.proc.pid) for n, c in self.children.items() if c.alive() and c.proc is not None}

    def pids(self, *names: str) -> dict[str, list[int]]:
        """Process ids of the named running children (a process known by two names, under the first)."""
        out: dict[str, list[int]] = {}
        for n, c in self.children.items():
            if n in names and c.proc is not None and c.alive() and all(c.proc.pid not in p for p in out.values()):
                out[n] = [c.proc.pid]
        return out

    def stop(self, *names: str) -> None:
        """Stop the named children (all when none are named), last started first."""
        chosen = [c for n, c in self.children.items() if not names or n in names]
        stop_all(chosen, timeout=10)
        for n in [n for n, c in self.children.items() if c in chosen]:
            del self.children[n]


@dataclass
class BenchEngines:
    """Decode and prefill engines registered for the plan workload, kept alive by heartbeats."""

    registry: RegistryClient
    decode: list[EngineRow] = field(default_factory=list)
    prefill: list[str] = field(default_factory=list)
    _beats: asyncio.Task[None] | None = None

    async def register(self, decode: int, prefill: int) -> None:
        """RegisterEngine for `decode` decode and `prefill` prefill engines."""
        generation = int(time.time() * 1000)
        for role, count in ((tpb.ENGINE_ROLE_DECODE, decode), (tpb.ENGINE_ROLE_PREFILL, prefill)):
            for i in range(count):
                kind = "d" if role == tpb.ENGINE_ROLE_DECODE else "p"
                engine_id = f"bench-{kind}{i}"
                port = 5600 + i if kind == "d" else 5700 + i
                await self.registry.register_engine(
                    rpb.RegisterEngineRequest(
                        engine=tpb.Engine(
                            engine_id=engine_id, role=role, model=MODEL, side_channel_host="127.0.0.1",
                            side_channel_port=port, http_base_url=f"http://127.0.0.1:{port}",
                            registration_generation=generation, kv_blocks_ttl_seconds=ENGINE_TTL_SECONDS,
                            block_size=BLOCK_SIZE, tp_size=1, dcp_size=1, pp_size=1, bytes_per_block=1 << 20,
                            kv_recompute_threshold=64,
                        ),
                        request_id=f"bench-register-{engine_id}",
                    )
                )
                if kind == "d":
                    self.decode.append(EngineRow(engine_id, MODEL, generation, "127.0.0.1", port, ENGINE_TTL_SECONDS))
                else:
                    self.prefill.append(engine_id)
        self._generation = generation
        self._beats = asyncio.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        ids = [e.engine_id for e in self.decode] + self.prefill
        while True:
            await asyncio.sleep(2.0)
            for engine_id in ids:
                with contextlib.suppress(Exception):
                    await self.registry.heartbeat(
                        rpb.HeartbeatRequest(engine_id=engine_id, registration_generation=self._generation), timeout=2.0
                    )

    async def stop(self) -> None:
        """Stop heartbeating."""
        if self._beats is not None:
            self._beats.cancel()
            await asyncio.gather(self._beats, return_exceptions=True)
