"""The simulated engine: one request from admission to finish, with vLLM's KV semantics.

No HTTP here (that is `app.py`); this module decides what a request's
`kv_transfer_params` mean, pulls or loads remote blocks through the simulated NIXL side
channel (both `nixl.py`), checks every pulled token against the prompt, spends the
cost model's time (`costmodel.py`), produces the deterministic output (`generate.py`) and
pins blocks on finish (`kvstore.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from boomerang_tools.sim.costmodel import Link
from boomerang_tools.sim.generate import Piece, generate
from boomerang_tools.sim.hooked import SimHook
from boomerang_tools.sim.kvstore import (
    Clock,
    HandleKind,
    Hit,
    KVStore,
    PoolExhausted,
    PrefixCache,
    ReadError,
)
from boomerang_tools.sim.nixl import (
    Mode,
    NixlClient,
    RemoteHandle,
    Unreachable,
    classify,
    prefill_params,
    retained_params,
)
from boomerang_tools.sim.protocol import ProtocolError
from boomerang_tools.sim.state import Admission, Finish, GenRequest, SimConfig, Stats, Token
from boomerang_tools.sim.tokenizer import SKIPPED_IN_TEXT

# Re-exported: the engine's public vocabulary lives in state.py.
__all__ = ["Admission", "Engine", "Finish", "GenRequest", "SimConfig", "Stats", "Token"]

log = logging.getLogger(__name__)


@dataclass
class _Context:
    effective: list[int]  # the tokens whose KV the engine really holds for the prompt
    budget_ms: float
    # Prompt tokens not computed (pulled or loaded): vLLM's `num_cached_tokens`.
    cached_tokens: int = 0
    # The budget's last part: computing the prompt on this engine's GPU (pauses its decodes).
    compute_ms: float = 0.0


@dataclass(frozen=True)
class _Pause:
    """A prefill on this engine's GPU: running decodes make no step from `start` to `end`
    (loop time, seconds)."""

    id: int
    start: float
    end: float


class Engine:
    """One simulated vLLM engine with the NixlConnector and bidirectional transfer."""

    def __init__(self, config: SimConfig, generation: int):
        self.config = config
        self.generation = generation
        self.epoch = 0
        self.clock = Clock(config.clock_offset)
        self.kv = KVStore(config.num_gpu_blocks, config.block_size, self.clock)
        self.prefix = PrefixCache(config.prefix_cache_blocks, config.block_size)
        self.nixl = NixlClient(self.clock)
        self.stats = Stats()
        self.recent: deque[dict[str, Any]] = deque(maxlen=200)
        self.in_flight = 0
        self.queued_prompt_tokens = 0
        self.restarted = asyncio.Event()
        self.hook: SimHook | None = None  # `--hook`: Boomerang's vLLM hook runs inside this engine
        # D→P links by remote engine id (this engine pulling from it); others use `link`.
        self.link = config.link or config.profile.link
        self.links: dict[str, Link] = dict(config.links)
        self.pauses: list[_Pause] = []
        self._pause_ids = itertools.count()
        self.itl_gaps: deque[float] = deque(maxlen=4096)  # measured inter-token gaps, unscaled ms
        # How late each first token came after the time the cost model gave it, real ms: the
        # simulator's own work showing (on a busy host, when it outlasts the modelled step).
        self.late_ms: deque[float] = deque(maxlen=4096)

        # Line-buffered: each event is the kernel's once written, so it outlives a SIGKILL.
        self.ledger = open(config.ledger, "a", buffering=1) if config.ledger else None  # noqa: SIM115 - closed by close()

    def link_for(self, remote_engine_id: str | None) -> Link:
        """The link a pull from that engine goes over."""
        return self.links.get(remote_engine_id or "", self.link)

    def set_link(self, link: Link, remote_engine_id: str | None = None) -> None:
        """Change the link to one engine, or the default for every other (`POST /sim/link`)."""
        if remote_engine_id:
            self.links[remote_engine_id] = link
        else:
            self.link = link

    async def close(self) -> None:
        """Release client connections (and flush the hook's senders)."""
        if self.hook is not None:
            await self.hook.close()
        await self.nixl.close()
        if self.ledger is not None:
            self.ledger.close()

    # -- admission -------------------------------------------------------------------------

    def admit(self, req: GenRequest, request_id: str, started: float | None = None) -> Admission:
        """Check limits and allocate the prompt's blocks, or raise ProtocolError. `started`:
        when the request arrived (loop time, plus any time Boomerang's hook held it): its
        modelled time counts from there, so the simulator's own parsing and tokenizing are
        inside it, never added to it."""
        n, limit = len(req.prompt_ids), self.config.max_model_len
        if n == 0:
            raise ProtocolError(400, "The prompt is empty.", param="prompt")
        if n >= limit:
            raise ProtocolError(
                400, f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {n} input tokens. Please reduce the length of the input messages.",
                param="messages")
        if req.max_tokens > limit - n:
            raise ProtocolError(
                400, f"'max_tokens' or 'max_completion_tokens' is too large: {req.max_tokens}. This "
                f"model's maximum context length is {limit} tokens and your request has {n} input "
                f"tokens ({req.max_tokens} > {limit} - {n}).", param="max_tokens")
        mode, remote = classify(req.kv_transfer_params)
        try:
            alloc = self.kv.allocate(n)
        except PoolExhausted as exc:
            raise ProtocolError(503, str(exc), "ServiceUnavailableError") from None
        self.stats.requests += 1
        self.stats.prompt_tokens += n
        now = asyncio.get_running_loop().time()
        return Admission(request_id, req, mode, remote, alloc, self.epoch, now if started is None else started)

    # -- running ---------------------------------------------------------------------------

    async def run(self, adm: Admission) -> AsyncIterator[Token]:
        """Tokens at the cost model's pace; the last one carries the Finish.

        Closing the iterator before the last token aborts the request: its blocks are
        freed at once and nothing is retained, as vLLM does for an aborted request.
        """
        req, n = adm.req, len(adm.req.prompt_ids)
        adm.ran = True
        self.in_flight += 1
        self.queued_prompt_tokens += n
        queued, finished = True, False
        scale = self.config.time_scale / 1000
        try:
            ctx = await self._context(adm)
            # The modelled step ends when the cost model says, counted from the request's
            # arrival: the simulator's own work above (parsing, tokenizing, moving blocks) is
            # inside that time, not added to it.
            deadline = adm.started + ctx.budget_ms * scale
            if ctx.compute_ms > 0:
                self._pause(deadline - ctx.compute_ms * scale, deadline)
            keys = self.prefix.keys(req.prompt_ids) if adm.mode is not Mode.DECODE else []
            await self._sleep_until(deadline)
            self.late_ms.append((asyncio.get_running_loop().time() - deadline) * 1000)
            if adm.mode is not Mode.DECODE and adm.epoch == self.epoch:
                self.prefix.insert(req.prompt_ids, ctx.effective, keys)  # the prompt's KV is computed
            self.queued_prompt_tokens -= n
            queued = False
            pieces = self._output(ctx.effective, req)
            last = len(pieces) - 1
            step_at, emitted = deadline, asyncio.get_running_loop().time()
            for i, piece in enumerate(pieces):
                if i:
                    step_at = await self._decode_step(step_at, self.config.profile.itl_ms * scale)
                    now = asyncio.get_running_loop().time()
                    if scale > 0:
                        self.itl_gaps.append((now - emitted) / scale)
                    emitted = now
                self._grow(adm, n + i + 1)
                finish = None
                if i == last:
                    finished = True
                    self.stats.generated_tokens += len(pieces)
                    stopped = piece.text == req.eos and not req.ignore_eos
                    ids = [q.id for q in pieces]
                    params = self._finish(adm, ctx.effective, ids)
                    if self.prefix.enabled and adm.mode in (Mode.DECODE, Mode.PLAIN) and adm.epoch == self.epoch:
                        # With prefix caching on, vLLM caches the blocks of every request,
                        # loaded and generated alike: a new turn sent straight to a decode
                        # engine prefills over that history (`standalone_ms`).
                        self.prefix.insert(req.prompt_ids + ids[:-1], ctx.effective + ids[:-1])
                    if params is not None and params.get("do_remote_prefill"):
                        # vLLM's scheduler: P's cache hits ride to D, which reports them.
                        params["remote_prefill_cached_tokens"] = ctx.cached_tokens
                    if self.hook is not None:
                        params = await self.hook.finished(adm.request_id, ids, params)
                    finish = Finish("stop" if stopped else "length", params, _reported_cached(adm, ctx))
                yield Token(piece.id, "" if piece.text in SKIPPED_IN_TEXT else piece.text, finish)
        finally:
            self.in_flight -= 1
            if queued:
                self.queued_prompt_tokens -= n
            if not finished:
                self.stats.aborted += 1
                self.kv.release(adm.alloc)
                if self.hook is not None:
                    self.hook.aborted(adm.request_id)

    def discard(self, adm: Admission) -> None:
        """Release an admitted request whose run never started (the client left first)."""
        if not adm.ran and adm.alloc.live:
            adm.ran = True
            self.stats.aborted += 1
            self.kv.release(adm.alloc)
            if self.hook is not None:
                self.hook.aborted(adm.request_id)

    def _output(self, effective: list[int], req: GenRequest) -> list[Piece]:
        """The output pieces, honouring max_tokens, min_tokens and ignore_eos."""
        out: list[Piece] = []
        for piece in generate(effective, req.eos, req.reasoning):
            if len(out) >= req.max_tokens:
                break
            if piece.text == req.eos and len(out) < req.min_tokens:
                continue  # vLLM masks EOS until min_tokens
            out.append(piece)
            if piece.text == req.eos and not req.ignore_eos:
                break
        return out

    def _grow(self, adm: Admission, num_tokens: int) -> None:
        """Allocate an output block when the sequence crosses a block boundary."""
        if not adm.alloc.live or self.kv.blocks_for(num_tokens) <= len(adm.alloc.block_ids):
            return
        if self.kv.free:
            adm.alloc.block_ids.append(self.kv.free.popleft())

    async def _sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))

    def _pause(self, start: float, end: float) -> None:
        """A prefill computes on this engine from `start` to `end`: running decodes wait."""
        now = asyncio.get_running_loop().time()
        self.pauses = [p for p in self.pauses if p.end > now - 60.0]
        self.pauses.append(_Pause(next(self._pause_ids), start, end))
        self.stats.local_prefill_ms += (end - start) * 1000 / max(self.config.time_scale, 1e-9)

    async def _decode_step(self, previous: float, itl: float) -> float:
        """One decode step after the one that ended at `previous` (loop time): it ends `itl`
        later, plus every pause a prefill on this engine puts in its way, also one that starts
        while it waits. Returns when it ended."""
        end, counted = previous + itl, set()
        while True:
            for p in self.pauses:
                if p.id not in counted and p.start < end and p.end > previous:
                    counted.add(p.id)
                    stall = p.end - max(p.start, previous)
                    end += stall
                    self.stats.decode_stall_ms += stall * 1000 / max(self.config.time_scale, 1e-9)
            await self._sleep_until(end)
            if not any(p.id not in counted and p.start < end and p.end > previous for p in self.pauses):
                self.stats.decode_steps += 1
                self.stats.decode_stalled_steps += bool(counted)
                return end

    def _note(self, **event: Any) -> None:
        self.recent.append(event)
        if self.ledger is not None:
            self._record(event)

    def _record(self, event: dict[str, Any]) -> None:
        line = {"at": time.time(), "engine_id": self.config.engine_id, "generation": self.generation, **event}
        self.ledger.write(json.dumps(line, separators=(",", ":")) + "\n")  # type: ignore[union-attr]

    # -- before the first token ------------------------------------------------------------

    async def _context(self, adm: Admission) -> _Context:
        p, prompt = self.config.profile, adm.req.prompt_ids
        if adm.mode is Mode.DECODE:
            return await self._load(adm)
        hit = self._lookup(prompt)
        if adm.mode is Mode.PULL:
            return await self._pull(adm, hit)
        if adm.mode is Mode.PLAIN:
            self.stats.local_prefills += 1
            return self._computed(prompt, hit, p.standalone_ms(len(prompt), hit.tokens))
        return self._computed(prompt, hit, p.prefill_ms(len(prompt), 0, hit.tokens))

    def _computed(self, prompt: list[int], hit: Hit, budget_ms: float) -> _Context:
        """The prompt computed here past this engine's own prefix-cache hit."""
        n = len(prompt)
        self.stats.computed_tokens += n - hit.tokens
        compute_ms = self.config.profile.compute_ms(n - hit.tokens, hit.tokens)
        return _Context(hit.kv + prompt[hit.tokens:], budget_ms, hit.tokens, compute_ms)

    def _lookup(self, prompt: list[int]) -> Hit:
        """This engine's own prefix-cache hit for a prompt it is about to compute."""
        hit = self.prefix.lookup(prompt)
        if self.prefix.enabled:
            self.stats.prefix_cache_queries += len(prompt)
            self.stats.prefix_cache_hits += hit.tokens
        return hit

    async def _pull(self, adm: Admission, hit: Hit) -> _Context:
        """P: pull D's retained blocks past its own prefix-cache hit (docs/vllm-contract.md, 'What P
        does with a handle'; the NixlConnector reads only the tokens the local cache lacks)."""
        cfg, p, prompt, remote = self.config, self.config.profile, adm.req.prompt_ids, adm.remote
        assert remote is not None and remote.host is not None and remote.port is not None and remote.request_id
        n = len(prompt)
        available = remote.num_tokens if remote.num_tokens is not None else len(remote.block_ids) * cfg.block_size
        # min(remote_num_tokens, prompt); like any cache hit, the last prompt token is always
        # computed so the engine has logits to sample from. P's own hit (`local`, whole
        # blocks) is not pulled again.
        count = max(0, min(available, n - 1, len(remote.block_ids) * cfg.block_size))
        local = min(hit.tokens, count)
        event = {"request_id": adm.request_id, "kind": "pull", "remote_request_id": remote.request_id,
                 "remote_engine_id": remote.engine_id, "count": count - local, **({"local_hit": local} if local else {})}

        def recompute(outcome: str) -> _Context:
            self._note(**event, outcome=outcome)
            return self._computed(prompt, hit, p.prefill_ms(n, 0, hit.tokens))

        try:
            peer = await self.nixl.peer(remote.engine_id or "", remote.host, remote.port)
        except Unreachable as exc:
            self.stats.pull_failures += 1
            log.warning("pull %s: handshake failed: %s", adm.request_id, exc)
            return recompute("handshake_failed")
        if remote.expiry_time is not None:
            remaining = (remote.expiry_time - peer.clock_offset) - self.clock.now()
            if remaining < cfg.expiry_margin_seconds:
                self.stats.declined_expiring += 1
                return recompute("declined_expiring")
        if count - local < cfg.recompute_threshold or (local and count == local):
            self.stats.recomputed_below_threshold += 1
            await self._free_remote(remote)
            return recompute("below_threshold")
        blocks = remote.block_ids[local // cfg.block_size : -(-count // cfg.block_size)]
        try:
            pulled = await self.nixl.read(remote.host, remote.port, remote.request_id, blocks, count - local,
                                          remote.generation, remote.engine_id or "")
        except Unreachable as exc:
            self.stats.pull_failures += 1
            log.warning("pull %s: read failed: %s", adm.request_id, exc)
            return recompute("read_failed")
        except ReadError as exc:
            # Real hardware reads whatever the freed blocks hold now and returns HTTP 200.
            self.stats.expired_or_freed_reads += 1
            pulled, outcome = [0] * (count - local), f"garbage_{exc.reason.lower()}"
        else:
            outcome = "ok" if pulled == prompt[local:count] else "corrupt"
            if outcome == "corrupt":
                self.stats.corrupt_pulls += 1
        self.stats.pulls += 1
        self.stats.pulled_tokens += count - local
        self.stats.computed_tokens += n - count
        self._note(**event, outcome=outcome)
        link = self.link_for(remote.engine_id)
        return _Context(hit.kv[:local] + pulled + prompt[count:], p.prefill_ms(n, count - local, local, link), count,
                        p.compute_ms(n - count, count))

    async def _free_remote(self, remote: RemoteHandle) -> None:
        assert remote.host is not None and remote.port is not None and remote.request_id
        try:
            await self.nixl.free(remote.host, remote.port, remote.request_id)
        except (Unreachable, ReadError) as exc:
            log.warning("free %s on %s:%s failed: %s", remote.request_id, remote.host, remote.port, exc)

    async def _load(self, adm: Admission) -> _Context:
        """D: load the prompt's KV from the prefill node's held blocks."""
        p, prompt, remote = self.config.profile, adm.req.prompt_ids, adm.remote
        n = len(prompt)
        event = {"request_id": adm.request_id, "kind": "load", "remote_request_id": remote.request_id if remote else None}

        def compute(outcome: str) -> _Context:
            # vLLM's kv_load_failure_policy "recompute": the decode node computes the prompt.
            self.stats.load_failures += 1
            self._note(**event, outcome=outcome)
            return self._computed(prompt, Hit(0, []), p.decode_first_ms(0) + p.compute_ms(n))

        if remote is None or not remote.complete:
            return compute("incomplete_params")
        assert remote.host is not None and remote.port is not None and remote.request_id
        count = min(n, len(remote.block_ids) * self.config.block_size)
        try:
            await self.nixl.peer(remote.engine_id or "", remote.host, remote.port)
            loaded = await self.nixl.read(remote.host, remote.port, remote.request_id, remote.block_ids, count, None,
                                          remote.engine_id or "")
            outcome = "ok" if loaded == prompt[: len(loaded)] else "corrupt"
            if outcome == "corrupt":
                self.stats.corrupt_loads += 1
        except Unreachable as exc:
            log.warning("load %s failed: %s", adm.request_id, exc)
            return compute("load_failed")
        except ReadError as exc:
            self.stats.expired_or_freed_loads += 1
            loaded, outcome = [0] * count, f"garbage_{exc.reason.lower()}"
        self.stats.loads += 1
        self.stats.loaded_tokens += len(loaded)
        self.stats.computed_tokens += n - len(loaded)
        self._note(**event, count=len(loaded), outcome=outcome)
        rest = p.compute_ms(n - len(loaded), len(loaded))
        return _Context(loaded + prompt[len(loaded):], p.decode_first_ms(len(loaded)) + rest, len(loaded), rest)

    # -- finish ----------------------------------------------------------------------------

    def _finish(self, adm: Admission, effective: list[int], out: list[int]) -> dict[str, Any] | None:
        """Pin blocks as the connector's request_finished would; the params to return."""
        cfg = self.config
        self.stats.finished += 1
        if adm.epoch != self.epoch:  # the engine restarted under this request
            self.kv.release(adm.alloc)
            return None
        if adm.mode in (Mode.PREFILL, Mode.PULL):
            h = self.kv.pin(HandleKind.HELD, adm.request_id, adm.alloc, effective, cfg.prefill_hold_seconds, self.generation)
            self.stats.held_turns += 1
            return prefill_params(h.block_ids, cfg.engine_id, adm.request_id, cfg.host, cfg.side_channel_port, cfg.tp_size)
        if adm.mode is Mode.DECODE:
            tokens = effective + out
            if len(adm.alloc.block_ids) < self.kv.blocks_for(len(tokens)):
                self.stats.retention_skipped += 1  # the pool ran dry while decoding
                self.kv.release(adm.alloc)
                return None
            h = self.kv.pin(HandleKind.RETAINED, adm.request_id, adm.alloc, tokens, cfg.ttl_seconds, self.generation)
            self.stats.retained_turns += 1
            if self.ledger is not None:
                self._record({"kind": "retained", "request_id": adm.request_id, "num_tokens": len(tokens)})
            return retained_params(
                h.block_ids, cfg.engine_id, adm.request_id, cfg.host, cfg.side_channel_port,
                len(tokens), h.expires_at, self.generation, cfg.tp_size)
        self.kv.release(adm.alloc)
        return None

    # -- side channel and admin ------------------------------------------------------------

    def serve_read(self, request_id: str, block_ids: list[int], num_tokens: int, generation: int | None) -> list[int]:
        """A remote engine's read of this engine's handle (raises kvstore.ReadError)."""
        try:
            tokens = self.kv.read(request_id, block_ids, num_tokens, generation)
        except Exception:
            self.stats.reads_refused += 1
            raise
        self.stats.reads_served += 1
        return tokens

    def serve_free(self, request_id: str) -> bool:
        """A remote engine's request to free a handle unread."""
        self.stats.frees_requested += 1
        return self.kv.drop(request_id)

    def restart(self, generation: int | None = None) -> int:
        """Simulate an engine restart: a new registration generation, every block dropped."""
        dropped = self.kv.drop_all()
        self.prefix.blocks.clear()
        self.generation = generation if generation is not None else self.generation + 1
        self.epoch += 1
        self.stats.restarts += 1
        self.restarted.set()
        return dropped

    def snapshot(self) -> dict[str, Any]:
        """Counters and gauges for `GET /sim/stats`."""
        cfg = self.config
        return {
            "engine_id": cfg.engine_id,
            "role": cfg.role,
            "profile": cfg.profile.name,
            "model": cfg.served_model_name,
            "registration_generation": self.generation,
            "side_channel": f"{cfg.host}:{cfg.side_channel_port}",
            "clock": self.clock.now(),
            "ttl_seconds": cfg.ttl_seconds,
            "block_size": cfg.block_size,
            "kv_recompute_threshold": cfg.recompute_threshold,
            "time_scale": cfg.time_scale,
            "link": _link_json(self.link),
            "links": {engine_id: _link_json(link) for engine_id, link in self.links.items()},
            **asdict(self.stats),
            **self._itl(),
            "retained_blocks": self.kv.pinned_blocks(HandleKind.RETAINED),
            "retained_handles": sum(h.kind is HandleKind.RETAINED for h in self.kv.handles.values()),
            "held_blocks": self.kv.pinned_blocks(HandleKind.HELD),
            "held_handles": sum(h.kind is HandleKind.HELD for h in self.kv.handles.values()),
            "expired_handles": self.kv.expired,
            "prefix_cache_capacity_blocks": self.prefix.capacity_blocks,
            "prefix_cache_blocks": len(self.prefix.blocks),
            "prefix_cache_evicted_blocks": self.prefix.evicted_blocks,
            "used_blocks": self.kv.used_blocks,
            "free_blocks": len(self.kv.free),
            "in_flight": self.in_flight,
            "handshakes": self.nixl.handshakes,
            "unsafe_pulls": self.stats.corrupt_pulls + self.stats.expired_or_freed_reads,
            "recent": list(self.recent),
            **({"hook": self.hook.stats()} if self.hook is not None else {}),
        }

    def _itl(self) -> dict[str, float | None]:
        """The measured gaps between this engine's recent decode steps (unscaled ms), and how late
        its recent first tokens came after the model's time (real ms)."""
        out: dict[str, float | None] = {}
        for name, values in (("itl_ms", self.itl_gaps), ("first_token_late_ms", self.late_ms)):
            ordered = sorted(values)
            out[f"{name}_p50"] = round(statistics.median(ordered), 3) if ordered else None
            out[f"{name}_p99"] = round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3) if ordered else None
            out[f"{name}_max"] = round(ordered[-1], 3) if ordered else None
        return out

    def reset_stats(self) -> None:
        """Zero the counters (gauges and handles stay)."""
        self.stats = Stats()
        self.recent.clear()
        self.itl_gaps.clear()
        self.late_ms.clear()


def _link_json(link: Link) -> dict[str, float]:
    return {"gbps": link.gbps, "fixed_ms": link.fixed_ms}


def _reported_cached(adm: Admission, ctx: _Context) -> int:
    """The request's `num_cached_tokens` as vLLM's output processor reports it: a decode
    engine given P's `remote_prefill_cached_tokens` reports those, not its own transfer."""
    params = adm.req.kv_transfer_params
    remote = params.get("remote_prefill_cached_tokens") if isinstance(params, dict) else None
    if adm.mode is Mode.DECODE and isinstance(remote, int) and not isinstance(remote, bool) and remote >= 0:
        return remote
    return ctx.cached_tokens
