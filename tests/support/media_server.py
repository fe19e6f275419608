"""A real HTTP server on a loopback address, in a thread, for the remote-media tests: it serves
bytes, redirects and endless bodies from a route table and logs every request it answers."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


def body(data: bytes, content_type: str = "application/octet-stream") -> Route:
    def send(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return send


def redirect(location: str, status: int = 302) -> Route:
    def send(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return send


def endless(total: int, declare_length: bool = False) -> Route:
    """`total` bytes of zeros, with no Content-Length (so only reading them shows the size) unless
    asked; a client that stops early just breaks the pipe."""

    def send(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        if declare_length:
            handler.send_header("Content-Length", str(total))
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = bytes(64 * 1024)
        try:
            for _ in range(total // len(chunk)):
                handler.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass

    return send


@dataclass
class MediaServer:
    host: str
    port: int
    routes: dict[str, Route]
    scheme: str = "http"
    requests: list[str] = field(default_factory=list)

    def url(self, path: str, host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.host}:{self.port}{path}"


@contextmanager
def media_server(
    host: str = "127.0.0.1", routes: dict[str, Route] | None = None, tls: ssl.SSLContext | None = None
) -> Iterator[MediaServer]:
    """A running server on `host` (a free port), https with `tls`; `routes` may be filled in
    after it starts."""
    served = MediaServer(host, 0, routes if routes is not None else {}, "https" if tls else "http")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests.append(self.path)
            route = served.routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            route(self)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    served.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
