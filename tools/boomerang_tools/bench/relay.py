"""A TCP relay that delays what a client sends, as a far-away or overloaded peer would.

Every chunk the client sends reaches the server `delay` seconds after it arrived (in order);
the server's answers pass at once. Runs its own event loop on a daemon thread, so
synchronous tests (vLLM's scheduler) can use it; `delay` may change while connections live.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class DelayRelay:
    """Forwards 127.0.0.1:<port> to `upstream`, holding client bytes back `delay` seconds."""

    def __init__(self, upstream: str, delay: float = 0.0):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.delay = delay
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="delay-relay", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> DelayRelay:
        """Listen on a free port (`address` then says where)."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay relay did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        # Stopped: close the listener and every connection's sockets, end their tasks, then
        # the loop (a socket still open when the loop closes is a ResourceWarning).
        self._server.close()
        for writer in self._writers:
            writer.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(asyncio.sleep(0.01))  # the transports' close callbacks
        self._writers.clear()
        self._loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.add(server_w)
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read_client() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await client_r.read(65536):
                    held.put_nowait((time.monotonic() + self.delay, data))
            held.put_nowait((0.0, b""))

        async def write_server() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    due, data = await held.get()
                    if not data:
                        break
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    server_w.write(data)
                    await server_w.drain()
            server_w.close()

        async def answer_client() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await server_r.read(65536):
                    client_w.write(data)
                    await client_w.drain()
            client_w.close()

        await asyncio.gather(read_client(), write_server(), answer_client(), return_exceptions=True)
