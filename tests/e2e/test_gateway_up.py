"""`boomerang up --sim 1x1`: everything comes up, prints its endpoints, serves a conversation
that reuses KV from its second turn, and Ctrl-C stops every child cleanly."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.databases import fresh_database
from tests.support.gateway_stack import MODEL
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e


def test_up_serves_and_stops_cleanly(tmp_path: Path) -> None:
    with fresh_database() as database_url:
        _up(database_url, tmp_path)


def _up(database_url: str, tmp_path: Path) -> None:
    up = ServiceProcess(["up", "--sim", "1x1", "--free-ports", "--database-url", database_url, "--time-scale", "0",
                         "--data-dir", str(tmp_path / ".boomerang")], {"BOOMERANG_DB_POOL_SIZE": "3"}, name="up")
    up.start(timeout=120)
    try:
        printed = up.output()
        endpoints = dict(re.findall(r"^\s+(postgres|registry|prefill|decode|router|reaper|gateway)\s+(\S+)", printed, re.MULTILINE))
        assert set(endpoints) == {"postgres", "registry", "prefill", "decode", "router", "reaper", "gateway"}, printed
        gateway = endpoints["gateway"].removesuffix("/v1")
        assert gateway == f"http://{up.address}"
        messages = [{"role": "system", "content": "Be terse. " * 80}, {"role": "user", "content": "hi"}]
        plans = []
        with httpx.Client(timeout=30) as http:
            for turn in range(2):
                resp = http.post(gateway + "/v1/chat/completions",  # anonymous is on by default here
                                 json={"model": MODEL, "messages": messages, "conversation_id": "up-1", "max_tokens": 8})
                assert resp.status_code == 200, resp.text
                plans.append(resp.headers["x-boomerang-plan"])
                messages += [{"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": f"and then {turn}?"}]
        assert plans == ["COLD", "PULL"]
        # The gateway tokenized in-process with the simulator's model files, as the bench's
        # gateway does (BOOMERANG_TOKENIZERS set by `up`), never on P's /tokenize: the second
        # prompt, and the first unless the live-lease summary had already ruled it out (then it
        # started with no tokenize at all).
        metrics = httpx.get(gateway + "/metrics", timeout=5).text
        assert re.search(r'^boomerang_gateway_local_tokenize_total\{outcome="local"\} [12]\.0$', metrics, re.MULTILINE), \
            [line for line in metrics.splitlines() if "local_tokenize" in line]
        assert up.proc is not None
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=60) == 0
        for name in ("gateway", "prefill", "decode"):
            with pytest.raises(httpx.ConnectError):
                httpx.get(endpoints[name].removesuffix("/v1") + "/health", timeout=2)
        logs = {p.stem: p.read_text() for p in (tmp_path / ".boomerang" / "logs").glob("*.log")}
        assert "gateway stopped" in logs["gateway"] and "registry stopped" in logs["registry"]
    finally:
        up.kill()
