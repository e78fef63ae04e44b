"""The gateway's Prometheus metrics, served at `GET /metrics` on its HTTP port.

Each app gets its own registry (so several apps in one test process never collide).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from boomerang_gateway.control import ReuseOutcome

# Seconds: 100 µs … 60 s (a plan takes about a millisecond, a long prefill seconds).
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


class GatewayMetrics:
    """Every metric the gateway exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "boomerang_gateway_requests", "Client requests by endpoint and HTTP status.", ["endpoint", "status"], registry=r
        )
        self.turns = Counter(
            "boomerang_gateway_turns", "Turns by plan decision and reason.", ["decision", "reason"], registry=r
        )
        self.lease_summary = Counter(
            "boomerang_gateway_lease_summary",
            "Turns with a conversation id by what the live-lease summary said: ruled_out (started at once, COLD), "
            "maybe (planned as usual), unknown (no summary yet: planned as usual); and chats without one that "
            "hold no assistant message: first_turn (started at once, COLD).",
            ["verdict"], registry=r,
        )
        self.lease_summary_false_no = Counter(
            "boomerang_gateway_lease_summary_false_no",
            "Turns the summary ruled out whose plan, made beside the turn, would have pulled (a missed pull).",
            registry=r,
        )
        self.prompt_tokens = Counter("boomerang_gateway_prompt_tokens", "Prompt tokens of planned turns.", registry=r)
        self.reused_tokens = Counter(
            "boomerang_gateway_reused_tokens", "Prompt tokens the prefill engine was told to pull.", registry=r
        )
        # Reuse outcomes of served turns, in the manner of vLLM's `vllm:prefix_cache_queries`
        # and `vllm:prefix_cache_hits` (tokens looked up, tokens found): prompt tokens,
        # tokens the plan said to reuse, tokens the prefill engine says it did not compute.
        self.reuse_turns = Counter(
            "boomerang_gateway_reuse_turns",
            "Served turns (the prefill engine answered): the denominator of the reuse rate.",
            registry=r,
        )
        self.reuse_prompt_tokens = Counter(
            "boomerang_gateway_reuse_prompt_tokens",
            "Prompt tokens of served turns (the denominator of the reuse rates).",
            registry=r,
        )
        self.reuse_planned_tokens = Counter(
            "boomerang_gateway_reuse_planned_tokens",
            "Prompt tokens the plan told the prefill engine to pull (the planned reuse).",
            registry=r,
        )
        self.reuse_delivered_tokens = Counter(
            "boomerang_gateway_reuse_delivered_tokens",
            "Prompt tokens the prefill engine reports it did not compute (pulled or from its own prefix "
            "cache; vLLM's prompt_tokens_details.cached_tokens or remote_prefill_cached_tokens).",
            registry=r,
        )
        self.reuse_unreported_turns = Counter(
            "boomerang_gateway_reuse_unreported_turns",
            "Served turns whose prefill engine reported no cached-token count (delivered reuse unknown).",
            registry=r,
        )
        self.reuse_declined_turns = Counter(
            "boomerang_gateway_reuse_declined_turns",
            "Served turns that reused nothing or less than planned, by reason (the plan's reason, "
            "a gateway-side cause, or PREFILL_SHORTFALL).",
            ["reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "boomerang_gateway_fallbacks",
            "Turns served as plain prefill→decode because a control-plane step failed.",
            ["cause"],
            registry=r,
        )
        self.dropped_kv_params = Counter(
            "boomerang_gateway_client_kv_transfer_params_dropped",
            "Client requests that carried kv_transfer_params (always dropped).",
            registry=r,
        )
        self.local_tokenize = Counter(
            "boomerang_gateway_local_tokenize",
            "Prompts of models in BOOMERANG_TOKENIZERS, by outcome: local (tokenized in-process), "
            "unsupported (a request the renderer does not mirror; /tokenize asked), failed, load_failed.",
            ["outcome"],
            registry=r,
        )
        self.local_tokenize_mismatches = Counter(
            "boomerang_gateway_local_tokenize_mismatches",
            "Turns whose in-process prompt ids differed from the decode engine's; the model then uses /tokenize.",
            ["model"],
            registry=r,
        )
        self.engine_errors = Counter(
            "boomerang_gateway_engine_errors", "Failed engine calls by role and kind.", ["role", "kind"], registry=r
        )
        self.stage_seconds = Histogram(
            "boomerang_gateway_stage_seconds",
            "Time spent per turn stage (tokenize, plan, prefill, decode_first_token).",
            ["stage"],
            buckets=BUCKETS,
            registry=r,
        )
        self.ttft_seconds = Histogram(
            "boomerang_gateway_ttft_seconds",
            "Time from request to the first generated token, by plan decision.",
            ["decision"],
            buckets=BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("boomerang_gateway_in_flight", "Turns in progress.", registry=r)
        self.reports = Counter(
            "boomerang_gateway_reports", "ReportTurn calls by retention outcome.", ["outcome"], registry=r
        )
        self.end_of_turn_seconds = Histogram(
            "boomerang_gateway_end_of_turn_seconds",
            "Time a finished turn waited for its ReportTurn answer before the client's last byte.",
            buckets=BUCKETS,
            registry=r,
        )
        self.end_of_turn_reports = Counter(
            "boomerang_gateway_end_of_turn_reports",
            "Finished turns by what became of their report before the last byte "
            "(committed, failed, timed_out: the turn ended without a durable lease).",
            ["outcome"],
            registry=r,
        )

    def observe_reuse(self, outcome: ReuseOutcome) -> None:
        """Count one served turn's reuse outcome."""
        self.reuse_turns.inc()
        self.reuse_prompt_tokens.inc(outcome.prompt_tokens)
        self.reuse_planned_tokens.inc(outcome.planned)
        if outcome.delivered is None:
            self.reuse_unreported_turns.inc()
        else:
            self.reuse_delivered_tokens.inc(outcome.delivered)
        if outcome.declined:
            self.reuse_declined_turns.labels(outcome.declined).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
