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

The fitted forms (milliseconds), for n tokens computed at the end of a context of L (the
first h = L − n tokens held):

    prefill(n, L) = max(floor, token·n) + attention·n²/2/1000 + context·n·h/1000
    copy(k)       = fixed + token·k          (0 for k = 0)

`floor` is one forward pass: the weights are read however few tokens it computes, so a short
turn costs the floor (Qwen3-32B on an H200: about 50 ms for 128 tokens over any history);
a long prefill is bound by its tokens. The two attention terms are the computed tokens'
attention among themselves (quadratic in a full prefill) and over the held history (linear
in it for a short turn). Over the pull's length k (n = L − k, h = k) the predicted time is
piecewise quadratic, with a kink where `token·n = floor` and the curvature
`(attention − 2·context)/1000` on both sides: when it is not positive (as measured) each
piece's minimum is at its ends, so the best pull is the shortest allowed, all that P lacks,
or one next to the kink; when a learned model makes it positive, each regime's stationary
point rounded to blocks is a candidate too. So the minimum over every whole-block pull is
found from at most eight evaluations.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillCost:
    """Predicted prefill milliseconds of one engine (see the module docstring)."""

    floor_ms: float  # one forward pass, however few tokens it computes
    token_ms: float  # per computed token, above the floor
    attention_ms: float  # per computed token per 1,000 computed tokens (halved: causal)
    context_ms: float  # per computed token per 1,000 held tokens of context

    def ms(self, computed: int, context: int) -> float:
        """Milliseconds to compute the last `computed` tokens of a `context`-token prompt."""
        if computed <= 0:
            return 0.0
        held = context - computed
        t = (max(self.floor_ms, self.token_ms * computed) + self.attention_ms * computed * computed / 2000
             + self.context_ms * computed * held / 1000)
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


def pull_lengths(prompt: int, reusable: int, cached: int, block_size: int, threshold: int,
                 p: PrefillCost, copy_token_ms: float) -> list[int]:
    """The pull lengths worth predicting: the ends of the allowed range, the whole blocks next
    to the floor's kink and, where the time is convex in the length, each regime's
    stationary point rounded to blocks."""
    shortest = -(-(cached + max(threshold, 1)) // block_size) * block_size
    if reusable < shortest:
        return []
    if reusable == shortest:
        return [shortest]
    points = [prompt - p.floor_ms / p.token_ms] if p.token_ms > 0 else []
    curvature = (p.attention_ms - 2 * p.context_ms) / 1000
    if curvature > 0:
        # d/dk [copy_token·k + regime(L − k) + attention·(L − k)²/2000 + context·(L − k)·k/1000]
        # = curvature·k − offset − (token_ms in the token regime, 0 at the floor)
        offset = (p.attention_ms - p.context_ms) * prompt / 1000 - copy_token_ms
        points += [(offset + p.token_ms) / curvature, offset / curvature]
    lengths = [shortest]
    for x in points:
        if shortest < x < reusable:  # the whole blocks on either side (within the range)
            below = int(x // block_size) * block_size
            lengths += [below, min(below + block_size, reusable)]
    lengths.append(reusable)
    return lengths


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
    lengths = pull_lengths(prompt, reusable, cached, block_size, threshold, p, link.token_ms)
    for k in lengths:
        t = link.ms(k - cached) + p.ms(prompt - k, prompt) + handoff
        if t < best:
            option, best, pull = Option.PULL, t, k
    if costs.decode is not None and reusable > 0:
        t = costs.decode.ms(prompt - reusable, prompt)
        if t < best and t <= costs.max_pause_ms:
            return Choice(Option.PREFILL_ON_DECODE, 0, t, recompute, pause_ms=t)
    return Choice(option, pull, best, recompute, pulls_allowed=bool(lengths))
