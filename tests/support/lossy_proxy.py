"""A TCP proxy for gRPC (HTTP/2) that can lose a response after the server produced it.

Client bytes always reach the server. Server bytes are parsed as HTTP/2 frames: connection
frames (SETTINGS, PING, WINDOW_UPDATE, …) pass, but while `lose_responses` is set the first
HEADERS or DATA frame of any stream is dropped and the connection is cut — the server did
the work, the client never hears of it: exactly a lost response.
"""

from __future__ import annotations

import asyncio
import contextlib

HEADERS, DATA = 0x1, 0x0


class LossyProxy:
    """Forwards 127.0.0.1:<port> to `upstream`; set `lose_responses` to lose answers."""

    def __init__(self, upstream: str):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.lose_responses = False
        self.lost = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        """Listen on a free port; returns HOST:PORT."""
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        """Stop listening."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)

        async def upstream() -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while data := await client_r.read(65536):
                    server_w.write(data)
                    await server_w.drain()

        async def downstream() -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    header = await server_r.readexactly(9)
                    length = int.from_bytes(header[:3], "big")
                    frame_type, stream = header[3], int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
                    payload = await server_r.readexactly(length)
                    if self.lose_responses and stream and frame_type in (HEADERS, DATA):
                        self.lost += 1
                        return  # drop it and cut the connection
                    client_w.write(header + payload)
                    await client_w.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, server_w):
            writer.close()
