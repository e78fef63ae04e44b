"""The mutual-TLS compose overlay: its certificates really work with the services.

`deploy/mtls/gen-certs.sh` runs here (openssl), then a registry and a router start with the
certificates exactly as `docker-compose.mtls.yml` wires them, and components talk to each
other as the principals their certificates name.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient

from tests.support.procs import ROOT, ServiceProcess
from tests.support.registry_data import engine_request

pytestmark = pytest.mark.e2e


def tls_env(certs: Path, name: str) -> dict[str, str]:
    return {"BOOMERANG_TLS_CA_FILE": str(certs / "ca.pem"), "BOOMERANG_TLS_CERT_FILE": str(certs / f"{name}.pem"),
            "BOOMERANG_TLS_KEY_FILE": str(certs / f"{name}.key")}


def test_overlay_gives_every_grpc_component_its_own_certificate(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "deploy/mtls/gen-certs.sh"), str(tmp_path)], check=True, capture_output=True)
    overlay = yaml.safe_load((ROOT / "docker-compose.mtls.yml").read_text())
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in overlay["services"].items():
        assert name in base["services"], name
        env = service["environment"]
        cert = Path(env["BOOMERANG_TLS_CERT_FILE"]).name
        assert (tmp_path / cert).exists() and (tmp_path / cert.replace(".pem", ".key")).exists()
        subject = subprocess.run(["openssl", "x509", "-in", str(tmp_path / cert), "-noout", "-subject"],
                                 capture_output=True, text=True, check=True).stdout
        expected = f"engine:{name}-0" if name.startswith("sim-") else f"service:{name}"
        assert expected in subject, (name, subject)
        if "--engine-id" in service.get("command", []):
            assert service["command"][service["command"].index("--engine-id") + 1] == expected.split(":", 1)[1]
    for name in ("registry", "router", "reaper"):
        assert overlay["services"][name]["environment"]["BOOMERANG_REQUIRE_AUTH"] == "true"


async def test_generated_certificates_carry_identities_between_real_services(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run([str(ROOT / "deploy/mtls/gen-certs.sh"), str(tmp_path)], check=True, capture_output=True)
    env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"}
    registry = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {**env, **tls_env(tmp_path, "registry")}).start()
    router = ServiceProcess(["router", "--listen", "127.0.0.1:0", "--registry", registry.address],
                            {**env, **tls_env(tmp_path, "router")}).start()
    try:
        for key, value in tls_env(tmp_path, "sim-decode").items():
            monkeypatch.setenv(key, value)
        async with RegistryClient(registry.address) as as_engine:
            await as_engine.register_engine(engine_request("sim-decode-0"))
            with pytest.raises(BoomerangClientError) as err:
                await as_engine.register_engine(engine_request("sim-prefill-0"))
            assert err.value.reason == "ENGINE_MISMATCH"
        health = [str(Path(ROOT / ".venv/bin/python")), "-m", "boomerang_server.rpc.healthcheck"]
        ok = subprocess.run([*health, router.address], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", **tls_env(tmp_path, "gateway")})
        assert ok.returncode == 0, ok.stderr
        refused = subprocess.run([*health, router.address], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert refused.returncode == 1 and "unhealthy" in refused.stderr
    finally:
        router.kill()
        registry.kill()
