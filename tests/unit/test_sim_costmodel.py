"""The cost model: re-derive the fit from AWS's table and bound its error at every point."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from boomerang_tools.sim.costmodel import NEW_TOKENS_PER_TURN, PROFILES, Profile, published_errors

# Largest |relative error| allowed per profile (documented in costmodel.py).
BOUNDS = {"qwen3-32b": 0.11, "glm-5-fp8": 0.01}


def refit(p: Profile) -> np.ndarray:
    """Non-negative weighted least squares over (α, δ, β, γ, τ0, τ1), as documented."""
    rows, values = [], []
    pub, m = p.published, NEW_TOKENS_PER_TURN
    for n, off, on, xfer in zip(pub.contexts, pub.ttft_off_ms, pub.ttft_on_ms, pub.transfer_ms):
        r = n - m
        rows += [[1, n, n, n * n, 0, 0], [1, n, m, n * n - r * r, 1, r], [0, 0, 0, 0, 1, r]]
        values += [off, on, xfer]
    a, b = np.array(rows, float), np.array(values, float)
    w = 1 / b
    best: tuple[float, np.ndarray] | None = None
    for mask in itertools.product([0, 1], repeat=6):
        cols = [i for i in range(6) if mask[i]]
        if not cols:
            continue
        sol, *_ = np.linalg.lstsq(a[:, cols] * w[:, None], b * w, rcond=None)
        if (sol < -1e-12).any():
            continue
        full = np.zeros(6)
        full[cols] = sol
        sse = float((((a @ full) - b) * w) @ (((a @ full) - b) * w))
        if best is None or sse < best[0] - 1e-12:
            best = (sse, full)
    assert best is not None
    return best[1]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_coefficients_are_the_documented_fit(name: str) -> None:
    p = PROFILES[name]
    alpha, delta, beta, gamma, tau0, tau1 = refit(p)
    assert gamma == 0.0  # the quadratic term does not survive the non-negative fit
    for fitted, shipped in [(alpha, p.alpha_ms), (delta, p.delta_ms), (beta, p.beta_ms), (tau0, p.tau0_ms), (tau1, p.tau1_ms)]:
        assert shipped == pytest.approx(fitted, rel=2e-3)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_error_against_every_published_point_is_bounded(name: str) -> None:
    p = PROFILES[name]
    errors = {point: (model - published) / published for point, published, model in published_errors(p)}
    assert len(errors) == 6
    assert max(abs(e) for e in errors.values()) <= BOUNDS[name], errors


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_speedup_grows_with_context_to_the_published_one(name: str) -> None:
    p = PROFILES[name]
    speedups = [p.ttft_ms(n) / p.ttft_ms(n, n - NEW_TOKENS_PER_TURN) for n in range(2000, p.published.contexts[1] + 1, 2000)]
    assert speedups == sorted(speedups) and speedups[0] > 1.0
    assert speedups[-1] == pytest.approx(p.published.speedup, rel=0.15)


def test_split_between_prefill_and_decode_adds_up() -> None:
    p = PROFILES["qwen3-32b"]
    assert p.prefill_ms(8000, 6000) + p.decode_first_ms(8000) == pytest.approx(p.ttft_ms(8000, 6000))
    assert p.pull_ms(0) == 0.0 and p.prefill_ms(100) < p.prefill_ms(200)
