"""In-process tokenization: the model's own tokenizer and chat template, instead of P's `/tokenize`.

Models named in `BOOMERANG_TOKENIZERS` are tokenized here (`boomerang_server.localtokens`, which
renders as vLLM does); every other model, and every request the renderer does not mirror
exactly, still goes to the prefill engine's `/tokenize`, which stays the truth. Each turn
tokenized here is checked against the prompt ids the decode engine reports for it; one
disagreement is counted and sends that model back to `/tokenize` for the life of the
process, since a tokenizer that disagrees once would plan wrong chains again.

A conversation resends its whole history every turn. Its last prompt's encoding is kept (the
most recent conversations', up to `KEEP_TOKENS` tokens in all), and the next prompt is
tokenized only from the last special token the two texts share (`LocalTokenizer.encode_after`,
the same ids as a full tokenization): a new turn costs its new messages, not the history.
Without a conversation id, the last prompt kept is the last one that opened with the same two
messages (`history_key`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash
from boomerang_server.chatrender import Unsupported
from boomerang_server.localtokens import Encoded, LocalTokenizer, TokenizerFilesError, load

from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ClientRequest, Kind

log = logging.getLogger(__name__)
# Longer prompts are tokenized on a worker thread (the Rust tokenizer releases the GIL), so
# one long conversation does not hold up the event loop; shorter ones cost less than the hop.
THREAD_ABOVE_CHARS = 32_000
# Tokens of the conversations' last prompts kept for incremental tokenization (4 bytes each,
# plus their text): the least recently used conversation goes first.
KEEP_TOKENS = 4_000_000


class InProcessTokenizers:
    """The configured models' tokenizers, loaded on first use."""

    def __init__(self, locations: dict[str, str], hf_cache: str, metrics: GatewayMetrics):
        self.locations = locations
        self.hf_cache = Path(hf_cache).expanduser() if hf_cache else None
        self.metrics = metrics
        self._loaded: dict[str, LocalTokenizer] = {}
        self._loading: dict[str, asyncio.Task[LocalTokenizer | None]] = {}
        self.disabled: set[str] = set()
        self._last: OrderedDict[tuple[str, str], Encoded] = OrderedDict()  # (model, conversation) → last prompt
        self._kept_tokens = 0

    def serves(self, model: str) -> bool:
        """Whether turns of `model` are tokenized here (configured, loadable, never contradicted)."""
        return model in self.locations and model not in self.disabled

    async def load_all(self) -> None:
        """Load every configured tokenizer now (startup), so no turn waits for a file read."""
        await asyncio.gather(*(self._tokenizer(m) for m in self.locations))

    async def _tokenizer(self, model: str) -> LocalTokenizer | None:
        if (tok := self._loaded.get(model)) is not None:
            return tok
        task = self._loading.get(model)
        if task is None:
            task = self._loading[model] = asyncio.ensure_future(asyncio.to_thread(self._load, model))
        return await task

    def _load(self, model: str) -> LocalTokenizer | None:
        try:
            tok = load(self.locations[model], self.hf_cache)
        except TokenizerFilesError as exc:
            log.error("model %s: in-process tokenization is off, /tokenize is used instead: %s", model, exc)
            self.disabled.add(model)
            self.metrics.local_tokenize.labels("load_failed").inc()
            return None
        log.info("model %s: tokenizing in-process with %s", model, tok.folder)
        self._loaded[model] = tok
        return tok

    async def ids(self, req: ClientRequest) -> list[int] | None:
        """The prompt's ids, or None: the request goes to `/tokenize` instead."""
        tok = await self._tokenizer(req.model)
        if tok is None or req.model in self.disabled:
            return None
        if req.kind is Kind.CHAT:
            size = sum(len(str(m.get("content") or "")) for m in req.body["messages"])
        else:
            size = len(str(req.body["prompt"]))
        key = history_key(req)
        previous = self._last.get(key) if key is not None else None
        try:
            if key is not None:
                # With the history kept, only the new messages are tokenized: no thread needed.
                run = asyncio.to_thread if size > THREAD_ABOVE_CHARS and previous is None else _inline
                encoded = await run(tok.chat_encoding, req.body, previous)
                assert encoded is not None
                self._keep(key, encoded)
                ids = list(encoded.ids)
            else:
                ids = await asyncio.to_thread(_ids, tok, req) if size > THREAD_ABOVE_CHARS else _ids(tok, req)
        except Unsupported as exc:
            log.debug("model %s: not tokenized in-process (%s)", req.model, exc)
            self.metrics.local_tokenize.labels("unsupported").inc()
            return None
        except Exception as exc:  # noqa: BLE001 - a template bug must not fail the turn: /tokenize still answers
            log.warning("model %s: in-process tokenization failed, using /tokenize: %r", req.model, exc)
            self.metrics.local_tokenize.labels("failed").inc()
            return None
        self.metrics.local_tokenize.labels("local").inc()
        return ids or None

    def remember(self, req: ClientRequest, ids: list[int]) -> None:
        """Keep the prompt of a turn not tokenized here (its ids the engine's), so the
        conversation's next prompt is tokenized incrementally all the same."""
        tok, key = self._loaded.get(req.model), history_key(req)
        if tok is None or key is None or req.model in self.disabled:
            return
        try:
            encoded = tok.chat_encoding_of(req.body, ids)
        except Exception:  # noqa: BLE001 - a template this renderer does not mirror: nothing kept
            return
        if encoded is not None:
            self._keep(key, encoded)

    def _keep(self, key: tuple[str, str], encoded: Encoded) -> None:
        old = self._last.pop(key, None)
        if old is not None:
            self._kept_tokens -= len(old.ids)
        self._last[key] = encoded
        self._kept_tokens += len(encoded.ids)
        while self._kept_tokens > KEEP_TOKENS and self._last:
            _, dropped = self._last.popitem(last=False)
            self._kept_tokens -= len(dropped.ids)

    def verify(self, model: str, local: list[int], engine: list[int] | None) -> None:
        """Compare a turn's ids with the decode engine's; one mismatch sends `model` back to `/tokenize`."""
        if not engine or engine == local or model in self.disabled:
            return
        self.disabled.add(model)
        self.metrics.local_tokenize_mismatches.labels(model).inc()
        first = next((i for i, (a, b) in enumerate(zip(local, engine, strict=False)) if a != b), min(len(local), len(engine)))
        log.error("model %s: the in-process tokenizer disagrees with the engine at token %d of %d (engine: %d); "
                  "the model's turns go to /tokenize from now on — check BOOMERANG_TOKENIZERS names the files "
                  "the engine serves", model, first, len(local), len(engine))


def history_key(req: ClientRequest) -> tuple[str, str] | None:
    """Whose last prompt a chat's prompt most likely continues: its conversation's, or without
    an id, the last one that opened with the same two messages (a system prompt and the first
    user message, say). Any prompt is a correct start (`encode_after` re-uses only what the
    two texts share): the key decides only how much is tokenized again. None: tokenized whole."""
    if req.kind is not Kind.CHAT or req.body.get("add_special_tokens", False):
        return None
    if req.conversation_id:
        return req.model, "id\x00" + req.conversation_id
    opening = json.dumps(req.body["messages"][:2], sort_keys=True, separators=(",", ":"), default=str)
    return req.model, "opening\x00" + xxhash.xxh3_128_hexdigest(opening.encode())


async def _inline(fn: Callable[[dict[str, Any], Encoded | None], Encoded | None], body: dict[str, Any],
                  previous: Encoded | None) -> Encoded | None:
    return fn(body, previous)


def _ids(tok: LocalTokenizer, req: ClientRequest) -> list[int]:
    """The prompt ids of a chat request, or of a completions text prompt."""
    if req.kind is Kind.CHAT:
        return tok.chat_ids(req.body)
    prompt = req.body["prompt"]
    prompt = prompt[0] if isinstance(prompt, list) else prompt
    return tok.completion_ids(prompt, bool(req.body.get("add_special_tokens", True)))
