"""In-process tokenization: the model's own tokenizer and chat template, instead of P's `/tokenize`.

Models named in `BOOMERANG_TOKENIZERS` are tokenized here (rendered as vLLM does, `chatrender`);
every other model, and every request the renderer does not mirror exactly, still goes to the
prefill engine's `/tokenize`, which stays the truth. Each turn tokenized here is checked
against the prompt ids the decode engine reports for it; one disagreement is counted and sends
that model back to `/tokenize` for the life of the process, since a tokenizer that disagrees
once would plan wrong chains again.

The files are the ones vLLM loads: `tokenizer.json` (the `tokenizers` library's format),
`tokenizer_config.json` (its `chat_template` and named special tokens), and, where present,
`chat_template.jinja` and `additional_chat_templates/*.jinja` (transformers' newer layout,
which takes precedence). They come from a folder, or from a Hugging Face hub cache
(`models--ORG--NAME/snapshots/REV/`, the revision `refs/main` names); nothing is fetched.

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
import os
import re
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import xxhash
from tokenizers import Tokenizer

from boomerang_gateway import chatrender
from boomerang_gateway.chatrender import Unsupported
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import ClientRequest, Kind

log = logging.getLogger(__name__)
# Longer prompts are tokenized on a worker thread (the Rust tokenizer releases the GIL), so
# one long conversation does not hold up the event loop; shorter ones cost less than the hop.
THREAD_ABOVE_CHARS = 32_000
# Tokens of the conversations' last prompts kept for incremental tokenization (4 bytes each,
# plus their text): the least recently used conversation goes first.
KEEP_TOKENS = 4_000_000


# transformers' `SPECIAL_TOKENS_ATTRIBUTES`: the named special tokens a template sees.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class Encoded:
    """A text's token ids and the places they may be cut: the (character offset, token index)
    of each plain added token (a special token such as `<|im_start|>`). The tokenizer splits a
    text on its added tokens before anything else and tokenizes each piece alone, so the ids
    before such a cut do not depend on anything after it."""

    text: str
    ids: array[int]
    cuts: tuple[tuple[int, int], ...]


class TokenizerFilesError(Exception):
    """The tokenizer files cannot be found or read; the message says where and why."""


def default_hf_cache() -> Path:
    """The hub cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def resolve(location: str, hf_cache: Path | None = None) -> Path:
    """The folder holding `tokenizer.json`: `location` itself, or a repo id in the hub cache."""
    path = Path(location).expanduser()
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise TokenizerFilesError(f"{path} has no tokenizer.json")
        return path
    if location.count("/") != 1 or location.startswith(("/", ".", "~")):
        raise TokenizerFilesError(f"{location!r} is neither a folder nor a Hugging Face repo id (ORG/NAME)")
    cache = hf_cache or default_hf_cache()
    repo = cache / ("models--" + location.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        raise TokenizerFilesError(f"{location} is not in the Hugging Face cache {cache} (no {snapshots}); "
                                  f"download it there first, e.g. `hf download {location}`")
    ref = repo / "refs" / "main"
    candidates = [snapshots / ref.read_text().strip()] if ref.is_file() else sorted(
        snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in candidates:
        if (folder / "tokenizer.json").is_file():
            return folder
    raise TokenizerFilesError(f"no snapshot of {location} in {snapshots} has a tokenizer.json")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _templates(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    """The chat templates by name ("default" for the only or default one)."""
    found: dict[str, str] = {}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        found["default"] = raw
    elif isinstance(raw, list):
        found.update({t["name"]: t["template"] for t in raw if isinstance(t, dict) and "name" in t})
    jinja = folder / "chat_template.jinja"
    extra = folder / "additional_chat_templates"
    if jinja.is_file() or extra.is_dir():
        found = {}  # transformers reads the files instead of the config's templates
        if jinja.is_file():
            found["default"] = jinja.read_text(encoding="utf-8")
        if extra.is_dir():
            found.update({p.stem: p.read_text(encoding="utf-8") for p in sorted(extra.glob("*.jinja"))})
    return found


@dataclass
class LocalTokenizer:
    """One model's tokenizer and chat templates."""

    folder: Path
    tokenizer: Tokenizer
    templates: dict[str, str]
    special_tokens: dict[str, str] = field(default_factory=dict)

    def render(self, body: dict[str, Any]) -> str:
        """The prompt text vLLM renders for a chat request body, with the template transformers'
        `get_chat_template` picks: `tool_use` when tools are given and it exists."""
        if body.get("tools") is not None and "tool_use" in self.templates:
            source = self.templates["tool_use"]
        elif "default" in self.templates:
            source = self.templates["default"]
        else:
            raise Unsupported(f"{self.folder} has no chat template")
        return chatrender.render(source, body, self.special_tokens)

    def chat_ids(self, body: dict[str, Any]) -> list[int]:
        """The prompt ids vLLM computes for a chat request body."""
        text = self.render(body)
        return self.encode(text, bool(body.get("add_special_tokens", False)))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of `text` (special tokens in it are matched, as transformers does)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def chat_encoding(self, body: dict[str, Any], previous: Encoded | None) -> Encoded | None:
        """A chat request's prompt, tokenized from where it leaves `previous` (the conversation's
        last prompt): the same ids as `chat_ids`. None when the request adds special tokens
        around the text (its ids come from `chat_ids`)."""
        if body.get("add_special_tokens", False):
            return None
        return self.encode_after(self.render(body), previous)

    def encode_after(self, text: str, previous: Encoded | None) -> Encoded:
        """`text` tokenized without added special tokens, re-using `previous`'s ids up to the
        last cut the two texts share: only what follows it is tokenized again."""
        start, kept = 0, 0
        cuts: tuple[tuple[int, int], ...] = ()
        if previous is not None:
            # Cuts are in text order and a shared prefix up to one means up to every earlier
            # one: the last shared cut, by bisection.
            lo, hi = 0, len(previous.cuts)
            while lo < hi:
                mid = (lo + hi) // 2
                char = previous.cuts[mid][0]
                if text[:char] == previous.text[:char]:
                    lo = mid + 1
                else:
                    hi = mid
            if lo:
                start, kept = previous.cuts[lo - 1]
                cuts = previous.cuts[: lo - 1]
        encoding = self.tokenizer.encode(text[start:], add_special_tokens=False)
        ids = previous.ids[:kept] if previous is not None and kept else array("I")
        ids.extend(encoding.ids)
        plain = self.plain_added
        more = tuple((start + encoding.offsets[n][0], kept + n) for n, i in enumerate(encoding.ids) if i in plain)
        return Encoded(text, ids, cuts + more)

    def chat_encoding_of(self, body: dict[str, Any], ids: Sequence[int]) -> Encoded | None:
        """The `Encoded` of a chat request whose ids are known (the engine's own, for a turn
        not tokenized here), without tokenizing: its cuts are where the added tokens the ids
        hold stand in the rendered text. None when the two do not line up (or the request
        adds special tokens), and nothing is kept."""
        if body.get("add_special_tokens", False):
            return None
        text = self.render(body)
        added = self.added_ids
        found = [(n, i) for n, i in enumerate(ids) if i in added]
        matches = list(self.added_pattern.finditer(text)) if self.added_pattern is not None else []
        if len(found) != len(matches) or any(added[i] != m.group() for (_, i), m in zip(found, matches, strict=True)):
            return None
        plain = self.plain_added
        cuts = tuple((m.start(), n) for (n, i), m in zip(found, matches, strict=True) if i in plain)
        return Encoded(text, array("I", ids), cuts)

    @cached_property
    def added_ids(self) -> dict[int, str]:
        """Every added token's id and text."""
        return {i: t.content for i, t in self.tokenizer.get_added_tokens_decoder().items()}

    @cached_property
    def added_pattern(self) -> re.Pattern[str] | None:
        """Matches the added tokens in a text, longest first (as the tokenizer extracts them)."""
        contents = sorted(set(self.added_ids.values()), key=len, reverse=True)
        return re.compile("|".join(re.escape(c) for c in contents)) if contents else None

    @cached_property
    def plain_added(self) -> frozenset[int]:
        """Ids of the added tokens that cut a text cleanly: matched as they are, taking no
        whitespace or word boundary from their neighbours."""
        return frozenset(
            i for i, t in self.tokenizer.get_added_tokens_decoder().items()
            if not (t.lstrip or t.rstrip or t.single_word or t.normalized)
        )


def load(location: str, hf_cache: Path | None = None) -> LocalTokenizer:
    """Load a model's tokenizer files; TokenizerFilesError names what is missing or broken."""
    folder = resolve(location, hf_cache)
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exceptions
        raise TokenizerFilesError(f"{folder / 'tokenizer.json'} cannot be read: {exc}") from None
    config_path = folder / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise TokenizerFilesError(f"{config_path} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise TokenizerFilesError(f"{config_path} is not a JSON object")
    special = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name))) is not None}
    return LocalTokenizer(folder, tokenizer, _templates(folder, config), special)


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
                if size > THREAD_ABOVE_CHARS and previous is None:
                    encoded = await asyncio.to_thread(tok.chat_encoding, req.body, previous)
                else:
                    encoded = tok.chat_encoding(req.body, previous)
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


def _ids(tok: LocalTokenizer, req: ClientRequest) -> list[int]:
    """The prompt ids of a chat request, or of a completions text prompt."""
    if req.kind is Kind.CHAT:
        return tok.chat_ids(req.body)
    prompt = req.body["prompt"]
    prompt = prompt[0] if isinstance(prompt, list) else prompt
    return tok.encode(prompt, bool(req.body.get("add_special_tokens", True)))
