"""Sticky routing through the real gateway: no router, two prefill engines with their own
prefix cache, `--sticky-prefill`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.gateway_stack import MODEL
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e
NO_DB = {"BOOMERANG_DATABASE_URL": "", "BOOMERANG_LOG_LEVEL": "WARNING"}


@pytest.fixture(scope="module")
def engines() -> Iterator[list[str]]:
    fast = ["--port", "0", "--time-scale", "0.01"]
    sims = [ServiceProcess(["sim", "--role", "prefill", "--prefix-cache-blocks", "10000", *fast], NO_DB),
            ServiceProcess(["sim", "--role", "prefill", "--prefix-cache-blocks", "10000", *fast], NO_DB),
            ServiceProcess(["sim", "--role", "decode", *fast], NO_DB)]
    try:
        for sim in sims:
            sim.start()
        yield [f"http://{sim.address}" for sim in sims]
    finally:
        for sim in sims:
            sim.kill()


def _stats(http: httpx.Client, urls: list[str]) -> list[dict[str, Any]]:
    return [http.get(u + "/sim/stats").json() for u in urls]


def _run(engines: list[str], tag: str, *extra: str) -> list[tuple[int, int]]:
    """Three conversations, three turns each, one turn at a time: for every later turn,
    (the prefill engine that served it, the tokens its prefix cache hit)."""
    p1, p2, d = engines
    gw = ServiceProcess(["gateway", "--listen", "127.0.0.1:0", "--router", "", "--allow-anonymous",
                         "--prefill", p1, "--prefill", p2, "--decode", d, *extra], NO_DB).start()
    seen: list[tuple[int, int]] = []
    try:
        with httpx.Client(timeout=30) as http:
            for c in range(3):
                messages: list[dict[str, Any]] = [
                    {"role": "system", "content": f"Agent {tag} {c}. " + "Read the code first. " * 40},
                    {"role": "user", "content": "Fix the bug."}]
                for t in range(3):
                    before = _stats(http, [p1, p2])
                    resp = http.post(f"http://{gw.address}/v1/chat/completions",
                                     json={"model": MODEL, "messages": messages, "max_tokens": 8},
                                     headers={"X-Conversation-Id": f"{tag}-{c}"})
                    assert resp.status_code == 200, resp.text
                    after = _stats(http, [p1, p2])
                    served = [i for i in (0, 1) if after[i]["requests"] > before[i]["requests"]]
                    assert len(served) == 1
                    hit = after[served[0]]["prefix_cache_hits"] - before[served[0]]["prefix_cache_hits"]
                    if t:
                        seen.append((served[0], hit))
                    messages += [{"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]},
                                 {"role": "user", "content": f"Step {t} done; go on."}]
    finally:
        assert gw.terminate() == 0
    return seen


def test_sticky_prefill_keeps_each_conversation_on_one_engine_and_its_cache(engines: list[str]) -> None:
    seen = _run(engines, "sticky", "--sticky-prefill")
    assert len(seen) == 6 and all(hit > 0 for _, hit in seen)  # every later turn found its history in P's cache
    by_conversation = [{engine for engine, _ in seen[i : i + 2]} for i in (0, 2, 4)]
    assert all(len(engines_used) == 1 for engines_used in by_conversation)
