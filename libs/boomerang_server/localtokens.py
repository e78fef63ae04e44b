"""A model's own tokenizer and chat template, loaded from local files: prompts tokenized in-process.

The files are the ones vLLM loads: `tokenizer.json` (the `tokenizers` library's format),
`tokenizer_config.json` (its `chat_template` and named special tokens), and, where present,
`chat_template.jinja` and `additional_chat_templates/*.jinja` (transformers' newer layout,
which takes precedence). They come from a folder, or from a Hugging Face hub cache
(`models--ORG--NAME/snapshots/REV/`, the revision `refs/main` names); nothing is fetched.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from boomerang_server import chatrender
from boomerang_server.chatrender import Unsupported

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

    def template(self, tools: Any) -> str:
        """transformers' `get_chat_template`: `tool_use` when tools are given and it exists."""
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        raise Unsupported(f"{self.folder} has no chat template")

    def chat_ids(self, body: dict[str, Any]) -> list[int]:
        """The prompt ids vLLM computes for a chat request body."""
        text = chatrender.render(self.template(body.get("tools")), body, self.special_tokens)
        return self.encode(text, bool(body.get("add_special_tokens", False)))

    def completion_ids(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """The prompt ids vLLM computes for a completions text prompt."""
        return self.encode(prompt, add_special_tokens)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of `text` (special tokens in it are matched, as transformers does)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def chat_encoding(self, body: dict[str, Any], previous: Encoded | None) -> Encoded | None:
        """A chat request's prompt, tokenized from where it leaves `previous` (the conversation's
        last prompt): the same ids as `chat_ids`. None when the request adds special tokens
        around the text (its ids come from `chat_ids`)."""
        if body.get("add_special_tokens", False):
            return None
        return self.encode_after(chatrender.render(self.template(body.get("tools")), body, self.special_tokens), previous)

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
        text = chatrender.render(self.template(body.get("tools")), body, self.special_tokens)
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
