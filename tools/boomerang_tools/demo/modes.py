"""The deployments `boomerang demo` measures, each against the same Boomerang-off baseline.

A mode is one way of deploying Boomerang in front of the same simulated engines; each runs
in a stack of its own. To measure another deployment, add a `Mode` to `MODES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    """One deployment: how the stack runs, and how the report names it."""

    name: str  # the report's "mode"
    label: str  # the table's and chart's
    summary: str  # one sentence for the terminal
    hook: bool = False  # the simulated engines run the vLLM hook, the gateway only routes
    sim_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()


GATEWAY = Mode(
    "gateway", "gateway",
    "engines unchanged; the gateway tokenizes on the prefill engine, plans with the router and reports each turn",
)
HOOK = Mode(
    "hook", "engine hook",
    "the engines run Boomerang's vLLM hook (prefill plans from its own token ids, decode registers its own "
    "blocks); the gateway only routes: no /tokenize, no PlanTurn",
    hook=True,
    # The hook's planning budget, as roomy as the gateway's plan timeout here (CLI.CLAIM_DEADLINE_MS).
    sim_args=("--plan-deadline-ms", "1000"),
)
MODES: list[Mode] = [GATEWAY, HOOK]


def parse_modes(spec: str) -> list[Mode]:
    """`gateway,hook` as modes, in the order given; ValueError names the unknown ones."""
    known = {m.name: m for m in MODES}
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown {unknown}; known: {', '.join(known)}")
    return [known[n] for n in dict.fromkeys(names)]
