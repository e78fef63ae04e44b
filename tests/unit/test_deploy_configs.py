"""The compose stack's observability configuration: valid, consistent, and about real metrics.

There is no Docker daemon here, so the configurations are checked for structure and for
agreeing with each other and with docker-compose.yml: the collector receives where the
services export, Prometheus scrapes where the services serve /metrics, Grafana reads the
Prometheus and Jaeger the stack runs, and every metric the dashboard queries is one the
services define. (`promtool`, `otelcol` and `docker compose` are run too where installed.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from boomerang_cli.main import build_parser

from tests.support.promnames import (
    dashboard,
    dashboard_queries,
    exported_in_process,
    metric_names,
    referenced,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BOOMERANG_IMAGE = "boomerang:dev"
# Long-running gRPC services; the gateway serves /metrics on its HTTP port.
GRPC_SERVICES = {"registry", "router", "reaper"}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _compose() -> dict[str, Any]:
    return _yaml(ROOT / "docker-compose.yml")


def _flag(command: list[str], flag: str) -> str | None:
    args = build_parser().parse_args(command)
    return getattr(args, flag.lstrip("-").replace("-", "_"), None)


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _boomerang_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("image") == BOOMERANG_IMAGE}


def _prometheus_targets() -> dict[str, str]:
    """`host:port` → the `service` label, over every static target."""
    config = _yaml(DEPLOY / "prometheus" / "prometheus.yml")
    out = {}
    for job in config["scrape_configs"]:
        for group in job.get("static_configs", []):
            for target in group["targets"]:
                out[target] = group.get("labels", {}).get("service", job["job_name"])
    return out


def test_compose_runs_the_observability_stack_from_files_in_the_repository() -> None:
    services = _compose()["services"]
    for name in ("otel-collector", "jaeger", "prometheus", "grafana"):
        assert name in services, f"docker-compose.yml lacks {name}"
        assert re.match(r"^[\w./-]+:[\w.-]+$", services[name]["image"]), "images are pinned to a tag"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    for dep in ("prometheus", "jaeger"):
        assert dep in services["grafana"]["depends_on"]


def test_every_boomerang_service_exports_traces_to_the_collector_and_metrics_to_prometheus() -> None:
    compose = _compose()
    collector = _yaml(DEPLOY / "otel-collector.yaml")
    otlp_port = _port(collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    targets = _prometheus_targets()
    scraped = {t.partition(":")[0]: _port(t) for t in targets}
    services = _boomerang_services(compose)
    assert "registry" in services
    for name, service in services.items():
        command = service["command"]
        if command[0] in ("migrate",):
            continue
        endpoint = urlparse(service["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert (endpoint.hostname, endpoint.port) == ("otel-collector", otlp_port), name
        if command[0] in GRPC_SERVICES:
            listen = _flag(command, "--metrics-listen")
            assert listen, f"{name} serves no /metrics (--metrics-listen)"
            assert scraped.get(name) == _port(listen), f"Prometheus does not scrape {name} at {listen}"
        elif command[0] == "gateway":
            assert scraped.get(name) == _port(_flag(command, "--listen") or "127.0.0.1:8000"), name
    for target in targets:
        host = target.partition(":")[0]
        assert re.match(r"^[\w.-]+:\d+$", target), target
        if host in compose["services"] or host == "otel-collector":
            continue
        # Targets of services another part of the stack adds are allowed only for known names.
        assert host in GRPC_SERVICES | {"gateway"}, f"Prometheus scrapes {target}, which compose does not run"


def test_collector_pipeline_uses_only_defined_components_and_reaches_jaeger() -> None:
    config = _yaml(DEPLOY / "otel-collector.yaml")
    pipelines = config["service"]["pipelines"]
    assert "traces" in pipelines
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{component} is not defined under {kind}"
    jaeger = config["exporters"]["otlp/jaeger"]
    host, _, port = jaeger["endpoint"].partition(":")
    services = _compose()["services"]
    assert host in services and port == "4317"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert jaeger["tls"]["insecure"] is True


def test_prometheus_config_is_well_formed() -> None:
    config = _yaml(DEPLOY / "prometheus" / "prometheus.yml")
    duration = re.compile(r"^\d+(ms|s|m|h|d)$")
    glob = config["global"]
    for key in ("scrape_interval", "scrape_timeout", "evaluation_interval"):
        assert duration.match(glob[key]), key
    seconds = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}

    def secs(value: str) -> float:
        unit = re.sub(r"^\d+", "", value)
        return int(value[: -len(unit)]) * seconds[unit]

    assert secs(glob["scrape_timeout"]) <= secs(glob["scrape_interval"])
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert len(jobs) == len(set(jobs))
    labels = set(_prometheus_targets().values())
    assert GRPC_SERVICES | {"gateway"} <= labels


def test_grafana_provisions_prometheus_jaeger_and_the_dashboard() -> None:
    services = _compose()["services"]
    sources = _yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yaml")
    assert sources["apiVersion"] == 1
    by_uid = {s["uid"]: s for s in sources["datasources"]}
    assert by_uid["prometheus"]["type"] == "prometheus" and by_uid["jaeger"]["type"] == "jaeger"
    for source in by_uid.values():
        url = urlparse(source["url"])
        assert url.hostname in services, source["url"]
    assert _port(by_uid["prometheus"]["url"]) == 9090 and _port(by_uid["jaeger"]["url"]) == 16686
    providers = _yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml")
    path = providers["providers"][0]["options"]["path"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == path
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/boomerang.json"

    board = dashboard()
    assert board["uid"] == "boomerang" and board["title"] == "Boomerang"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] in by_uid and target["expr"] and target["refId"]


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    titles = [p["title"] for p in dashboard()["panels"]]
    for wanted in ("Reuse rate", "Saved prefill time", "Plan latency", "Leases by state",
                   "HBM retained per decode engine", "Expiry lag", "Reuse: planned vs delivered",
                   "Reuse misses by reason", "Retained block-seconds per decode engine",
                   "Releases by reason"):
        assert any(t.startswith(wanted) for t in titles), f"no panel {wanted!r}"


def test_every_dashboard_query_is_well_formed_promql() -> None:
    for expr in dashboard_queries():
        depth = 0
        for ch in expr:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            assert depth >= 0, expr
        assert depth == 0 and expr.count("{") == expr.count("}") and expr.count("[") == expr.count("]"), expr
        assert metric_names(expr), f"selects no metric: {expr}"
        for name in metric_names(expr):
            if name.endswith("_bucket"):
                assert "histogram_quantile(" in expr and "le" in re.findall(r"by \(([^)]*)\)", expr)[0], expr
            if name.endswith("_total"):
                assert re.search(rf"(rate|increase)\({name}\b", expr), f"a counter is read raw: {expr}"


def test_every_metric_the_dashboard_queries_is_exported_by_a_service() -> None:
    missing = referenced(dashboard_queries()) - exported_in_process()
    assert missing == set(), f"the dashboard queries metrics no service exports: {sorted(missing)}"


def test_the_metrics_the_issue_names_are_exported() -> None:
    exported = exported_in_process()
    for name in (
        "boomerang_router_plans_total",  # plans by decision and reason
        "boomerang_router_reused_prompt_tokens_total",
        "boomerang_router_recomputed_prompt_tokens_total",
        "boomerang_router_prefill_seconds_saved_total",
        "boomerang_leases",  # live leases by state
        "boomerang_retained_blocks",
        "boomerang_retained_bytes",
        "boomerang_registry_claim_seconds_bucket",
        "boomerang_router_plan_seconds_bucket",
        "boomerang_reaper_expiry_lag_seconds_bucket",
        "boomerang_registry_registration_batch_size_bucket",
        "boomerang_gateway_fallbacks_total",
        # Reuse outcomes (issue 16): planned vs delivered, misses by reason.
        "boomerang_gateway_reuse_turns_total",
        "boomerang_gateway_reuse_planned_tokens_total",
        "boomerang_gateway_reuse_delivered_tokens_total",
        "boomerang_gateway_reuse_declined_turns_total",
        # Decode memory (issue 24): block-seconds per engine, releases by reason.
        "boomerang_retained_block_seconds_total",
        "boomerang_registry_releases_total",
    ):
        assert name in exported, name


@pytest.mark.parametrize(
    "tool,args",
    [
        ("promtool", ["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")]),
        ("otelcol", ["validate", f"--config={DEPLOY / 'otel-collector.yaml'}"]),
        ("docker", ["compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"]),
    ],
)
def test_official_validators_where_installed(tool: str, args: list[str]) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    if tool == "docker" and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker has no compose plugin here")
    out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _depends(services: dict[str, Any], name: str) -> set[str]:
    """Every service `name` waits for, transitively (network_mode `service:X` counts)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        service = services[todo.pop()]
        deps = set(service.get("depends_on") or ())
        mode = service.get("network_mode", "")
        if mode.startswith("service:"):
            deps.add(mode.split(":", 1)[1])
        todo += sorted(deps - seen)
        seen |= deps
    return seen


def test_compose_runs_authenticated_with_a_token_per_component() -> None:
    compose = _compose()
    services = _boomerang_services(compose)
    migrate = services["migrate"]
    assert migrate["command"][:2] == ["credentials", "ensure"], "the migrate service issues the tokens"
    args = build_parser().parse_args(migrate["command"])
    issued = {f"{args.dir}/{p.replace(':', '-', 1)}.token": p for p in args.principals}
    volume = next(v for v in migrate["volumes"] if v.split(":")[1] == args.dir).split(":")[0]
    assert volume in compose["volumes"], "tokens live in a named volume"
    clients = 0
    for name, service in services.items():
        if name == "migrate":
            continue
        command, env = service["command"], service["environment"]
        assert env.get("BOOMERANG_REQUIRE_AUTH") == "true", f"{name} does not require authentication"
        assert env.get("BOOMERANG_INSECURE_ALLOW_ANONYMOUS", "false") == "false", name
        assert "--allow-anonymous" not in command and env.get("BOOMERANG_ALLOW_ANONYMOUS", "false") == "false", name
        if command[0] in GRPC_SERVICES:
            assert _flag(command, "--listen").startswith("0.0.0.0:"), name  # beyond loopback: refuses anonymous
        talks_grpc = _flag(command, "--registry") or (command[0] == "gateway" and _flag(command, "--router"))
        if not talks_grpc:
            assert command[0] == "registry", f"{name} talks to no gRPC service?"
            continue
        clients += 1
        expected = f"engine:{_flag(command, '--engine-id')}" if command[0] == "sim" else f"service:{command[0]}"
        path = env.get("BOOMERANG_AUTH_TOKEN_FILE", "")
        assert issued.get(path) == expected, f"{name} reads {path!r}, not a token the migrate service issues for {expected}"
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}
        assert mounts.get(args.dir) == volume and service["volumes"][0].endswith(":ro"), f"{name} lacks the tokens"
        assert "migrate" in _depends(compose["services"], name), f"{name} may start before its token exists"
    assert clients == 5  # router, reaper, gateway and both simulated engines


def test_the_mtls_overlay_adds_certificates_on_top_of_the_tokens() -> None:
    base = _boomerang_services(_compose())
    overlay = _yaml(ROOT / "docker-compose.mtls.yml")["services"]
    for name, service in overlay.items():
        env = {**base[name]["environment"], **service["environment"]}
        assert env["BOOMERANG_REQUIRE_AUTH"] == "true" and env["BOOMERANG_TLS_CERT_FILE"], name
        if "command" in service:  # the overlay's commands keep the engine ids the tokens were issued for
            assert _flag(service["command"], "--engine-id") == _flag(base[name]["command"], "--engine-id"), name
