"""The Kubernetes manifests in deploy/kubernetes: valid, runnable, and consistent with the code.

No cluster here, so they are checked offline: every object against the official OpenAPI
schemas (kubernetes-validate, strict: unknown fields fail) at fixed Kubernetes versions;
every container command with the real `boomerang` argument parser; every environment
variable against the settings class of the service it configures, values included; and the
production shape (probes on the ports the services listen on, resources, PDBs, security
contexts, spreading, a termination grace that covers the services' drain, credentials only
by reference to the Secret that secret.example.yaml documents). `kubectl kustomize` is run
too where installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from boomerang.auth import TlsFiles, client_token
from boomerang_cli.main import build_parser
from boomerang_gateway.settings import GatewaySettings
from boomerang_reaper.settings import ReaperSettings
from boomerang_registry.settings import RegistrySettings
from boomerang_router.settings import RouterSettings
from boomerang_server.config import ENV_PREFIX, CommonSettings, TelemetrySettings
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = K8S / "kustomization.yaml"
SECRET_EXAMPLE = K8S / "secret.example.yaml"
# The oldest version the manifests claim (native gRPC probes are GA since 1.27; matchLabelKeys
# and unhealthyPodEvictionPolicy are on by default since 1.27), and the newest schemas shipped.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

# What each `boomerang` subcommand reads its configuration from.
SETTINGS: dict[str, list[type[BaseSettings]]] = {
    "registry": [RegistrySettings],
    "router": [RouterSettings, TelemetrySettings],  # the router's metrics read TelemetrySettings
    "reaper": [ReaperSettings],
    "gateway": [GatewaySettings],
    "migrate": [CommonSettings],
}
# Variables boomerang.auth reads directly (every gRPC server and client); each is proven below.
AUTH_ENV = {
    "BOOMERANG_AUTH_TOKEN",
    "BOOMERANG_TLS_CERT_FILE",
    "BOOMERANG_TLS_KEY_FILE",
    "BOOMERANG_TLS_CA_FILE",
}
# Variables whose values are credentials: only ever from the Secret.
SECRET_ENV = {"BOOMERANG_DATABASE_URL", "BOOMERANG_AUTH_TOKEN"}
GRPC_PORTS = {"registry": 50051, "router": 50052, "reaper": 50053}
GATEWAY_PORT = 8000
# Components that call another Boomerang gRPC service, and so need a token.
CALLERS = {"router", "reaper", "gateway"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != KUSTOMIZATION.name)


def _kustomization() -> dict[str, Any]:
    kustomization: dict[str, Any] = yaml.safe_load(KUSTOMIZATION.read_text())
    return kustomization


def _deployed() -> list[dict[str, Any]]:
    """Every object the kustomization applies."""
    return [doc for name in _kustomization()["resources"] for doc in _docs(K8S / name)]


def _of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in _deployed() if d["kind"] == kind]


def _workloads() -> list[dict[str, Any]]:
    return _of_kind("Deployment") + _of_kind("Job")


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _parse(container: dict[str, Any]) -> Any:
    """The container's arguments through the real `boomerang` parser."""
    assert container.get("command", ["boomerang"]) == ["boomerang"], container["name"]
    argv = [str(a) for a in container.get("args", [])]
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(
            f"{container['name']}: `boomerang {' '.join(argv)}` does not parse (exit {exc.code})"
        )


def _component(workload: dict[str, Any]) -> str:
    return str(workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])


def _only_container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, workload["metadata"]["name"]
    container: dict[str, Any] = containers[0]
    return container


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = container.get("env", [])
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), f"{container['name']} sets a variable twice"
    return {e["name"]: e for e in entries}


def _literal(container: dict[str, Any], name: str, cls: type[BaseSettings]) -> Any:
    """A variable's literal value in the container, or the setting's default."""
    entry = _env(container).get(name)
    if entry is not None:
        assert "value" in entry, f"{name} is expected as a literal"
        return entry["value"]
    return cls.model_fields[name[len(ENV_PREFIX) :].lower()].default


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _container_port(container: dict[str, Any], port: int | str) -> int:
    """A port number, resolving a named port against the container's ports."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    assert port in named, f"{container['name']} has no port named {port}"
    return int(named[port])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _secret_example() -> dict[str, Any]:
    (secret,) = _docs(SECRET_EXAMPLE)
    return secret


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G)?$")
_FACTOR = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def _quantity(value: str | int) -> float:
    match = _QUANTITY.match(str(value))
    assert match, f"not a quantity: {value!r}"
    return float(match.group(1)) * _FACTOR[match.group(2)]


# -- the files ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_every_manifest_is_valid_for_kubernetes(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs, f"{path.name} holds no objects"
    for doc in docs:
        name = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{name} is invalid for Kubernetes {version}: {'.'.join(map(str, exc.path))}: {exc.message}"
            )
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{name}: {exc.message}")


def test_the_kustomization_lists_every_manifest_and_no_credentials() -> None:
    kustomization = _kustomization()
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    expected = {p.name for p in _manifest_files()} - {SECRET_EXAMPLE.name}
    assert set(resources) == expected, (
        "kustomization.yaml must list every manifest file (but the example Secret)"
    )
    assert SECRET_EXAMPLE.name not in resources
    for key in ("secretGenerator", "configMapGenerator", "patches", "patchesStrategicMerge"):
        assert key not in kustomization, f"keep kustomization.yaml plain: no {key}"
    assert not [d for d in _deployed() if d["kind"] == "Secret"], (
        "no Secret may be applied from the repository"
    )
    # The image is set in one place, and every container runs that image at that tag.
    (image,) = kustomization["images"]
    for workload in _workloads():
        for container in _containers(workload):
            assert container["image"] == f"{image['name']}:{image['newTag']}", container["name"]
            assert image["newTag"] != "latest"


def test_no_credential_is_written_in_the_applied_manifests() -> None:
    example = _secret_example()["stringData"]
    for name in [KUSTOMIZATION.name, *_kustomization()["resources"]]:
        text = (K8S / name).read_text()
        assert not re.search(r"bmr_[A-Za-z0-9_-]{8,}", text), f"{name} holds a bearer token"
        assert not re.search(r"[a-z+]+://[^/\s:@]+:[^/\s@]+@", text), (
            f"{name} holds a URL with a password"
        )
        for value in example.values():
            assert value not in text, f"{name} copies a value of the example Secret"


def test_kustomize_builds_the_same_objects_where_installed() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S)], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]

    def key(doc: dict[str, Any]) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    assert sorted(map(key, built)) == sorted(map(key, _deployed()))
    assert all(d["kind"] != "Secret" for d in built)


# -- commands and settings ------------------------------------------------------------------


def test_every_command_is_a_boomerang_subcommand_that_parses() -> None:
    seen = set()
    for workload in _workloads():
        component = _component(workload)
        for container in _containers(workload):
            args = _parse(container)
            assert args.command == component, (
                f"{workload['metadata']['name']} runs `{args.command}`"
            )
            seen.add(args.command)
    assert seen == {"registry", "router", "reaper", "gateway", "migrate"}


def test_every_environment_variable_is_a_setting_of_its_service() -> None:
    for workload in _workloads():
        for container in _containers(workload):
            command = _parse(container).command
            known = set(AUTH_ENV)
            for cls in SETTINGS[command]:
                known |= {ENV_PREFIX + field.upper() for field in cls.model_fields}
            unknown = set(_env(container)) - known
            assert not unknown, (
                f"{container['name']}: no such setting of `boomerang {command}`: {sorted(unknown)}"
            )
            assert "envFrom" not in container, "name every variable, so each can be checked"


def test_boomerang_auth_reads_the_variables_it_is_credited_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in AUTH_ENV:
        monkeypatch.setenv(name, f"/value/of/{name}")
    assert client_token() == "/value/of/BOOMERANG_AUTH_TOKEN"
    tls = TlsFiles.from_env()
    assert (tls.cert, tls.key, tls.ca) == tuple(
        f"/value/of/BOOMERANG_TLS_{part}_FILE" for part in ("CERT", "KEY", "CA")
    )


def _settings_from(
    container: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> list[BaseSettings]:
    """The container's settings as its process would load them: environment plus flags."""
    example = _secret_example()["stringData"]
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, entry in _env(container).items():
        if "value" in entry:
            value = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            value = example[entry["valueFrom"]["secretKeyRef"]["key"]]
        else:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", name
            value = "boomerang-reaper-7d9f8c6b5-x2x4q"
        monkeypatch.setenv(name, str(value))
    args = _parse(container)
    flags = {
        "listen": getattr(args, "listen", None),
        "metrics_listen": getattr(args, "metrics_listen", None),
        "registry_address": getattr(args, "registry", None),
        "router_address": getattr(args, "router", None),
        "database_url": getattr(args, "database_url", None),
    }
    loaded = []
    for cls in SETTINGS[args.command]:
        given = {k: v for k, v in flags.items() if v is not None and k in cls.model_fields}
        loaded.append(cls(**given))  # a bad value raises ValidationError here
    return loaded


def test_every_setting_value_is_accepted_by_its_service(monkeypatch: pytest.MonkeyPatch) -> None:
    for workload in _workloads():
        for container in _containers(workload):
            with monkeypatch.context() as patch:
                settings = _settings_from(container, patch)
            assert isinstance(settings[0], CommonSettings)
            assert settings[0].database_url.startswith("postgresql+asyncpg://"), container["name"]


# -- credentials and authentication ---------------------------------------------------------


def test_credentials_come_from_the_secret_by_reference_only() -> None:
    secret = _secret_example()
    assert secret["kind"] == "Secret" and "data" not in secret
    documented = set(secret["stringData"])
    used = set()
    for workload in _workloads():
        for container in _containers(workload):
            assert "envFrom" not in container
            for name, entry in _env(container).items():
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if name in SECRET_ENV:
                    assert "value" not in entry and ref, (
                        f"{container['name']}: {name} must come from a Secret"
                    )
                if ref:
                    assert ref["name"] == secret["metadata"]["name"], f"{name} reads another Secret"
                    assert ref["key"] in documented, (
                        f"secret.example.yaml does not document key {ref['key']}"
                    )
                    assert ref.get("optional") is not True, f"{name} must not be optional"
                    used.add(ref["key"])
            assert "BOOMERANG_DATABASE_URL" in _env(container), (
                f"{container['name']} has no database"
            )
    assert used == documented, (
        f"secret.example.yaml documents unused keys: {sorted(documented - used)}"
    )
    assert secret["metadata"]["namespace"] == _kustomization()["namespace"]


def test_the_grpc_services_require_auth_and_every_caller_presents_a_token() -> None:
    tokens = {}
    for deployment in _of_kind("Deployment"):
        component = _component(deployment)
        container = _only_container(deployment)
        env = _env(container)
        if component in GRPC_PORTS:
            assert env.get("BOOMERANG_REQUIRE_AUTH", {}).get("value") == "true", (
                f"{component} must require auth"
            )
        if component in CALLERS:
            ref = env["BOOMERANG_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            tokens[component] = ref["key"]
        else:
            assert "BOOMERANG_AUTH_TOKEN" not in env, f"{component} calls no service"
        if component == "gateway":
            assert not _parse(container).allow_anonymous, "the gateway must require API keys"
            assert env.get("BOOMERANG_ALLOW_ANONYMOUS", {}).get("value", "false") == "false"
    assert set(tokens) == CALLERS
    assert len(set(tokens.values())) == len(tokens), "each service has its own credential"


# -- the shape of each workload -------------------------------------------------------------


def _dockerfile_uid() -> int:
    match = re.search(r"useradd [^\n]*--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert match, "the Dockerfile creates no user with a fixed uid"
    return int(match.group(1))


def test_every_pod_runs_restricted() -> None:
    uid = _dockerfile_uid()
    accounts = {sa["metadata"]["name"]: sa for sa in _of_kind("ServiceAccount")}
    for workload in _workloads():
        pod = workload["spec"]["template"]["spec"]
        name = workload["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False, name
        account = accounts[pod["serviceAccountName"]]
        assert account["automountServiceAccountToken"] is False, account["metadata"]["name"]
        assert (
            pod["securityContext"]["runAsNonRoot"] is True
            and pod["securityContext"]["runAsUser"] == uid
        ), name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        mounts_tmp = {}
        for container in _containers(workload):
            ctx = container["securityContext"]
            assert ctx["runAsNonRoot"] is True, container["name"]
            assert ctx.get("runAsUser", uid) == uid, container["name"]
            assert ctx["allowPrivilegeEscalation"] is False, container["name"]
            assert ctx["capabilities"]["drop"] == ["ALL"] and not ctx["capabilities"].get("add"), (
                container["name"]
            )
            assert ctx["readOnlyRootFilesystem"] is True, container["name"]
            mounts_tmp[container["name"]] = any(
                m["mountPath"] == "/tmp" for m in container.get("volumeMounts", [])
            )
        assert all(mounts_tmp.values()), f"{name}: a read-only root needs a writable /tmp"
        assert all("emptyDir" in v for v in pod.get("volumes", [])), (
            f"{name} mounts only scratch space"
        )
    (namespace,) = _of_kind("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_every_container_has_requests_and_limits() -> None:
    for workload in _workloads():
        for container in _containers(workload):
            resources = container["resources"]
            for kind in ("cpu", "memory"):
                request = _quantity(resources["requests"][kind])
                limit = _quantity(resources["limits"][kind])
                assert 0 < request <= limit, (
                    f"{container['name']}: {kind} request {request} > limit {limit}"
                )


def test_every_deployment_is_replicated_spread_and_probed() -> None:
    deployments = _of_kind("Deployment")
    assert {_component(d) for d in deployments} == {"registry", "router", "reaper", "gateway"}
    for deployment in deployments:
        component = _component(deployment)
        spec = deployment["spec"]
        pod = spec["template"]
        labels = pod["metadata"]["labels"]
        assert spec["replicas"] == 2, component
        assert _selects(spec["selector"]["matchLabels"], labels), component
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, component
        spread = pod["spec"].get("topologySpreadConstraints", [])
        anti = pod["spec"].get("affinity", {}).get("podAntiAffinity")
        assert spread or anti, f"{component} is not spread over nodes"
        for constraint in spread:
            assert _selects(constraint["labelSelector"]["matchLabels"], labels), component
        assert any(c["topologyKey"] == "kubernetes.io/hostname" for c in spread) or anti, component

        container = _only_container(deployment)
        args = _parse(container)
        listen = _port(args.listen)
        declared = {p["containerPort"] for p in container["ports"]}
        assert listen in declared, (
            f"{component} listens on {listen}, which its pod does not declare"
        )
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[kind]
            if component in GRPC_PORTS:
                assert listen == GRPC_PORTS[component], component
                # Kubernetes' own gRPC probe speaks grpc.health.v1, which every service serves.
                assert _container_port(container, probe["grpc"]["port"]) == listen, (
                    f"{component} {kind}"
                )
                assert "service" not in probe["grpc"], "the whole server's health (service '')"
            else:
                assert listen == GATEWAY_PORT
                assert probe["httpGet"]["path"] == "/health", f"{component} {kind}"
                assert _container_port(container, probe["httpGet"]["port"]) == listen, (
                    f"{component} {kind}"
                )
            assert probe["timeoutSeconds"] < probe["periodSeconds"], f"{component} {kind}"


def test_the_gateway_health_route_is_the_one_probed() -> None:
    source = (ROOT / "services" / "gateway" / "boomerang_gateway" / "app.py").read_text()
    assert re.search(r'Route\("/health", [^)]*methods=\["GET"\]\)', source), (
        "the gateway no longer serves GET /health"
    )


def test_prometheus_scrapes_every_pod_where_it_serves_metrics() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for deployment in _of_kind("Deployment"):
        component = _component(deployment)
        pod = deployment["spec"]["template"]
        container = _only_container(deployment)
        args = _parse(container)
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", component
        assert annotations["prometheus.io/path"] == "/metrics", component
        if component in GRPC_PORTS:
            metrics = _port(args.metrics_listen)
            compose_args = build_parser().parse_args(compose[component]["command"])
            assert metrics == _port(compose_args.metrics_listen), (
                f"{component}: not the compose stack's metrics port"
            )
        else:
            metrics = _port(args.listen)  # the gateway serves /metrics on its HTTP port
        assert int(annotations["prometheus.io/port"]) == metrics, component
        assert metrics in {p["containerPort"] for p in container["ports"]}, component


def test_termination_grace_covers_the_drain() -> None:
    for deployment in _of_kind("Deployment"):
        component = _component(deployment)
        container = _only_container(deployment)
        cls = SETTINGS[component][0]
        drain = float(_literal(container, "BOOMERANG_DRAIN_DELAY_SECONDS", cls))
        grace = float(_literal(container, "BOOMERANG_GRACE_SECONDS", cls))
        assert drain >= 2, f"{component}: a drain delay under 2 s outruns endpoint updates"
        # gRPC services: drain delay, then in-flight calls within the grace. The gateway then
        # also waits up to the grace again for pending ReportTurn calls.
        needed = drain + (2 * grace if component == "gateway" else grace)
        period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert period >= needed + 5, (
            f"{component}: {period} s < drain {drain} + grace ({needed} s) + clean-up"
        )


def test_every_deployment_has_a_disruption_budget_that_lets_nodes_drain() -> None:
    budgets = _of_kind("PodDisruptionBudget")
    deployments = _of_kind("Deployment")
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        mine = [b for b in budgets if _selects(b["spec"]["selector"]["matchLabels"], labels)]
        assert len(mine) == 1, (
            f"{deployment['metadata']['name']} has {len(mine)} PodDisruptionBudgets"
        )
        spec = mine[0]["spec"]
        if "minAvailable" in spec:
            assert 1 <= spec["minAvailable"] < deployment["spec"]["replicas"], (
                "keeps one, allows one eviction"
            )
        else:
            assert spec["maxUnavailable"] >= 1
    for budget in budgets:
        selected = [
            d
            for d in deployments
            if _selects(
                budget["spec"]["selector"]["matchLabels"],
                d["spec"]["template"]["metadata"]["labels"],
            )
        ]
        assert len(selected) == 1, (
            f"{budget['metadata']['name']} selects {len(selected)} Deployments"
        )


def test_the_migration_job_runs_migrate_once_to_completion() -> None:
    (job,) = _of_kind("Job")
    spec = job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
    assert spec["backoffLimit"] >= 1 and spec.get("activeDeadlineSeconds", 0) > 0
    (container,) = spec["template"]["spec"]["containers"]
    assert _parse(container).command == "migrate"
    for deployment in _of_kind("Deployment"):
        # The Job owns the schema; the services do not migrate at start.
        assert _env(_only_container(deployment))["BOOMERANG_MIGRATE_ON_START"]["value"] == "false"


# -- services and addresses -----------------------------------------------------------------


def test_every_service_selects_one_deployment_and_targets_its_ports() -> None:
    deployments = _of_kind("Deployment")
    for service in _of_kind("Service"):
        name = service["metadata"]["name"]
        selected = [
            d
            for d in deployments
            if _selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(selected) == 1, f"Service {name} selects {len(selected)} Deployments"
        (deployment,) = selected
        component = _component(deployment)
        container = _only_container(deployment)
        declared = {p["containerPort"] for p in container["ports"]}
        ports = {}
        for port in service["spec"]["ports"]:
            target = _container_port(container, port.get("targetPort", port["port"]))
            assert target in declared, (
                f"Service {name} targets {target}, which {component} does not declare"
            )
            ports[port["port"]] = target
        args = _parse(container)
        if component in GRPC_PORTS:
            assert ports.get(GRPC_PORTS[component]) == _port(args.listen), (
                f"Service {name}: gRPC port"
            )
            assert ports.get(_port(args.metrics_listen)) == _port(args.metrics_listen), (
                f"Service {name}: metrics"
            )
        else:
            assert ports.get(GATEWAY_PORT) == _port(args.listen), f"Service {name}: HTTP port"
    assert {_component(d) for d in deployments} == {
        _component(d)
        for d in deployments
        for s in _of_kind("Service")
        if _selects(s["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
    }, "every Deployment has a Service"


def test_every_address_a_service_calls_is_a_service_here() -> None:
    services = {
        s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]} for s in _of_kind("Service")
    }
    calls = 0
    for deployment in _of_kind("Deployment"):
        args = _parse(_only_container(deployment))
        for flag in ("registry", "router"):
            address = getattr(args, flag, None)
            if address is None:
                continue
            host, _, port = address.rpartition(":")
            assert host in services and int(port) in services[host], (
                f"{flag} address {address} is not a Service here"
            )
            calls += 1
    assert calls == 4  # router → registry, reaper → registry, gateway → router and registry


def test_everything_lives_in_the_namespace() -> None:
    (namespace,) = _of_kind("Namespace")
    name = namespace["metadata"]["name"]
    assert _kustomization()["namespace"] == name
    for doc in _deployed():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == name, (
                f"{doc['kind']}/{doc['metadata']['name']}"
            )
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "boomerang"
