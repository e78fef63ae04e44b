"""The campaign's faults: a plan drawn from the seed alone, and its execution.

The plan is a list of (second, kind, target, hold) made before anything runs, so one seed
always gives the same faults in the same order; they overlap wherever one's hold outlasts
the gap to the next. Kinds:

- `kill`: SIGKILL a service replica or an engine, start it again after `hold` seconds;
- `stop`: SIGSTOP it, SIGCONT after `hold` seconds;
- `pg-failover`: the Postgres primary's host dies (its Patroni and postmaster SIGKILLed); Patroni
  promotes a standby; the node comes back as a standby `hold` seconds after the new primary;
- `pg-restart`: the primary's PostgreSQL restarts through Patroni (no failover).

At most one Postgres fault runs at a time, and one fault per process: a later one waits for
the one before it to end.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass, field

from boomerang_tools.chaos.cluster import Cluster, Proc
from boomerang_tools.stack.children import ChildFailed


@dataclass(frozen=True)
class Fault:
    """One planned fault."""

    at: float  # seconds after the fault window opens
    kind: str
    target: str  # a process name, or `postgres`
    hold: float  # seconds down or stopped

    def describe(self) -> str:
        """One line for the report."""
        return f"+{self.at:6.1f}s  {self.kind:<11} {self.target:<16} hold {self.hold:.1f}s"


@dataclass
class Ran:
    """A fault as it ran: wall-clock start and end (end: the target serves again)."""

    fault: Fault
    started: float = 0.0
    ended: float = 0.0
    note: str = ""


def plan(seed: int, window: float, names: list[str]) -> list[Fault]:
    """Faults over `window` seconds from `seed`: one failover and one restart of Postgres, then random
    ones every 2-7 s (mostly kills and stops of a process)."""
    rng = random.Random(seed)
    faults = [Fault(rng.uniform(0.1, 0.5) * window, "pg-failover", "postgres", rng.uniform(3, 8)),
              Fault(rng.uniform(0.05, 0.9) * window, "pg-restart", "postgres", 0.0)]
    at = rng.uniform(1, 4)
    while at < window:
        roll = rng.random()
        if roll < 0.47:
            faults.append(Fault(at, "kill", rng.choice(names), rng.uniform(1, 5)))
        elif roll < 0.94:
            faults.append(Fault(at, "stop", rng.choice(names), rng.uniform(0.5, 4)))
        elif roll < 0.97:
            faults.append(Fault(at, "pg-restart", "postgres", 0.0))
        else:  # Postgres faults are rarer: each takes the database away for up to Patroni's TTL
            faults.append(Fault(at, "pg-failover", "postgres", rng.uniform(3, 8)))
        at += rng.uniform(2, 7)
    return sorted(faults, key=lambda f: f.at)


@dataclass
class Injector:
    """Runs a plan against a cluster; `ran` records what happened and when."""

    cluster: Cluster
    ran: list[Ran] = field(default_factory=list)
    _pg_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)  # one fault at a time per process

    async def run(self, faults: list[Fault]) -> None:
        """Each fault at its second (from now), side by side; returns when every one has ended."""
        opened = time.monotonic()
        tasks = []
        for fault in faults:
            await asyncio.sleep(max(0.0, opened + fault.at - time.monotonic()))
            tasks.append(asyncio.create_task(self._one(fault)))
        await asyncio.gather(*tasks)

    async def _one(self, fault: Fault) -> None:
        ran = Ran(fault)
        self.ran.append(ran)
        try:
            if fault.kind.startswith("pg-"):
                async with self._pg_lock:
                    ran.started = time.time()
                    await (self._failover(ran) if fault.kind == "pg-failover" else self._pg_restart(ran))
            else:
                async with self._locks.setdefault(fault.target, asyncio.Lock()):
                    ran.started = time.time()
                    proc = self.cluster.procs[fault.target]
                    await (self._kill(proc, fault.hold) if fault.kind == "kill" else self._stop(proc, fault.hold))
        except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is reported, not fatal
            ran.note = f"not applied: {exc!r}"
        ran.ended = time.time()

    async def _kill(self, proc: Proc, hold: float) -> None:
        assert proc.child is not None
        proc.child.signal(signal.SIGKILL)
        await asyncio.to_thread(proc.child.finish, 10)
        await asyncio.sleep(hold)
        await self.supervise(proc)

    async def supervise(self, proc: Proc, patience: float = 180.0) -> None:
        """Start `proc` again until it is ready, as a supervisor (systemd, Kubernetes) would: a service
        refuses to start while Postgres has no primary."""
        deadline = time.monotonic() + patience
        while True:
            child = self.cluster.spawn(proc)  # in the loop's (main) thread: armed to die with us
            try:
                await asyncio.to_thread(child.wait_ready, 120)
                return
            except ChildFailed:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def _stop(self, proc: Proc, hold: float) -> None:
        assert proc.child is not None
        child = proc.child
        child.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(hold)
        finally:
            child.signal(signal.SIGCONT)

    async def _failover(self, ran: Ran) -> None:
        ha = self.cluster.ha
        # A host dies in a healthy cluster: in synchronous mode Patroni promotes only the
        # synchronous standby, and refuses (rightly) while there is none.
        await asyncio.to_thread(ha.wait_streaming, 180)
        old = await asyncio.to_thread(ha.wait_primary, 120)
        killed = time.time()
        await asyncio.to_thread(ha.kill_node, old)
        new = await asyncio.to_thread(ha.wait_primary, 120)
        ran.note = f"{old.name} killed, {new.name} promoted after {time.time() - killed:.1f}s"
        await asyncio.sleep(ran.fault.hold)
        ha.start_node(old)  # rejoins as a standby (pg_rewind); main thread
        await asyncio.to_thread(ha.wait_streaming, 180)

    async def _pg_restart(self, ran: Ran) -> None:
        ha = self.cluster.ha
        await asyncio.to_thread(ha.wait_streaming, 180)
        node = await asyncio.to_thread(ha.wait_primary, 120)
        accepted = await asyncio.to_thread(ha.restart_postgres, node)
        ran.note = f"{node.name} restarted" if accepted else f"{node.name}: Patroni refused the restart"
        await asyncio.sleep(1.0)
        await asyncio.to_thread(ha.wait_primary, 120)
        await asyncio.to_thread(ha.wait_streaming, 180)
