"""The simulator's HTTP surface (Starlette): vLLM's OpenAI API and the NIXL side channel.

One process listens on two ports: the API port (`/v1/chat/completions`, `/v1/completions`,
`/v1/models`, `/health`, `/tokenize`, `/version`, and the simulator's own `/sim/stats`,
`/sim/restart`, `/sim/reset-stats`) and the side-channel port that other engines reach at
`remote_host:remote_port` (`/sim/nixl/*`, see `nixl.py`). `make_app` routes by the local
port a connection arrived on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from boomerang_tools.sim import protocol
from boomerang_tools.sim.costmodel import Link
from boomerang_tools.sim.engine import Engine, GenRequest, Token
from boomerang_tools.sim.kvstore import ReadError
from boomerang_tools.sim.nixl import Mode, first_group

log = logging.getLogger(__name__)
VERSION = "0.33.0"


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(status, message, kind, param), status_code=status)


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise protocol.ProtocolError(400, "The request body is not valid JSON.") from None


def _sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(work: asyncio.Future[Any], receive: Receive) -> None:
    """Wait for `work`, cancelling it if the client disconnects first (vLLM aborts the request)."""
    watcher = asyncio.ensure_future(_until_disconnected(receive))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await work


class EventStream(Response):
    """An SSE response that aborts its producer as soon as the client disconnects.

    Starlette's StreamingResponse notices a disconnect only at the next write; vLLM aborts
    the request at once, and an aborted request must retain nothing, so this response
    watches for `http.disconnect` while it writes and closes the producer either way.
    """

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]):
        # Not Response.__init__: with no body, no content-length header is written.
        self.status_code = 200
        self.background = None
        self.chunks = chunks
        self.on_close = on_close
        self.init_headers({"cache-control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def pump() -> None:
            async with contextlib.aclosing(self.chunks):  # type: ignore[type-var]
                async for chunk in self.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await _unless_disconnected(asyncio.ensure_future(pump()), receive)
        finally:
            self.on_close()


class Api:
    """Handlers bound to one engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.config = engine.config

    async def chat(self, request: Request) -> Response:
        """POST /v1/chat/completions."""
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        """POST /v1/completions."""
        return await self._generate(request, "completion")

    async def _generate(self, request: Request, kind: str) -> Response:
        cfg = self.config
        loop = asyncio.get_running_loop()
        # The modelled time counts from here (the request's arrival), plus what Boomerang's
        # hook holds it for: parsing and tokenizing are the simulator's own work, inside it.
        started = loop.time()
        request_id = ""
        try:
            body = await _json(request)
            if kind == "chat":
                parsed = protocol.parse_chat(body, cfg.served_model_name, cfg.strip_reasoning)
            else:
                parsed = protocol.parse_completion(body, cfg.served_model_name)
            n = len(parsed.prompt_ids)
            max_tokens = parsed.max_tokens if parsed.max_tokens is not None else max(1, cfg.max_model_len - n)
            req = GenRequest(
                prompt_ids=parsed.prompt_ids,
                max_tokens=max_tokens,
                eos=protocol.EOS_CHAT if kind == "chat" else protocol.EOS_COMPLETION,
                reasoning=kind == "chat" and cfg.strip_reasoning,
                ignore_eos=parsed.ignore_eos,
                min_tokens=parsed.min_tokens,
                kv_transfer_params=parsed.kv_transfer_params,
            )
            # vLLM takes the proxy's X-Request-Id so P and D can be correlated.
            base = request.headers.get("x-request-id") or uuid.uuid4().hex
            request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{base}"
            if self.engine.hook is not None:
                held = loop.time()
                req = await self.engine.hook.before_admit(req, request_id)
                started += loop.time() - held
            admission = self.engine.admit(req, request_id, started)
        except protocol.ProtocolError as exc:  # malformed, or refused once the hook had seen it
            if self.engine.hook is not None and request_id:
                self.engine.hook.aborted(request_id)
            return _error(exc.status, str(exc), exc.kind, exc.param)
        if self.engine.hook is not None:
            remote = admission.remote if admission.mode is Mode.PULL else None
            held = loop.time()
            await self.engine.hook.allocated(request_id, (remote.num_tokens or 0) if remote is not None else 0)
            admission.started += loop.time() - held
        builder = protocol.ResponseBuilder(parsed, request_id, cfg.enable_prompt_tokens_details)
        tokens = self.engine.run(admission)
        if parsed.stream:
            return EventStream(self._stream(builder, tokens, parsed.include_usage),
                               on_close=lambda: self.engine.discard(admission))
        try:
            return await self._complete(request, builder, tokens)
        finally:
            self.engine.discard(admission)

    async def _complete(self, request: Request, builder: protocol.ResponseBuilder, tokens: AsyncIterator[Token]) -> Response:
        """Non-streaming: collect the whole output, aborting if the client goes away."""

        async def collect() -> list[Token]:
            async with contextlib.aclosing(tokens):  # type: ignore[type-var]
                return [t async for t in tokens]

        work = asyncio.ensure_future(collect())
        await _unless_disconnected(work, request.receive)
        if work.cancelled():
            return Response(status_code=499)
        out = work.result()
        finish = out[-1].finish
        assert finish is not None
        text = "".join(t.text for t in out)
        builder.cached_tokens = finish.cached_tokens
        return JSONResponse(builder.full(text, [t.id for t in out], finish.reason, finish.kv_transfer_params))

    async def _stream(
        self, builder: protocol.ResponseBuilder, tokens: AsyncIterator[Token], include_usage: bool
    ) -> AsyncIterator[bytes]:
        count = 0
        async with contextlib.aclosing(tokens):  # type: ignore[type-var]
            async for t in tokens:
                count += 1
                fin = t.finish
                if fin is not None:
                    builder.cached_tokens = fin.cached_tokens
                for chunk in builder.chunks(t.text, t.id, fin.reason if fin else None, fin.kv_transfer_params if fin else None):
                    yield _sse(chunk)
        if include_usage:
            yield _sse(builder.usage_chunk(count))
        yield _sse("[DONE]")

    async def tokenize(self, request: Request) -> Response:
        """POST /tokenize: `{"messages", "add_generation_prompt"}` or `{"prompt"}`."""
        cfg = self.config
        self.engine.stats.tokenize_requests += 1
        try:
            body = await _json(request)
            protocol.served_model(body, cfg.served_model_name)
            if "messages" in body:
                ids = protocol.chat_prompt_ids(body, cfg.strip_reasoning)
            else:
                ids = protocol.completion_prompt_ids(body)
        except protocol.ProtocolError as exc:
            return _error(exc.status, str(exc), exc.kind, exc.param)
        return JSONResponse({"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids, "token_strs": None})

    async def models(self, request: Request) -> Response:
        """GET /v1/models."""
        name = self.config.served_model_name
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": name, "parent": None,
                "max_model_len": self.config.max_model_len, "permission": []}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        """GET /health: 200 with an empty body, as vLLM."""
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        """GET /version."""
        return JSONResponse({"version": VERSION})

    async def stats(self, request: Request) -> Response:
        """GET /sim/stats."""
        return JSONResponse(self.engine.snapshot())

    async def restart(self, request: Request) -> Response:
        """POST /sim/restart: bump the registration generation and drop every block."""
        dropped = self.engine.restart()
        return JSONResponse({"registration_generation": self.engine.generation, "dropped_handles": dropped})

    async def link(self, request: Request) -> Response:
        """POST /sim/link `{"gbps", "fixed_ms"?, "remote_engine_id"?}`: the link this engine
        pulls from that decode engine over (without an id: from every other), from now on."""
        try:
            body = await _json(request)
            if not isinstance(body, dict):
                raise protocol.ProtocolError(400, "The request body must be a JSON object.")
            remote = body.get("remote_engine_id")
            if remote is not None and (not isinstance(remote, str) or not remote):
                raise protocol.ProtocolError(400, "remote_engine_id: must be a non-empty string", param="remote_engine_id")
            gbps, fixed = body.get("gbps"), body.get("fixed_ms", 0.0)
            for name, value in (("gbps", gbps), ("fixed_ms", fixed)):
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise protocol.ProtocolError(400, f"{name}: must be a number", param=name)
            link = Link(float(gbps), float(fixed))  # type: ignore[arg-type]
        except protocol.ProtocolError as exc:
            return _error(exc.status, str(exc), exc.kind, exc.param)
        except ValueError as exc:
            return _error(400, f"{exc}: gbps must be > 0 and fixed_ms >= 0", param="gbps")
        self.engine.set_link(link, remote)
        return JSONResponse({"remote_engine_id": remote, "gbps": link.gbps, "fixed_ms": link.fixed_ms})

    async def reset_stats(self, request: Request) -> Response:
        """POST /sim/reset-stats."""
        self.engine.reset_stats()
        return JSONResponse({})

    # -- side channel ----------------------------------------------------------------------

    async def nixl_clock(self, request: Request) -> Response:
        """GET /sim/nixl/clock: the handshake."""
        e = self.engine
        return JSONResponse({"engine_id": self.config.engine_id, "registration_generation": e.generation,
                             "perf_counter": e.clock.now()})

    async def nixl_read(self, request: Request) -> Response:
        """POST /sim/nixl/read: serve one read and free the handle."""
        try:
            body = await _json(request)
            rid, count, gen = body["request_id"], int(body["num_tokens"]), body.get("registration_generation")
            blocks = first_group(body["block_ids"])
        except (protocol.ProtocolError, KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"reason": "BAD_REQUEST", "message": str(exc)}, status_code=400)
        wanted = body.get("engine_id")
        if wanted and wanted != self.config.engine_id:
            return JSONResponse({"reason": "ENGINE_MISMATCH", "message": f"this is engine {self.config.engine_id!r}, "
                                 f"not {wanted!r}"}, status_code=409)
        try:
            tokens = self.engine.serve_read(str(rid), blocks, count, None if gen is None else int(gen))
        except ReadError as exc:
            return JSONResponse({"reason": exc.reason, "message": str(exc)}, status_code=410)
        return JSONResponse({"tokens": tokens, "block_size": self.config.block_size})

    async def nixl_free(self, request: Request) -> Response:
        """POST /sim/nixl/free: free a handle unread."""
        try:
            body = await _json(request)
            rid = str(body["request_id"])
        except (protocol.ProtocolError, KeyError, TypeError) as exc:
            return JSONResponse({"reason": "BAD_REQUEST", "message": str(exc)}, status_code=400)
        return JSONResponse({"freed": self.engine.serve_free(rid)})


def make_app(engine: Engine, api_port_holder: dict[str, int]) -> ASGIApp:
    """One ASGI app that serves the API or the side channel by the local port."""
    api = Api(engine)
    main = Starlette(routes=[
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/version", api.version, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/sim/stats", api.stats, methods=["GET"]),
        Route("/sim/restart", api.restart, methods=["POST"]),
        Route("/sim/reset-stats", api.reset_stats, methods=["POST"]),
        Route("/sim/link", api.link, methods=["POST"]),
    ])
    side = Starlette(routes=[
        Route("/sim/nixl/clock", api.nixl_clock, methods=["GET"]),
        Route("/sim/nixl/read", api.nixl_read, methods=["POST"]),
        Route("/sim/nixl/free", api.nixl_free, methods=["POST"]),
    ])

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") or ("", 0)
        target = side if server[1] == api_port_holder.get("side") else main
        await target(scope, receive, send)

    return dispatch
