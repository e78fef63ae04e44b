"""docker-compose.yml's authentication, run for real: its commands and environment, as processes.

There is no Docker daemon here, so each Boomerang service of the compose file runs as a
process with the file's own command and environment; only what Docker provides is
translated: service host names and fixed ports become 127.0.0.1 and free ports, the
`credentials` volume a temporary directory, the database the test's. The migrate service
issues the tokens; every component then authenticates with its own, and an anonymous caller
is refused.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb

from tests.support.databases import fresh_database
from tests.support.ministack import chat, user_turns
from tests.support.procs import BOOMERANG, ROOT, ServiceProcess

pytestmark = pytest.mark.e2e

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
ORDER = ["registry", "reaper", "router", "sim-prefill", "sim-decode", "gateway"]


class ComposeAsProcesses:
    def __init__(self, database_url: str, credentials: Path):
        self.database_url = database_url
        self.credentials = credentials
        self.addresses: dict[str, str] = {}
        self.procs: dict[str, ServiceProcess] = {}

    def env(self, name: str) -> dict[str, str]:
        env = {k: str(v) for k, v in COMPOSE[name]["environment"].items()}
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        env["BOOMERANG_DATABASE_URL"] = self.database_url
        if "BOOMERANG_AUTH_TOKEN_FILE" in env:
            env["BOOMERANG_AUTH_TOKEN_FILE"] = env["BOOMERANG_AUTH_TOKEN_FILE"].replace("/credentials", str(self.credentials))
        return env

    def command(self, name: str) -> list[str]:
        out = []
        for arg in COMPOSE[name]["command"]:
            arg = arg.replace("/credentials", str(self.credentials))
            host, sep, port = arg.rpartition(":")
            if sep and port.isdigit() and host == "0.0.0.0":
                arg = "0.0.0.0:0" if not out or out[-1] != "--metrics-listen" else "127.0.0.1:0"
            elif sep and port.isdigit() and host in self.addresses:
                arg = self.addresses[host]
            out.append(arg)
        if out[0] == "sim":
            out[out.index("--port") + 1] = "0"
            out += ["--time-scale", "0", "--heartbeat-seconds", "0.5"]
        return out

    def migrate(self) -> str:
        out = subprocess.run([BOOMERANG, *self.command("migrate")], env={"PATH": "/usr/bin:/bin", **self.env("migrate")},
                             capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def up(self) -> ComposeAsProcesses:
        self.migrate()
        for name in ORDER:
            proc = ServiceProcess(self.command(name), self.env(name), name=name)
            self.procs[name] = proc.start()
            self.addresses[name] = "127.0.0.1:" + proc.address.rpartition(":")[2]
        return self

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.kill()


@pytest.fixture
def compose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ComposeAsProcesses]:
    for name in ("BOOMERANG_AUTH_TOKEN", "BOOMERANG_AUTH_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    with fresh_database() as url:  # the simulated engines' ids are fixed in the compose file
        stack = ComposeAsProcesses(url, tmp_path / "credentials")
        try:
            yield stack.up()
        finally:
            stack.stop()


def test_the_compose_stack_serves_turns_with_every_hop_authenticated(
    compose: ComposeAsProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = compose.addresses["registry"]

    async def list_engines() -> Any:
        async with RegistryClient(registry, timeout=5) as rc:
            return await rc.list_engines(rpb.ListEnginesRequest())

    with pytest.raises(BoomerangClientError) as err:
        asyncio.run(list_engines())
    assert err.value.code == "UNAUTHENTICATED"
    monkeypatch.setenv("BOOMERANG_AUTH_TOKEN_FILE", str(compose.credentials / "service-router.token"))
    listed = asyncio.run(list_engines())
    assert {"sim-prefill-0", "sim-decode-0"} <= {e.engine_id for e in listed.engines}  # registered as themselves

    gateway = "http://" + compose.addresses["gateway"]
    assert httpx.get(gateway + "/health", timeout=5).status_code == 200
    model = next(e.model for e in listed.engines if e.engine_id == "sim-prefill-0")
    messages: list[dict[str, Any]] = []
    texts = user_turns(2)
    messages.append({"role": "user", "content": texts[0]})
    assert chat(gateway, model, "c-compose", messages).status_code == 401  # API keys required
    key = subprocess.run([BOOMERANG, "tenants", "create", "acme"], env={"PATH": "/usr/bin:/bin", **compose.env("gateway")},
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    headers = {"Authorization": f"Bearer {key}"}
    first = chat(gateway, model, "c-compose", messages, headers)
    assert first.status_code == 200, first.text
    messages += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": texts[1]}]
    asyncio.run(wait_lease(registry, "acme", "c-compose"))  # ReportTurn: the router's token at work
    second = chat(gateway, model, "c-compose", messages, headers)
    assert second.headers["x-boomerang-plan"] == "PULL", (second.headers, compose.procs["router"].output())
    # A rerun of the migrate service keeps every token the running services hold.
    assert re.findall(r": (\w+) ", compose.migrate()) == ["kept"] * 5


async def wait_lease(registry: str, tenant: str, conversation: str, timeout: float = 10.0) -> None:
    async with RegistryClient(registry, timeout=5) as rc:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                got = await rc.get_conversation(rpb.GetConversationRequest(tenant=tenant, conversation_id=conversation))
                if got.leases:
                    return
            except BoomerangClientError as err:
                if err.code != "NOT_FOUND":
                    raise
            await asyncio.sleep(0.05)
    raise AssertionError(f"{conversation} never got a lease")
