"""Identity from the authenticated channel: bearer tokens and mutual TLS."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from boomerang.clients.base import BoomerangClientError
from boomerang.clients.registry import RegistryClient
from boomerang.v1 import registry_service_pb2 as rpb

from tests.support.certs import issue, make_ca
from tests.support.procs import BOOMERANG, ServiceProcess
from tests.support.registry_data import blocks_request, claim_request, engine_request

pytestmark = pytest.mark.e2e


def create_token(database_url: str, principal: str) -> str:
    out = subprocess.run([BOOMERANG, "credentials", "create", principal, "--database-url", database_url],
                         capture_output=True, text=True, check=True)
    name, token = out.stdout.splitlines()[0].split()
    assert name == principal and token.startswith("bmr_")
    return token


@pytest.fixture(scope="module")
def secured(database_url: str) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(
        ["registry", "--listen", "127.0.0.1:0"],
        {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"},
    ).start()
    yield proc
    proc.kill()


async def call_as(monkeypatch: pytest.MonkeyPatch, address: str, token: str, coro_fn):  # type: ignore[no-untyped-def]
    if token:
        monkeypatch.setenv("BOOMERANG_AUTH_TOKEN", token)
    else:
        monkeypatch.delenv("BOOMERANG_AUTH_TOKEN", raising=False)
    async with RegistryClient(address) as client:
        return await coro_fn(client)


async def test_tokens_bind_engines_to_themselves(secured: ServiceProcess, database_url: str, unique: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    engine_a, engine_b = f"a-{unique}", f"b-{unique}"
    token_a = create_token(database_url, f"engine:{engine_a}")
    service = create_token(database_url, "service:gateway")
    with pytest.raises(BoomerangClientError) as err:
        await call_as(monkeypatch, secured.address, "", lambda c: c.register_engine(engine_request(engine_a)))
    assert err.value.code == "UNAUTHENTICATED" and err.value.reason == "NO_CREDENTIALS"
    with pytest.raises(BoomerangClientError) as err:
        await call_as(monkeypatch, secured.address, "bmr_forged", lambda c: c.register_engine(engine_request(engine_a)))
    assert err.value.reason == "BAD_TOKEN"
    await call_as(monkeypatch, secured.address, token_a, lambda c: c.register_engine(engine_request(engine_a)))
    with pytest.raises(BoomerangClientError) as err:
        await call_as(monkeypatch, secured.address, token_a, lambda c: c.register_engine(engine_request(engine_b)))
    assert err.value.code == "PERMISSION_DENIED" and err.value.reason == "ENGINE_MISMATCH"
    tokens = list(range(300))
    with pytest.raises(BoomerangClientError) as err:
        await call_as(monkeypatch, secured.address, token_a, lambda c: c.claim_reuse(claim_request("t", unique, tokens)))
    assert err.value.reason == "SERVICE_ONLY"
    await call_as(monkeypatch, secured.address, token_a,
                  lambda c: c.register_retained_blocks(blocks_request("t", unique, engine_a, tokens)))
    claim = await call_as(monkeypatch, secured.address, service, lambda c: c.claim_reuse(claim_request("t", unique, tokens + [1])))
    assert claim.outcome == rpb.CLAIM_OUTCOME_CLAIMED
    # A batch of registrations is the engine's own too: one for another engine refuses it whole.
    mixed = rpb.RegisterRetainedBlocksBatchRequest(registrations=[
        blocks_request("t", unique + "-2", engine_a, tokens), blocks_request("t", unique + "-3", engine_b, tokens)])
    with pytest.raises(BoomerangClientError) as err:
        await call_as(monkeypatch, secured.address, token_a, lambda c: c.register_retained_blocks_batch(mixed))
    assert err.value.code == "PERMISSION_DENIED" and err.value.reason == "ENGINE_MISMATCH"
    own = rpb.RegisterRetainedBlocksBatchRequest(registrations=[blocks_request("t", unique + "-2", engine_a, tokens)])
    done = await call_as(monkeypatch, secured.address, token_a, lambda c: c.register_retained_blocks_batch(own))
    assert done.results[0].error_code == 0 and done.results[0].response.created


async def test_revoked_token_is_refused(secured: ServiceProcess, database_url: str, unique: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    token = create_token(database_url, f"service:ops-{unique}")
    await call_as(monkeypatch, secured.address, token, lambda c: c.list_engines(rpb.ListEnginesRequest()))
    subprocess.run([BOOMERANG, "credentials", "revoke", f"service:ops-{unique}", "--database-url", database_url], check=True,
                   capture_output=True)
    # A fresh registry process has no cache: the revoked token is refused at once.
    fresh = ServiceProcess(["registry", "--listen", "127.0.0.1:0"],
                           {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true"}).start()
    try:
        with pytest.raises(BoomerangClientError) as err:
            await call_as(monkeypatch, fresh.address, token, lambda c: c.list_engines(rpb.ListEnginesRequest()))
        assert err.value.reason == "BAD_TOKEN"
    finally:
        fresh.kill()


async def test_mutual_tls_identity_comes_from_the_certificate(database_url: str, unique: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ca = make_ca(tmp_path)
    server_cert, server_key = issue(tmp_path, "server", "service:registry")
    engine_cert, engine_key = issue(tmp_path, "engine", f"engine:d-{unique}")
    proc = ServiceProcess(
        ["registry", "--listen", "127.0.0.1:0"],
        {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_REQUIRE_AUTH": "true",
         "BOOMERANG_TLS_CERT_FILE": str(server_cert), "BOOMERANG_TLS_KEY_FILE": str(server_key),
         "BOOMERANG_TLS_CA_FILE": str(ca)},
    ).start()
    try:
        monkeypatch.delenv("BOOMERANG_AUTH_TOKEN", raising=False)
        monkeypatch.setenv("BOOMERANG_TLS_CA_FILE", str(ca))
        monkeypatch.setenv("BOOMERANG_TLS_CERT_FILE", str(engine_cert))
        monkeypatch.setenv("BOOMERANG_TLS_KEY_FILE", str(engine_key))
        async with RegistryClient(proc.address) as client:
            await client.register_engine(engine_request(f"d-{unique}"))
            with pytest.raises(BoomerangClientError) as err:
                await client.register_engine(engine_request(f"other-{unique}"))
            assert err.value.reason == "ENGINE_MISMATCH"
        # Without a client certificate the TLS handshake itself fails.
        monkeypatch.delenv("BOOMERANG_TLS_CERT_FILE")
        monkeypatch.delenv("BOOMERANG_TLS_KEY_FILE")
        async with RegistryClient(proc.address, timeout=3) as client:
            with pytest.raises(BoomerangClientError) as err:
                await client.list_engines(rpb.ListEnginesRequest())
            assert err.value.code == "UNAVAILABLE"
    finally:
        proc.kill()


async def test_an_engine_may_watch_the_lease_keys_and_nobody_anonymous(secured: ServiceProcess, database_url: str,
                                                                      unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill hook watches the live-lease summary as its engine (hashes only); without
    credentials the stream is refused."""
    token = create_token(database_url, f"engine:p-{unique}")

    async def first(client: RegistryClient) -> rpb.WatchLeaseKeysResponse:
        async for message in client.watch_lease_keys(f"p-{unique}"):
            return message
        raise AssertionError("the stream ended without a message")

    message = await call_as(monkeypatch, secured.address, token, first)
    assert message.snapshot and len(message.keys) % 8 == 0
    with pytest.raises(BoomerangClientError) as err:
        await call_as(monkeypatch, secured.address, "", first)
    assert err.value.code == "UNAUTHENTICATED"
