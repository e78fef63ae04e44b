"""The baseline: what vLLM's example multi-turn proxy does, and nothing more.

Like `examples/disaggregated/disaggregated_serving/disagg_proxy_multiturn.py` (see
docs/vllm-contract.md, "The example proxy Boomerang replaces"): takes the top-level `conversation_id` out of the body, pops the
conversation's last decode `kv_transfer_params` from an in-memory dict (single use; entries
older than 450 s are discarded), sends the prefill engine a one-token non-streaming request
with them (or the first-turn form), forwards P's params to the decode engine with
`remote_host` rewritten, streams D's answer to the client, and keeps D's final params for
the next turn. Round-robin engines, no tokenizer, no prefix check, no tenants, no
durability. Served with the gateway's own stack (Starlette, httpx, uvicorn on uvloop), so
the comparison is of what each does, not of web frameworks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import uvicorn
from boomerang_server.sockets import listen_socket
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

FIRST_TURN: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
DISCARD_SECONDS = 450.0


class NaiveProxy:
    """The proxy's state: engines, the HTTP client and the conversation dict."""

    def __init__(self, prefill: list[str], decode: list[str]):
        self.prefill = itertools.cycle(prefill)
        self.decode = itertools.cycle(decode)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0),
                                      limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
        self.kv: dict[str, tuple[float, dict[str, Any]]] = {}

    def take(self, conversation_id: str) -> dict[str, Any] | None:
        """Pop the conversation's handle (single use), unless it is older than 450 s."""
        entry = self.kv.pop(conversation_id, None)
        if entry is None or time.monotonic() - entry[0] > DISCARD_SECONDS:
            return None
        return entry[1]

    async def chat(self, request: Request) -> Response:
        """POST /v1/chat/completions."""
        body = json.loads(await request.body())
        conversation_id = body.pop("conversation_id", None)
        body.pop("kv_transfer_params", None)
        p_url, d_url = next(self.prefill), next(self.decode)
        prefill = dict(body, max_tokens=1, stream=False)
        prefill.pop("stream_options", None)
        prefill["kv_transfer_params"] = (self.take(conversation_id) if conversation_id else None) or dict(FIRST_TURN)
        p_resp = await self.http.post(p_url + "/v1/chat/completions", json=prefill)
        if p_resp.status_code != 200:
            return Response(p_resp.content, status_code=p_resp.status_code, media_type="application/json")
        params = p_resp.json().get("kv_transfer_params")
        if isinstance(params, dict) and params.get("remote_host"):
            params = dict(params, remote_host=httpx.URL(p_url).host)
        # Streamed (the benchmark streams every turn).
        decode = dict(body, kv_transfer_params=params)
        upstream = await self.http.send(self.http.build_request("POST", d_url + "/v1/chat/completions", json=decode),
                                        stream=True)
        return StreamingResponse(self._relay(upstream, conversation_id), status_code=upstream.status_code,
                                 media_type="text/event-stream")

    async def _relay(self, upstream: httpx.Response, conversation_id: str | None) -> AsyncIterator[bytes]:
        try:
            async for line in upstream.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]" and conversation_id:
                    try:
                        chunk = json.loads(line[6:])
                    except ValueError:
                        chunk = None
                    if isinstance(chunk, dict) and isinstance(chunk.get("kv_transfer_params"), dict):
                        self.kv[conversation_id] = (time.monotonic(), chunk["kv_transfer_params"])
                yield (line + "\n").encode()
        finally:
            await upstream.aclose()


def create_app(proxy: NaiveProxy) -> Starlette:
    """The proxy's ASGI app."""

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/v1/chat/completions", proxy.chat, methods=["POST"]),
                             Route("/health", health)])


async def serve(listen: str, prefill: list[str], decode: list[str]) -> None:
    """Serve until SIGTERM; prints BOOMERANG_READY like Boomerang's services."""
    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # handled below, without uvicorn re-raising the signal at exit

    sock = listen_socket(listen, "bench")
    server = _Server(uvicorn.Config(create_app(NaiveProxy(prefill, decode)), lifespan="off",
                                    log_level="warning", access_log=False, timeout_keep_alive=30))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    host, port = sock.getsockname()[:2]
    print(f"BOOMERANG_READY naive-proxy {host}:{port}", flush=True)
    await serving
