"""The gateway on its own: static engines, no router, no database — anonymous only when asked,
and a SIGTERM drains without cutting a stream short."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.gateway_stack import BOOMERANG, MODEL
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e
NO_DB = {"BOOMERANG_DATABASE_URL": "", "BOOMERANG_LOG_LEVEL": "WARNING"}


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[str, str]]:
    sims = [ServiceProcess(["sim", "--role", role, "--port", "0", "--time-scale", "1"], NO_DB) for role in
            ("prefill", "decode")]
    try:
        for sim in sims:
            sim.start()
        yield f"http://{sims[0].address}", f"http://{sims[1].address}"
    finally:
        for sim in sims:
            sim.kill()


def gateway(engines: tuple[str, str], *extra: str, drain: str = "0") -> ServiceProcess:
    return ServiceProcess(["gateway", "--listen", "127.0.0.1:0", "--router", "", "--prefill", engines[0],
                           "--decode", engines[1], *extra],
                          {**NO_DB, "BOOMERANG_DRAIN_DELAY_SECONDS": drain, "BOOMERANG_GRACE_SECONDS": "10"})


def test_without_keys_or_anonymous_it_refuses_to_start(engines: tuple[str, str]) -> None:
    out = subprocess.run([BOOMERANG, "gateway", "--listen", "127.0.0.1:0", "--prefill", engines[0], "--decode",
                          engines[1]], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **NO_DB})
    assert out.returncode != 0 and "--allow-anonymous" in out.stderr and "BOOMERANG_DATABASE_URL" in out.stderr


async def test_anonymous_requests_are_served_but_a_wrong_key_is_not(engines: tuple[str, str]) -> None:
    gw = gateway(engines, "--allow-anonymous").start()
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
                "conversation_id": "anon-1"}
        async with httpx.AsyncClient(base_url=f"http://{gw.address}", timeout=30) as http:
            for headers in ({}, {"Authorization": "Bearer EMPTY"}):
                resp = await http.post("/v1/chat/completions", json=body, headers=headers)
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-boomerang-plan"] == "RECOMPUTE"
                assert resp.headers["x-boomerang-reason"] == "ROUTER_NOT_CONFIGURED"
            wrong = await http.post("/v1/chat/completions", json=body,
                                    headers={"Authorization": "Bearer bmr_0123456789ab_" + "x" * 43})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
            models = (await http.get("/v1/models")).json()
            assert [m["id"] for m in models["data"]] == [MODEL]
    finally:
        assert gw.terminate() == 0


async def test_sigterm_drains_a_stream_in_flight(engines: tuple[str, str]) -> None:
    # Draining lasts 5 s: the probe below lands inside it however long a busy host holds this
    # test's loop (with 0.5 s, one run saw the listener already closed).
    gw = gateway(engines, "--allow-anonymous", drain="5").start()
    url = f"http://{gw.address}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me everything"}], "max_tokens": 120,
            "ignore_eos": True, "stream": True}
    try:
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("POST", url + "/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            first = await anext(lines)
            assert first.startswith("data: {")
            gw.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            await asyncio.sleep(0.1)
            async with httpx.AsyncClient(timeout=5) as probe:
                assert (await probe.get(url + "/health")).status_code == 503  # draining, still answering
            rest = [line async for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        texts = [json.loads(line[6:]) for line in rest[:-1]]
        assert sum(1 for c in texts if c["choices"] and c["choices"][0]["delta"].get("content")) >= 100
        assert gw.proc.wait(timeout=30) == 0  # type: ignore[union-attr]
    finally:
        gw.kill()


async def test_a_client_that_leaves_mid_stream_aborts_the_decode_request(engines: tuple[str, str]) -> None:
    gw = gateway(engines, "--allow-anonymous").start()
    decode_stats = engines[1] + "/sim/stats"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go on"}], "max_tokens": 300,
            "ignore_eos": True, "stream": True}
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            before = (await http.get(decode_stats)).json()
            async with http.stream("POST", f"http://{gw.address}/v1/chat/completions", json=body) as resp:
                lines = resp.aiter_lines()
                for _ in range(6):
                    await anext(lines)
            # The client is gone: the gateway must close D's stream, and D (as vLLM) aborts
            # the request and retains nothing for it.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                after = (await http.get(decode_stats)).json()
                if after["aborted"] > before["aborted"]:
                    break
                await asyncio.sleep(0.1)
            assert after["aborted"] == before["aborted"] + 1
            assert after["retained_turns"] == before["retained_turns"]
            assert after["in_flight"] == 0
    finally:
        gw.kill()


def test_beyond_loopback_anonymous_needs_the_development_setting(engines: tuple[str, str]) -> None:
    args = [BOOMERANG, "gateway", "--listen", "0.0.0.0:0", "--router", "", "--prefill", engines[0], "--decode",
            engines[1], "--allow-anonymous"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **NO_DB},
                         check=False)
    assert out.returncode != 0 and "beyond loopback" in out.stderr and "BOOMERANG_INSECURE_ALLOW_ANONYMOUS" in out.stderr
    gw = ServiceProcess(args[1:], {**NO_DB, "BOOMERANG_INSECURE_ALLOW_ANONYMOUS": "true"}).start()
    try:
        assert any("INSECURE" in line for line in gw.lines), gw.output()
        port = gw.address.rpartition(":")[2]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
        assert resp.status_code == 200, resp.text
    finally:
        gw.kill()
