"""The prediction's inputs, learned from the engines: each engine's prefill cost, each pair's
copy cost and each decode engine's inter-token latency, from the times turns report.

Free of gRPC and SQL. Every model starts from the configured defaults (the prior) and moves
with each reported turn by recursive least squares with forgetting: with a forgetting factor
of `1 − 1/turns`, an observation `turns` reports old weighs 1/e of a new one, so a link that
slows moves the copy model within a few dozen turns. The covariance is capped at the prior's
(its trace, scaled alike in every direction), so a direction the turns do not excite (all
turns the same length, say) drifts no further from the prior than it started. A change the
forgetting would follow only slowly (a link that drops from 55 to 3 GB/s) shows as
predictions off by more than half, in the same direction, twice in a row: the covariance
then goes back to the prior's, and the next few turns move the model at once (one stray
measurement moves it by at most that half).

What a report teaches (`observe`):

* a turn P computed without a pull: P's prefill, `prefill(L − cached, L)`;
* a pulled turn with the copy time measured (the vLLM hook): the copy `copy(k)` and P's
  prefill separately; without it (the gateway sees one prefill request), the copy is what
  the measured time leaves over P's predicted prefill, never below 0. P learns from full
  prefills only. Fitting it to every pull's sum let the copy's rate and P's attention trade
  places, and the recompute it predicts went wrong (in a simulated replay of the demo's
  conversations, Qwen3-8B under Qwen3-32B's prior: recomputing 21k tokens predicted at
  173 ms, where it takes 890). Letting the copy take a negative leftover went wrong the
  other way: under that prior the copy's fixed cost went to −100 ms and its rate swung to 40
  times the link's, and turns pulled 64 tokens of 8k. Teaching P from a pull whose time was
  below P's prediction alone drove its terms apart (a token cost 16 times the engine's, the
  context term negative) and, after one slow first request, planned recomputes at 2k and 4k;
* a turn prefilled on D: D's prefill (its time to first token), and every turn's decode
  stream its inter-token latency.

Models live in this router's memory: a restart (or another replica) starts again from the
defaults and relearns from the next few dozen reports. Nothing here runs on a plan's path
but `costs`, a few dictionary reads.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from boomerang_router.ttft import CopyCost, PrefillCost, TurnCosts

# A stretched inter-token gap counts against D's p99 only while it is in this window.
PAUSE_WINDOW_SECONDS = 60.0
# Measured times beyond this are not a prefill or a copy (a stalled engine, a clock jump).
MAX_OBSERVED_MS = 600_000.0
# A prediction off by more than this share of itself, twice in a row the same way, is a change.
SURPRISE = 0.5


class Rls:
    """Recursive least squares with forgetting for `y ≈ θ·x`, from a prior θ."""

    def __init__(self, prior: Sequence[float], spread: Sequence[float], forgetting: float):
        self.theta = list(prior)
        n = len(prior)
        # The prior covariance: each parameter may plausibly be off by `spread` of itself.
        self.p = [[(spread[i] ** 2 if i == j else 0.0) for j in range(n)] for i in range(n)]
        self.prior_p = [row[:] for row in self.p]
        self.cap = sum(self.p[i][i] for i in range(n))
        self.forgetting = forgetting
        self.observations = 0
        self.surprises = 0  # signed: consecutive surprises of one direction

    def costs(self) -> list[float]:
        """θ as the plans use it: every parameter is a time, none below 0. The fit itself
        stays unconstrained (a clamp inside it slows how fast it converges: in a test, 40 full
        prefills left it 20% off in place of 4%); a term that overshoots below 0 no longer
        makes a recompute look cheap (a negative attention term once predicted 12k tokens
        at 36 ms, where they take 450)."""
        return [max(t, 0.0) for t in self.theta]

    def predict(self, x: Sequence[float]) -> float:
        """θ·x."""
        return sum(t * v for t, v in zip(self.theta, x))

    def update(self, x: Sequence[float], y: float) -> None:
        """Move θ towards explaining `y` at `x`."""
        predicted = self.predict(x)
        err = y - predicted
        side = 1 if err > 0 else -1
        limit = SURPRISE * max(abs(predicted), 1.0)
        if abs(err) > limit:
            self.surprises = self.surprises + side if self.surprises * side > 0 else side
            if abs(self.surprises) >= 2:
                self.p = [row[:] for row in self.prior_p]  # a change: learn it anew
            else:
                err = side * limit  # maybe a stray measurement: move by no more than the limit
        else:
            self.surprises = 0
        n, lam, p = len(x), self.forgetting, self.p
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denom = lam + sum(x[i] * px[i] for i in range(n))
        if not math.isfinite(denom) or denom <= 0:
            return
        gain = [v / denom for v in px]
        self.theta = [t + g * err for t, g in zip(self.theta, gain)]
        p = [[(p[i][j] - gain[i] * px[j]) / lam for j in range(n)] for i in range(n)]
        # Capped at the prior's trace, scaled alike in every direction (a per-parameter cap
        # would turn the next update's direction, and walk the parameters a turn's length
        # cannot tell apart, the token and attention terms, far from the prior: in a test, to
        # a negative token cost).
        trace = sum(p[i][i] for i in range(n))
        scale = min(1.0, self.cap / trace) if trace > 0 else 1.0
        self.p = [[v * scale for v in row] for row in p]
        self.observations += 1


def prefill_features(computed: int, context: int, prior: PrefillCost) -> list[float]:
    """The prefill model's inputs (see `ttft.PrefillCost`): the floor's term or the tokens',
    and the two attention terms. Which of the first two a prefill teaches is the prior's
    choice (its kink, `floor/token` tokens: about 400 for the defaults), not the learned
    model's: a model that picks its own features runs away when it starts far off (one
    overshoot below zero and every later turn teaches the wrong term). Predictions use the
    learned kink (`PrefillCost.ms`)."""
    held = context - computed
    at_floor = prior.floor_ms >= prior.token_ms * computed
    return [1.0 if at_floor else 0.0, 0.0 if at_floor else float(computed),
            computed * computed / 2000, computed * held / 1000]


@dataclass(frozen=True)
class Priors:
    """The configured defaults every model starts from."""

    prefill: PrefillCost
    copy: CopyCost
    inter_token_ms: float
    turns: float  # forgetting: an observation this many reports old weighs 1/e; 0: no learning
    pause_bound: float  # a prefill on D may raise D's p99 inter-token latency by this share


@dataclass(frozen=True)
class Observation:
    """One reported turn, as the models read it (times in milliseconds; None: not measured)."""

    prefill_engine: str
    decode_engine: str
    source_engine: str  # the engine pulled from ("" when nothing was)
    on_decode: bool  # prefilled on `decode_engine`
    prompt: int
    computed: int  # prompt tokens the prefilling engine computed
    pulled: int  # tokens copied from `source_engine`
    prefill_ms: float | None
    copy_ms: float | None
    inter_token_ms: float | None
    handoff_tokens: int = 0  # tokens D loaded from P after a prefill on P
    first_token_ms: float | None = None  # D's time to first token after that hand-off


class CostModels:
    """Per engine and per pair, what the prediction uses; updated from reports."""

    def __init__(self, priors: Priors, clock: Callable[[], float] = time.monotonic):
        self.priors = priors
        self.forgetting = 1.0 - 1.0 / max(priors.turns, 1.0)
        self.clock = clock
        self.prefill: dict[str, Rls] = {}
        self.copy: dict[tuple[str, str], Rls] = {}  # (from, to)
        self.inter_token: dict[str, tuple[float, int]] = {}  # engine → (ms, observations)
        self.first_step: dict[str, tuple[float, int]] = {}  # engine → (ms, observations)
        self._pauses: dict[str, deque[float]] = {}  # decode engine → times of stretching pauses
        # What `costs` reads: immutable snapshots, rebuilt on update (a plan reads, never fits).
        self._prefill_now: dict[str, PrefillCost] = {}
        self._copy_now: dict[tuple[str, str], CopyCost] = {}

    # -- the plan's side: reads only ---------------------------------------------------------

    def prefill_cost(self, engine: str) -> PrefillCost:
        """An engine's current prefill model."""
        return self._prefill_now.get(engine, self.priors.prefill)

    def copy_cost(self, source: str, target: str) -> CopyCost:
        """A pair's current copy model (from `source` to `target`)."""
        return self._copy_now.get((source, target), self.priors.copy)

    def inter_token_ms(self, engine: str) -> float:
        """A decode engine's learned inter-token latency."""
        found = self.inter_token.get(engine)
        return found[0] if found is not None else self.priors.inter_token_ms

    def first_step_ms(self, decode: str) -> float:
        """A decode engine's time to first token after a hand-off, less the load: learned, or
        one inter-token gap until turns report it."""
        found = self.first_step.get(decode)
        return found[0] if found is not None else self.inter_token_ms(decode)

    def max_pause_ms(self, decode: str) -> float:
        """How long a prefill on `decode` may pause its decodes now.

        A pause stretches one inter-token gap of each running decode. One within the bound
        (`pause_bound` of an inter-token latency) cannot raise the p99; a longer one only
        while such stretched gaps stay under 1% of the gaps of the last PAUSE_WINDOW_SECONDS.
        """
        if self.priors.pause_bound <= 0:
            return 0.0
        itl = self.inter_token_ms(decode)
        pauses = self._recent_pauses(decode)
        gaps = PAUSE_WINDOW_SECONDS * 1000 / max(itl, 1e-3)
        if len(pauses) + 1 < 0.01 * gaps:
            return math.inf
        return self.priors.pause_bound * itl

    def costs(self, prefill: str, source: str, decode: str | None) -> TurnCosts:
        """The prediction's inputs for a turn on `prefill` that may pull from `source`; `decode`
        is the engine that may prefill it instead (None: no prefill on D)."""
        if decode is None or self.priors.pause_bound <= 0:
            return TurnCosts(self.prefill_cost(prefill), self.copy_cost(source, prefill))
        return TurnCosts(
            self.prefill_cost(prefill), self.copy_cost(source, prefill), self.prefill_cost(decode),
            self.max_pause_ms(decode), self.first_step_ms(decode),
        )

    def paused(self, decode: str, pause_ms: float) -> None:
        """A plan prefills on `decode`: count its pause when it stretches a gap past the bound."""
        if pause_ms > self.priors.pause_bound * self.inter_token_ms(decode):
            self._recent_pauses(decode).append(self.clock())

    def _recent_pauses(self, decode: str) -> deque[float]:
        pauses = self._pauses.setdefault(decode, deque())
        cutoff = self.clock() - PAUSE_WINDOW_SECONDS
        while pauses and pauses[0] < cutoff:
            pauses.popleft()
        return pauses

    # -- the report's side -------------------------------------------------------------------

    def observe(self, o: Observation) -> None:
        """Learn from one reported turn."""
        if self.priors.turns <= 0:
            return
        if o.inter_token_ms is not None and 0 < o.inter_token_ms < MAX_OBSERVED_MS:
            self._observe_inter_token(o.decode_engine, o.inter_token_ms)
        if not o.on_decode and o.first_token_ms is not None and 0 < o.first_token_ms < MAX_OBSERVED_MS:
            load = self.copy_cost(o.decode_engine, o.prefill_engine).ms(o.handoff_tokens)
            self._observe_mean(self.first_step, o.decode_engine, max(o.first_token_ms - load, 0.0))
        if o.prefill_ms is None or not 0 < o.prefill_ms < MAX_OBSERVED_MS or o.computed <= 0:
            return
        engine = o.decode_engine if o.on_decode else o.prefill_engine
        prefill = self._prefill_model(engine)
        features = prefill_features(o.computed, o.prompt, self.priors.prefill)
        if o.pulled <= 0 or not o.source_engine:
            prefill.update(features, o.prefill_ms)
        else:
            pair = (o.source_engine, o.prefill_engine)
            copy = self._copy_model(pair)
            if o.copy_ms is not None and 0 <= o.copy_ms < MAX_OBSERVED_MS:
                copy.update([1.0, float(o.pulled)], o.copy_ms)
                prefill.update(features, max(o.prefill_ms - o.copy_ms, 0.0))
            else:
                # The gateway times the pull and the prefill as one request: the copy learns what
                # the time leaves over P's predicted prefill, and nothing below nothing.
                predicted = self.prefill_cost(engine).ms(o.computed, o.prompt)
                copy.update([1.0, float(o.pulled)], max(o.prefill_ms - predicted, 0.0))
            self._copy_now[pair] = CopyCost(*copy.theta)
        self._prefill_now[engine] = PrefillCost(*prefill.costs())

    def _prefill_model(self, engine: str) -> Rls:
        model = self.prefill.get(engine)
        if model is None:
            prior = self.priors.prefill
            theta = [prior.floor_ms, prior.token_ms, prior.attention_ms, prior.context_ms]
            model = self.prefill[engine] = Rls(theta, [abs(t) + 1e-6 for t in theta], self.forgetting)
        return model

    def _copy_model(self, pair: tuple[str, str]) -> Rls:
        model = self.copy.get(pair)
        if model is None:
            prior = self.priors.copy
            theta = [prior.fixed_ms, prior.token_ms]
            # A link may be far slower than its default (a TCP fallback): a wide prior rate.
            model = self.copy[pair] = Rls(theta, [abs(theta[0]) + 1.0, 10 * abs(theta[1]) + 1e-6], self.forgetting)
        return model

    def _observe_inter_token(self, engine: str, ms: float) -> None:
        self._observe_mean(self.inter_token, engine, ms)

    def _observe_mean(self, means: dict[str, tuple[float, int]], engine: str, ms: float) -> None:
        """An exponentially weighted mean, with the models' forgetting, from its first value."""
        current, count = means.get(engine, (ms, 0))
        weight = 1.0 - self.forgetting
        means[engine] = (current + weight * (ms - current) if count else ms, count + 1)
