"""The plan by predicted time to first token: recompute, pull (all or part), or prefill on D.

Free of gRPC and SQL. For a turn whose claim verified a reusable prefix, the router predicts
the prefill side of the time to first token of each way to serve it and picks the fastest:

* **recompute** on P: P computes what its own prefix cache does not hold,
  `prefill_P(L − c, L)`;
* **pull k tokens** from D (k whole blocks, `c < k ≤ R`): the NixlConnector loads only the
  `k − c` tokens P's cache lacks, then P computes the rest,
  `copy(k − c) + prefill_P(L − k, L)`. A pull of fewer than P's `kv_recompute_threshold`
  tokens is no option (P would recompute them anyway);
* **prefill on D**, which holds the history in its own prefix cache: D computes the new
  tokens, `prefill_D(L − R, L)`, and no KV moves; its prefill ends in the first token. The P
  options pay the hand-off P→D of the same new tokens instead, `copy(L − R)`, and then D's
  first step, `step_D` (learned from D's time to first token after a hand-off). A prefill
  on D pauses D's running decodes for as long as it takes, so it is an option only while
  that pause stays within the caller's bound.

with L the prompt, R the verified reusable prefix (whole blocks, below L), c what P's prefix
cache holds (whole blocks; 0 when the caller cannot tell).

The fitted forms (milliseconds), for n tokens computed at the end of a context of L:

    prefill(n, L) = fixed + token·n + context·n·(L − n/2)/1000
    copy(k)       = fixed + token·k          (0 for k = 0)

`L − n/2` is the mean context each computed token attends to, so a full prefill's attention
is quadratic and a short suffix over a long history is linear in the history. Over the
pull's length the predicted time is quadratic (`d²/dk² = −context/1000`): concave for a
positive attention term, so the best pull is one of the ends (all P lacks, or the shortest
allowed); a learned negative term makes it convex, and its stationary point, rounded to
blocks, is a candidate too. So the minimum over every whole-block pull is found from at
most four evaluations.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillCost:
    """Predicted prefill milliseconds of one engine (see the module docstring)."""

    fixed_ms: float
    token_ms: float
    context_ms: float  # per computed token per 1,000 tokens of mean attended context

    def ms(self, computed: int, context: int) -> float:
        """Milliseconds to compute the last `computed` tokens of a `context`-token prompt."""
        if computed <= 0:
            return 0.0
        mean_context = context - computed / 2
        t = self.fixed_ms + self.token_ms * computed + self.context_ms * computed * mean_context / 1000
        return max(t, 0.0)


@dataclass(frozen=True)
class CopyCost:
    """Predicted milliseconds of moving KV between two engines: a fixed cost per pull plus a rate."""

    fixed_ms: float
    token_ms: float

    def ms(self, tokens: int) -> float:
        """Milliseconds to move `tokens` tokens' KV (nothing moves for none)."""
        if tokens <= 0:
            return 0.0
        return max(self.fixed_ms + self.token_ms * tokens, 0.0)


class Option(str, enum.Enum):
    """How a turn with a verified reusable prefix is served."""

    RECOMPUTE = "RECOMPUTE"
    PULL = "PULL"
    PREFILL_ON_DECODE = "PREFILL_ON_DECODE"


@dataclass(frozen=True)
class TurnCosts:
    """What the prediction knows of the turn's engines.

    `decode` is D's prefill cost, or None when the turn cannot be prefilled on D (the caller
    cannot send it there, or D is not available); `max_pause_ms` bounds how long a prefill
    on D may pause D's decodes (math.inf: no bound); `first_step_ms` is D's time to its first
    token after a prefill on P, less the load of the hand-off.
    """

    prefill: PrefillCost
    link: CopyCost  # between the lease's decode engine and the prefill engine
    decode: PrefillCost | None = None
    max_pause_ms: float = math.inf
    first_step_ms: float = 0.0  # D's first step after a hand-off (with `decode`)


@dataclass(frozen=True)
class Choice:
    """The fastest option, its predicted milliseconds, and recompute's for comparison."""

    option: Option
    pull_tokens: int  # remote_num_tokens for PULL, else 0
    predicted_ms: float
    recompute_ms: float
    pause_ms: float = 0.0  # how long a prefill on D pauses D's decodes
    pulls_allowed: bool = True  # False: no pull reaches the threshold past P's own cache


def pull_lengths(reusable: int, cached: int, block_size: int, threshold: int, context_ms: float,
                 copy_token_ms: float, token_ms: float) -> list[int]:
    """The pull lengths worth predicting: the ends of the allowed range and, when the
    predicted time is convex in the length, its stationary point rounded to blocks."""
    shortest = -(-(cached + max(threshold, 1)) // block_size) * block_size
    if reusable < shortest:
        return []
    if reusable == shortest:
        return [shortest]
    if context_ms >= 0:
        return [shortest, reusable]
    # Convex: d/dk [copy + prefill] = copy_token − token − context·k/1000 = 0
    k = (copy_token_ms - token_ms) * 1000 / context_ms
    inner = {int(k // block_size) * block_size, int(-(-k // block_size)) * block_size} if shortest < k < reusable else set()
    return sorted({shortest, reusable} | {x for x in inner if shortest <= x <= reusable})


def choose(prompt: int, reusable: int, cached: int, block_size: int, threshold: int, costs: TurnCosts) -> Choice:
    """The option with the smallest predicted time to first token (recompute on a tie).

    `reusable` is the verified prefix P may pull and D holds (whole blocks, below `prompt`);
    `cached` what P's own prefix cache holds of the prompt. On every plan's path: a handful
    of float operations, one Choice built.
    """
    cached = min(max(cached, 0) // block_size * block_size, max(prompt - 1, 0))
    p, link = costs.prefill, costs.link
    handoff = link.ms(prompt - reusable) + costs.first_step_ms if costs.decode is not None else 0.0
    recompute = p.ms(prompt - cached, prompt) + handoff
    option, best, pull = Option.RECOMPUTE, recompute, 0
    lengths = pull_lengths(reusable, cached, block_size, threshold, p.context_ms, link.token_ms, p.token_ms)
    for k in lengths:
        t = link.ms(k - cached) + p.ms(prompt - k, prompt) + handoff
        if t < best:
            option, best, pull = Option.PULL, t, k
    if costs.decode is not None and reusable > 0:
        t = costs.decode.ms(prompt - reusable, prompt)
        if t < best and t <= costs.max_pause_ms:
            return Choice(Option.PREFILL_ON_DECODE, 0, t, recompute, pause_ms=t)
    return Choice(option, pull, best, recompute, pulls_allowed=bool(lengths))
