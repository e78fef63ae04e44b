"""The gateway under bad input: OpenAI-style errors with 400/401/404/413, never a 500.

Hand-picked cases first, then hypothesis-generated bodies of every JSON shape for the
chat and completions endpoints.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway_stack import BOOMERANG, MODEL
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e
NO_DB = {"BOOMERANG_DATABASE_URL": "", "BOOMERANG_LOG_LEVEL": "WARNING"}
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[str, str]]:
    sims = [ServiceProcess(["sim", "--role", role, "--port", "0", "--time-scale", "0"], NO_DB)
            for role in ("prefill", "decode")]
    try:
        for sim in sims:
            sim.start()
        yield f"http://{sims[0].address}", f"http://{sims[1].address}"
    finally:
        for sim in sims:
            sim.kill()


@pytest.fixture(scope="module")
def anonymous(engines: tuple[str, str]) -> Iterator[str]:
    gw = ServiceProcess(["gateway", "--listen", "127.0.0.1:0", "--router", "", "--prefill", engines[0],
                         "--decode", engines[1], "--allow-anonymous", "--max-body-bytes", str(MAX_BODY)], NO_DB).start()
    yield f"http://{gw.address}"
    gw.kill()


@pytest.fixture(scope="module")
def keyed(engines: tuple[str, str], database_url: str) -> Iterator[tuple[str, str]]:
    env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_LOG_LEVEL": "WARNING"}
    out = subprocess.run([BOOMERANG, "tenants", "create", "bad-input-tenant"], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 0, out.stderr
    gw = ServiceProcess(["gateway", "--listen", "127.0.0.1:0", "--router", "", "--prefill", engines[0],
                         "--decode", engines[1]], env).start()
    yield f"http://{gw.address}", out.stdout.strip()
    gw.kill()


def assert_openai_error(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    error = resp.json()["error"]
    assert error["message"] and error["type"], error


GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{not json", 400),
        (b"[1, 2, 3]", 400),
        (json.dumps({**GOOD, "messages": "hello"}).encode(), 400),
        (json.dumps({**GOOD, "messages": [{"role": 7}]}).encode(), 400),
        (json.dumps({**GOOD, "max_tokens": -5}).encode(), 400),
        (json.dumps({**GOOD, "max_tokens": "many"}).encode(), 400),
        (json.dumps({**GOOD, "stream": "yes"}).encode(), 400),
        (json.dumps({k: v for k, v in GOOD.items() if k != "model"}).encode(), 400),
        (json.dumps({**GOOD, "model": "no-such-model"}).encode(), 404),
        (json.dumps({**GOOD, "conversation_id": 12}).encode(), 400),
        (json.dumps({**GOOD, "conversation_id": "c" * 10_000}).encode(), 400),
        (json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}).encode(), 413),
    ],
)
def test_malformed_requests_get_openai_errors(anonymous: str, body: bytes, status: int) -> None:
    resp = httpx.post(anonymous + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"},
                      timeout=30)
    assert_openai_error(resp, status)


def test_missing_or_bad_keys_are_401(keyed: tuple[str, str]) -> None:
    url, key = keyed
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}, {"Authorization": f"Bearer {key}x"}):
        assert_openai_error(httpx.post(url + "/v1/chat/completions", json=GOOD, headers=headers, timeout=30), 401)
    ok = httpx.post(url + "/v1/chat/completions", json=GOOD, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert ok.status_code == 200, ok.text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just(MODEL), json_values),
        "messages": st.one_of(
            st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
                                           optional={"content": json_values}), max_size=3),
            json_values,
        ),
        "prompt": json_values,
        "max_tokens": st.one_of(st.integers(-3, 40), json_values),
        "stream": json_values,
        "conversation_id": json_values,
        "prompt_cache_key": json_values,
        "kv_transfer_params": json_values,
        "temperature": json_values,
        "return_token_ids": json_values,
    },
)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_random_bodies_never_get_a_server_error(anonymous: str, path: str) -> None:
    with httpx.Client(base_url=anonymous, timeout=30) as http:

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(body=bodies)
        def check(body: dict) -> None:  # type: ignore[type-arg]
            resp = http.post(path, json=body)
            assert resp.status_code < 500, (resp.status_code, resp.text, body)
            if resp.status_code != 200:
                assert resp.status_code in (400, 404, 413, 422), (resp.status_code, resp.text, body)
                assert "error" in resp.json()

        check()


def test_a_tenant_over_its_rate_gets_429_and_others_do_not(engines: tuple[str, str], database_url: str) -> None:
    env = {"BOOMERANG_DATABASE_URL": database_url, "BOOMERANG_LOG_LEVEL": "WARNING"}
    keys = []
    for name in ("rate-noisy", "rate-quiet"):
        out = subprocess.run([BOOMERANG, "tenants", "create", name], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", **env})
        assert out.returncode == 0, out.stderr
        keys.append(out.stdout.strip())
    gw = ServiceProcess(["gateway", "--listen", "127.0.0.1:0", "--router", "", "--prefill", engines[0], "--decode",
                         engines[1], "--tenant-requests-per-second", "0.001", "--tenant-burst", "3"], env).start()
    try:
        url = f"http://{gw.address}/v1/chat/completions"
        # One token a thousand seconds: none comes back while the five requests run, however slow the host.
        noisy = [httpx.post(url, json=GOOD, headers={"Authorization": f"Bearer {keys[0]}"}, timeout=30) for _ in range(5)]
        assert [r.status_code for r in noisy] == [200, 200, 200, 429, 429]
        assert_openai_error(noisy[-1], 429)
        assert noisy[-1].json()["error"]["type"] == "rate_limit_error"
        assert int(noisy[-1].headers["retry-after"]) >= 1
        quiet = httpx.post(url, json=GOOD, headers={"Authorization": f"Bearer {keys[1]}"}, timeout=30)
        assert quiet.status_code == 200
    finally:
        gw.kill()
