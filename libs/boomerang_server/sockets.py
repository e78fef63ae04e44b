"""The listening socket of an HTTP server Boomerang runs itself (the gateway, the simulated engines)."""

from __future__ import annotations

import socket


def listen_socket(address: str, command: str, backlog: int = 2048) -> socket.socket:
    """A non-blocking listening TCP socket on HOST:PORT (port 0: a free one; `[::1]:80` for IPv6).

    Bound here, before the server starts, so the caller knows the port (and can announce it)
    and a port in use stops `boomerang <command>` with one line instead of a traceback.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # A restarted server may bind while the old one's connections sit in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"boomerang {command}: cannot listen on {address}: {exc.strerror}") from None
    sock.listen(backlog)
    sock.setblocking(False)
    return sock
