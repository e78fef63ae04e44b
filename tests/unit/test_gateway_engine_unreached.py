"""An engine that never answers the connection (SIGSTOPped, its backlog full) saw nothing, like one
that refuses it: the gateway sends the turn's decode to another engine instead of failing it."""

from __future__ import annotations

import json

import httpx2 as httpx
from boomerang_gateway.engine_routing import EngineCalls, EngineRef
from boomerang_gateway.metrics import GatewayMetrics
from boomerang_gateway.protocol import Kind, parse


class Pool:
    """The two methods EngineCalls uses, over a fixed list of engines."""

    def __init__(self, engines: list[EngineRef]):
        self.engines = engines
        self.down: list[str] = []

    def mark_down(self, url: str, seconds: float = 5.0) -> None:
        self.down.append(url)

    def choose(self, role: str, model: str, avoid: set[str] | None = None, key: str = "") -> EngineRef | None:
        return next((e for e in self.engines if e.url not in (avoid or set())), None)


async def test_a_decode_engine_that_never_answers_the_connection_is_replaced() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "stopped":
            raise httpx.ConnectTimeout("no answer to the connection", request=request)
        return httpx.Response(200, text="data: [DONE]\n\n")

    stopped, live = EngineRef("http://stopped:1", "decode"), EngineRef("http://live:1", "decode")
    pool = Pool([stopped, live])
    req = parse(Kind.CHAT, json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(), None)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        calls = EngineCalls(http, pool, GatewayMetrics())  # type: ignore[arg-type]
        resp, engine = await calls.open_decode(req, None, stopped, "rid")
        await resp.aclose()
    assert engine is live and resp.status_code == 200
    assert pool.down == ["http://stopped:1"]
