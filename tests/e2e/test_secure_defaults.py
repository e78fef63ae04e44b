"""Secure by default: a gRPC service listening beyond loopback refuses anonymous callers.

Each service runs as a real process bound to 0.0.0.0 (port 0) with nothing configured and is
called through 127.0.0.1: anonymous calls get UNAUTHENTICATED with a message that says what
to do, a service token works, and only the plainly named development setting lets anonymous
callers in (with a warning at start-up). On loopback nothing changes (`boomerang up`, the
other tests), and the anonymous principal never acts for an engine beyond it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.reaper import ReaperClient
from boomerang.clients.registry import RegistryClient
from boomerang.clients.router import RouterClient
from boomerang.v1 import registry_service_pb2 as rpb
from boomerang.v1 import router_service_pb2 as rtpb

from tests.support.procs import BOOMERANG, ServiceProcess, wait_for
from tests.support.registry_data import engine_request

pytestmark = pytest.mark.e2e

Call = Callable[[str], Awaitable[Any]]


async def list_registry(address: str) -> Any:
    async with RegistryClient(address, timeout=5) as c:
        return await c.list_engines(rpb.ListEnginesRequest())


async def list_router(address: str) -> Any:
    async with RouterClient(address) as c:
        return await c.list_engines(rtpb.RouterServiceListEnginesRequest())


async def reaper_status(address: str) -> Any:
    async with ReaperClient(address) as c:
        return await c.get_status(timeout=5)


# service → (extra flags, a call every service principal may make)
SERVICES: dict[str, tuple[list[str], Call]] = {
    "registry": ([], list_registry),
    "router": (["--registry", "{registry}"], list_router),
    "reaper": (["--registry", "{registry}"], reaper_status),
}


@pytest.fixture(scope="module")
def loopback_registry(database_url: str) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(["registry", "--listen", "127.0.0.1:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    yield proc
    proc.kill()


@pytest.fixture(autouse=True)
def no_client_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BOOMERANG_AUTH_TOKEN", "BOOMERANG_AUTH_TOKEN_FILE", "BOOMERANG_TLS_CERT_FILE",
                 "BOOMERANG_TLS_KEY_FILE", "BOOMERANG_TLS_CA_FILE", "BOOMERANG_REQUIRE_AUTH",
                 "BOOMERANG_INSECURE_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)


def start(service: str, registry: ServiceProcess, env: dict[str, str]) -> ServiceProcess:
    flags = [f.format(registry=registry.address) for f in SERVICES[service][0]]
    return ServiceProcess([service, "--listen", "0.0.0.0:0", *flags], env).start()


def via_loopback(proc: ServiceProcess) -> str:
    host, _, port = proc.address.rpartition(":")
    assert host == "0.0.0.0", proc.address
    return f"127.0.0.1:{port}"


def create_token(database_url: str, principal: str) -> str:
    out = subprocess.run([BOOMERANG, "credentials", "create", principal, "--database-url", database_url],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_beyond_loopback_anonymous_callers_are_refused_and_a_token_is_served(
    service: str, database_url: str, loopback_registry: ServiceProcess, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = start(service, loopback_registry, {"BOOMERANG_DATABASE_URL": database_url})
    call = SERVICES[service][1]
    try:
        with pytest.raises(BoomerangClientError) as err:
            await call(via_loopback(proc))
        assert (err.value.code, err.value.reason) == ("UNAUTHENTICATED", "NO_CREDENTIALS")
        message = str(err.value)
        assert "0.0.0.0" in message and "beyond loopback" in message and "boomerang credentials create" in message
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", create_token(database_url, f"service:ops-{unique}"))
        await call(via_loopback(proc))
    finally:
        proc.kill()


@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_the_development_setting_lets_anonymous_callers_in_with_a_warning(
    service: str, database_url: str, loopback_registry: ServiceProcess
) -> None:
    proc = start(service, loopback_registry,
                 {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_INSECURE_ALLOW_ANONYMOUS": "true"})
    try:
        await SERVICES[service][1](via_loopback(proc))
        assert wait_for(lambda: "INSECURE" in proc.output(), timeout=5), proc.output()
        assert "BOOMERANG_INSECURE_ALLOW_ANONYMOUS" in proc.output()
    finally:
        proc.kill()


async def test_the_anonymous_principal_never_acts_for_an_engine_beyond_loopback(
    database_url: str, loopback_registry: ServiceProcess, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = start("registry", loopback_registry, {"BOOMERANG_DATABASE_URL": database_url})
    try:
        address = via_loopback(proc)
        async with RegistryClient(address, timeout=5) as anonymous:
            for call in (
                anonymous.register_engine(engine_request(f"d-{unique}")),
                anonymous.heartbeat(rpb.HeartbeatRequest(engine_id=f"d-{unique}", registration_generation=1)),
            ):
                with pytest.raises(BoomerangClientError) as err:
                    await call
                assert err.value.code == "UNAUTHENTICATED"
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", create_token(database_url, f"engine:d-{unique}"))
        async with RegistryClient(address, timeout=5) as engine:
            await engine.register_engine(engine_request(f"d-{unique}"))
        # On loopback with nothing configured the same anonymous calls work, as they always did.
        monkeypatch.delenv("BOOMERANG_AUTH_TOKEN")
        async with RegistryClient(loopback_registry.address, timeout=5) as local:
            await local.register_engine(engine_request(f"l-{unique}"))
    finally:
        proc.kill()


def test_required_auth_and_the_development_setting_together_stop_the_service(database_url: str) -> None:
    out = subprocess.run(
        [BOOMERANG, "registry", "--listen", "0.0.0.0:0"],
        env={"PATH": "/usr/bin:/bin", "BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true",
             "BOOMERANG_INSECURE_ALLOW_ANONYMOUS": "true"},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode != 0 and "contradict" in out.stderr, out.stderr


async def test_credentials_ensure_issues_once_keeps_live_tokens_and_replaces_revoked_ones(
    database_url: str, unique: str, tmp_path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    def ensure(*principals: str) -> str:
        return subprocess.run([BOOMERANG, "credentials", "ensure", "--dir", str(tmp_path / "creds"), *principals,
                               "--database-url", database_url], capture_output=True, text=True, check=True).stdout

    service, engine = f"service:gw-{unique}", f"engine:d-{unique}"
    assert ensure(service, engine).count("issued") == 2
    path = tmp_path / "creds" / f"service-gw-{unique}.token"
    first = path.read_text().strip()
    assert first.startswith("bmr_") and path.stat().st_mode & 0o777 == 0o600
    assert ensure(service, engine).count("kept") == 2 and path.read_text().strip() == first
    subprocess.run([BOOMERANG, "credentials", "revoke", service, "--database-url", database_url], check=True,
                   capture_output=True)
    assert f"{service}: issued" in ensure(service, engine)
    second = path.read_text().strip()
    assert second != first
    registry = ServiceProcess(["registry", "--listen", "0.0.0.0:0"], {"BOOMERANG_DATABASE_URL": database_url}).start()
    try:
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN_FILE", str(path))
        await list_registry(via_loopback(registry))  # the file's token is the service's
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN_FILE", str(tmp_path / "creds" / f"engine-d-{unique}.token"))
        async with RegistryClient(via_loopback(registry), timeout=5) as as_engine:
            await as_engine.register_engine(engine_request(f"d-{unique}"))
    finally:
        registry.kill()
    bad = subprocess.run([BOOMERANG, "credentials", "ensure", "--dir", str(tmp_path), "engine:../escape",
                          "--database-url", database_url], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "file name" in bad.stderr
