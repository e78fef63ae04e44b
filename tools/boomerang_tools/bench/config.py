"""What a benchmark run does: the full run and `--quick`."""

from __future__ import annotations

from dataclasses import dataclass, field

PHASES = ("scale", "plans", "lookup", "hook", "register", "expiry", "gateway")


@dataclass
class BenchConfig:
    """Sizes, rates and durations of one run."""

    quick: bool = False
    leases: int = 100_000  # live leases for the plan rates
    scale_tiers: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    tenants: int = 1000
    decode_engines: int = 8
    prefill_engines: int = 2
    clients: int = 3  # load-generator processes
    step_seconds: float = 10.0  # each measured plan rate
    rates: list[int] = field(default_factory=lambda: [500, 1000, 2000])
    search_rates: list[int] = field(default_factory=lambda: [3000, 4000, 5000, 6000, 8000])
    scale_rate: int = 1000
    path_seconds: float = 5.0  # each step of the lookup comparison, per lookup
    p99_budget_ms: float = 5.0
    register_seconds: float = 10.0
    register_concurrency: int = 64  # per client process
    expiry_leases: int = 100_000
    expiry_window_seconds: float = 60.0
    gateway_seconds: float = 30.0
    gateway_slots: int = 2  # concurrent conversations per path
    seed: int = 1
    phases: set[str] = field(default_factory=lambda: set(PHASES))
    control_plane: bool = False  # the registry and the router as one `boomerang control-plane` process

    @classmethod
    def for_run(cls, quick: bool, leases: int | None = None, step_seconds: float | None = None) -> BenchConfig:
        """The full run, or `--quick` (under two minutes), with optional overrides."""
        cfg = cls(quick=quick)
        if quick:
            cfg.step_seconds = 3.0
            cfg.search_rates = [3000, 4000]
            cfg.path_seconds = 2.0
            cfg.register_seconds = 4.0
            cfg.expiry_leases = 10_000
            cfg.expiry_window_seconds = 10.0
            cfg.gateway_seconds = 6.0
        if leases is not None:
            cfg.leases = leases
        if step_seconds is not None:
            cfg.step_seconds = step_seconds
            cfg.path_seconds = min(cfg.path_seconds, step_seconds)
        small = max(1, min(10_000, cfg.leases // 10))
        cfg.scale_tiers = sorted({small, cfg.leases} | (set() if quick else {max(1_000_000, cfg.leases)}))
        return cfg
