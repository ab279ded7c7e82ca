"""A loopback HTTP server that answers recorded price pages, so the real HTTP client code runs.

``serve(handler)`` starts :class:`http.server.ThreadingHTTPServer` on 127.0.0.1 (a free port) in
a thread; ``handler(path, query)`` answers ``(status, headers, body)``; every request's path and
query are recorded. ``{base}`` in a served body is replaced by the server's address (for
``NextPageLink``).
"""

from __future__ import annotations

import http.server
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prices"

Answer = tuple[int, dict[str, str], bytes]
Handler = Callable[[str, dict[str, list[str]]], Answer]


@dataclass
class Server:
    base: str
    requests: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)


def page(name: str, base: str) -> bytes:
    """A recorded page with ``{base}`` filled in."""
    return (FIXTURES / name).read_text().replace("{base}", base).encode()


@contextmanager
def serve(handler: Handler) -> Iterator[Server]:
    server_box: list[Server] = []

    class Handle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parts.query)
            server_box[0].requests.append((parts.path, query))
            status, headers, body = handler(parts.path, query)
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    server_box.append(Server(f"http://127.0.0.1:{httpd.server_address[1]}"))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server_box[0]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def free_port() -> int:
    """A loopback port nothing listens on (for an unreachable endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
