"""The deployments `boomerang demo` measures, each against the same Boomerang-off baseline.

A mode is one way of deploying Boomerang in front of the same simulated engines, or the
alternative a skeptic would deploy instead (`PREFIX_CACHE`: no Boomerang, prefix caching on
the prefill engine and sticky routing); each runs in a stack of its own. To measure another
deployment, add a `Mode` to `MODES`. The baseline (`OFF`) runs first in a stack of its own
too, whichever modes are chosen: no deployment with Boomerang in it can measure "off" (with
the engines' hook, the prefill engine plans every prompt it is sent, whatever the gateway
was asked).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from boomerang_tools.stack.stack import SimSpec, StackConfig

# Every process shares one small machine here, so a claim can wait on the CPU; a longer claim
# deadline keeps a busy laptop from turning pulls into recomputes.
CLAIM_DEADLINE_MS = 1000


@dataclass(frozen=True)
class Mode:
    """One deployment: how the stack runs, and how the report names it."""

    name: str  # the report's "mode"
    label: str  # the table's and chart's
    summary: str  # one sentence for the terminal
    hook: bool = False  # the simulated engines run the vLLM hook, the gateway only routes
    sim_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()
    boomerang: bool = True  # False: no Boomerang in it (the baseline, or the alternative to Boomerang)
    baseline: bool = False  # True: `OFF`, every turn recomputed, what the others are held against
    quick_profiles: int | None = None  # --quick: measured on this many profiles only (None: all)
    # Numbers of conversations sharing one prefill engine it is measured at (each level's
    # conversations take their turns in rotation); 1: one conversation at a time.
    levels: tuple[int, ...] = (1,)
    quick_levels: tuple[int, ...] = (1,)
    # The client names its conversation (`X-Conversation-Id`); False: it sends no id, as most
    # clients and proxies do, and the router finds the turn its prompt continues.
    conversation_id: bool = True


OFF = Mode(
    "off", "off",
    "no Boomerang: unchanged engines behind the gateway with no router (prefix caching off on the prefill "
    "engine, as in AWS's tests), so the prefill engine recomputes every prompt",
    gateway_args=("--router", ""),
    boomerang=False,
    baseline=True,
)
GATEWAY = Mode(
    "gateway", "gateway",
    "engines unchanged; the gateway tokenizes in-process with the model's own files (the prefill engine's "
    "/tokenize its fallback), plans with the router and reports each turn",
)
GATEWAY_NO_ID = Mode(
    "gateway-no-id", "gateway, no id",
    "as gateway, but the client sends no conversation id: the router claims the retained turn whose prompt "
    "the new prompt continues",
    conversation_id=False,
)
HOOK = Mode(
    "hook", "engine hook",
    "the engines run Boomerang's vLLM hook (prefill plans from its own token ids, decode registers its own "
    "blocks); the gateway only routes: no /tokenize, no PlanTurn",
    hook=True,
    # The hook's planning budget, as roomy as the gateway's plan timeout here (CLAIM_DEADLINE_MS),
    # and a request waits for its plan up to all the prefill the pull could save (share 1): on one
    # small machine the control plane shares the CPU with the engines.
    sim_args=("--plan-deadline-ms", "1000", "--plan-wait-share", "1"),
)
# P's prefix cache: room for four conversations at AWS's longest context (4 × 24,000 tokens in
# blocks of 16), about 24 GiB of Qwen3-32B's KV (bf16, 256 KiB a token). Many more
# conversations than that evict each other; a few fit.
PREFIX_CACHE_BLOCKS = 6000
PREFIX_CACHE = Mode(
    "prefix-cache", "prefix cache",
    "no Boomerang: prefix caching on the prefill engine (room for "
    f"{PREFIX_CACHE_BLOCKS * 16:,} tokens, LRU) and sticky routing (the gateway with no router picks the prefill "
    "engine by a hash of the conversation id); the decode engine's KV is never reused",
    sim_args=("--prefix-cache-blocks", str(PREFIX_CACHE_BLOCKS)),
    gateway_args=("--router", "", "--sticky-prefill"),
    boomerang=False,
    levels=(1, 8, 32),
    quick_levels=(1, 8),
    quick_profiles=1,
)
MODES: list[Mode] = [GATEWAY, GATEWAY_NO_ID, HOOK, PREFIX_CACHE]


def parse_modes(spec: str) -> list[Mode]:
    """`gateway,hook` as modes, in the order given; ValueError names the unknown ones."""
    known = {m.name: m for m in MODES}
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown {unknown}; known: {', '.join(known)}")
    return [known[n] for n in dict.fromkeys(names)]


def stack_config(mode: Mode, sims: list[SimSpec], data_dir: Path, database_url: str) -> StackConfig:
    """The stack `mode` runs in, on these engines (the grid's: the gateway's)."""
    return StackConfig(
        data_dir=data_dir,
        database_url=database_url,
        gateway_port=0,
        grpc_ports=(0, 0, 0),
        sims=sims,
        log_level="WARNING",
        hook=mode.hook,
        # The prefill engine's cached tokens reach the client's usage, as vLLM reports them.
        sim_args=["--enable-prompt-tokens-details", *mode.sim_args],
        router_args=["--claim-deadline-ms", str(CLAIM_DEADLINE_MS)],
        gateway_args=["--plan-timeout-seconds", str(CLAIM_DEADLINE_MS / 1000 + 0.25), *mode.gateway_args],
        # Boomerang as one process (`boomerang control-plane --gateway-listen`): no network hop
        # of Boomerang's on a gateway's turn, one on a hook's.
        single_process=mode.boomerang,
        # Without Boomerang: the engines and a gateway with no router, as an operator runs
        # them who answers "why not prefix caching on P with sticky routing?".
        control_plane=mode.boomerang,
    )
