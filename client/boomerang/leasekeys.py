"""Which prompts may have a live lease: the summary that lets a turn with nothing to pull skip its plan.

A plan costs a round trip (and, through the gateway, a tokenize call) before the prefill
starts; for a prompt with no live lease to continue it can only answer COLD. The registry
streams a summary of its live leases (`WatchLeaseKeys`) to prefill hooks and gateways, and
a prompt the summary rules out starts at once, COLD, with no round trip.

The summary is a set of 64-bit keys, two per live lease, matching the two ways a claim finds
one (design.md, "The token chain"):

* with a conversation id, the claim reads that conversation's leases only: the key is
  `conversation_key(tenant, conversation_id)`;
* without one, the claim reads the leases whose previous prompt the new prompt continues,
  found by the chain key of that prompt's last whole block (`tokenchain.prompt_key`); the
  summary holds `prompt_entry(tenant, prompt_key)`, and a new prompt is a "maybe" when any
  of its whole blocks' keys is in it (`may_continue`). A shared system prompt alone never
  makes a prompt a "maybe": the key is the end of a previous prompt, past its user message.

A key in the summary only says "maybe": the plan still verifies and claims as always, so a
false "maybe" (a lease that ended since the last snapshot, a 64-bit collision) costs one
round trip. A missing key ("no") costs a pull at most, and only when the summary is behind
the registry (a lease registered a moment ago whose keys are still on their way); the
callers verify each "no" in the background and count those that were wrong. Until the first
snapshot is in, and from the moment the stream breaks, every prompt is a "maybe".

`LeaseKeysThread` (a daemon thread, the prefill hook's; the gateway's asyncio twin is
`boomerang_gateway.server.watch_lease_keys`) reads the stream into the summary (`apply`) and
reconnects after a pause when it ends. While the stream is down the summary is unknown
(`LeaseSummary.lost`).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import xxhash

from boomerang.tokenchain import TokenChain, probe_keys
from boomerang.v1 import registry_service_pb2 as rpb

log = logging.getLogger(__name__)
MASK64 = (1 << 64) - 1
RETRY_SECONDS = 1.0


def conversation_key(tenant: str, conversation_id: str) -> int:
    """The summary's key of a conversation that has a live lease."""
    return xxhash.xxh3_64_intdigest(b"c\x00" + tenant.encode() + b"\x00" + conversation_id.encode())


def _tenant_mix(tenant: str) -> int:
    return xxhash.xxh3_64_intdigest(b"p\x00" + tenant.encode())


def prompt_entry(tenant: str, prompt_key: int) -> int:
    """The summary's key of a live lease's previous prompt (its `prompt_key`, a chain hash
    already): mixed with the tenant, so one tenant's prompt never matches another's."""
    return (prompt_key & MASK64) ^ _tenant_mix(tenant)


def lease_keys(tenant: str, conversation_id: str, prompt_key: int | None) -> list[int]:
    """The keys one live lease adds to the summary."""
    out = []
    if conversation_id:
        out.append(conversation_key(tenant, conversation_id))
    if prompt_key is not None:
        out.append(prompt_entry(tenant, prompt_key))
    return out


def keys_of_leases(leases: Iterable[tuple[str, str, int | None]]) -> list[int]:
    """`lease_keys` of many (tenant, conversation id, prompt key) rows: a snapshot's, in one loop."""
    digest, mixes, keys = xxhash.xxh3_64_intdigest, dict[str, int](), list[int]()
    add = keys.append
    for tenant, conversation_id, prompt_key in leases:
        if conversation_id:
            add(digest(b"c\x00" + tenant.encode() + b"\x00" + conversation_id.encode()))
        if prompt_key is not None:
            mix = mixes.get(tenant)
            if mix is None:
                mix = mixes[tenant] = _tenant_mix(tenant)
            add((prompt_key & MASK64) ^ mix)
    return keys


def pack(keys: Sequence[int]) -> bytes:
    """Keys as the wire carries them: little-endian u64s."""
    return struct.pack(f"<{len(keys)}Q", *keys)


def unpack(data: bytes) -> tuple[int, ...]:
    """The keys of a `pack`ed message; ValueError when it is not whole keys."""
    if len(data) % 8:
        raise ValueError("lease keys must be 8 bytes each")
    return struct.unpack(f"<{len(data) // 8}Q", data)


class LeaseSummary:
    """The watcher's copy of the registry's summary, read by any thread.

    One writer (the stream's reader) and any number of readers: the live set is swapped
    whole on a new snapshot and only ever grows in between, both atomic under the GIL.
    """

    def __init__(self) -> None:
        self._keys: set[int] | None = None  # None: not known (no snapshot yet, or the stream broke)
        self._building: set[int] | None = None
        self._lock = threading.Lock()
        self.snapshots = 0
        self.live_leases = 0

    @property
    def ready(self) -> bool:
        """Whether the summary can rule a prompt out (a snapshot is in and the stream is up)."""
        return self._keys is not None

    def __len__(self) -> int:
        keys = self._keys
        return len(keys) if keys is not None else 0

    def snapshot_part(self, keys: Iterable[int], complete: bool, live_leases: int = 0) -> None:
        """A part of a new snapshot; the last (`complete`) swaps it in."""
        with self._lock:
            if self._building is None:
                self._building = set()
            self._building.update(keys)
            if complete:
                self._keys, self._building = self._building, None
                self.snapshots += 1
                self.live_leases = live_leases

    def add(self, keys: Iterable[int]) -> None:
        """Keys of leases registered since the snapshot (or about to be: a caller's own report)."""
        keys = list(keys)
        with self._lock:
            if self._keys is not None:
                self._keys.update(keys)
            if self._building is not None:
                self._building.update(keys)

    def lost(self) -> None:
        """The stream broke: nothing can be ruled out until the next snapshot."""
        with self._lock:
            self._keys = None
            self._building = None

    def may_have_conversation(self, tenant: str, conversation_id: str) -> bool:
        """False only when the conversation surely has no live lease (a plan would find none)."""
        keys = self._keys
        return keys is None or conversation_key(tenant, conversation_id) in keys

    def may_continue(self, tenant: str, chain: TokenChain) -> bool:
        """False only when no live lease's previous prompt can be a prefix of this prompt."""
        keys = self._keys
        if keys is None:
            return True
        mix = _tenant_mix(tenant)
        return any(((k & MASK64) ^ mix) in keys for k in probe_keys(chain))


def apply(summary: LeaseSummary, message: rpb.WatchLeaseKeysResponse) -> None:
    """Apply one stream message to the summary."""
    keys = unpack(message.keys)
    if message.snapshot:
        summary.snapshot_part(keys, message.snapshot_complete, message.live_leases)
    else:
        summary.add(keys)


class LeaseKeysThread:
    """A daemon thread that keeps `summary` current from a blocking registry client."""

    def __init__(self, client: Any, summary: LeaseSummary, watcher: str, retry: float = RETRY_SECONDS):
        self.client = client  # a SyncRegistryClient
        self.summary = summary
        self.watcher = watcher
        self.retry = retry
        self._stop = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, name="boomerang-lease-keys", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def close(self) -> None:
        """Stop watching (the stream is cancelled; the thread ends)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream = self.client.watch_lease_keys(self.watcher)
                for message in self._stream:
                    apply(self.summary, message)
            except Exception as exc:  # noqa: BLE001 - any failure: the summary is unknown until the next snapshot
                if not self._stop.is_set():
                    log.info("boomerang: lease-keys watch ended (%s); retrying in %.1f s", exc, self.retry)
            self.summary.lost()
            self._stop.wait(self.retry)
