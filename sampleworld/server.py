"""Loopback HTTP file server for the sample world, with planted routes for failure tests."""

from __future__ import annotations

import threading
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Callable, Union
from urllib.parse import unquote, urlsplit

# A planted response: (status, content type, body), or a callable taking the request path
# and returning one (it may sleep first to simulate a slow host).
Response = tuple[int, str, bytes]
Route = Union[Response, Callable[[str], Response]]


class _Handler(SimpleHTTPRequestHandler):
    """Static files under the root; planted routes first; no per-request logging."""

    server: "_Server"

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: img2dataset makes thousands of requests

    def _planted(self) -> Response | None:
        routes = self.server.routes
        if not routes:
            return None
        path = urlsplit(self.path).path
        for key in (self.path, path, unquote(path)):
            if key in routes:
                route = routes[key]
                return route(self.path) if callable(route) else route
        return None

    def _send_planted(self, resp: Response, with_body: bool) -> None:
        status, content_type, body = resp
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        resp = self._planted()
        if resp is not None:
            self._send_planted(resp, with_body=True)
        else:
            super().do_GET()

    def do_HEAD(self) -> None:
        resp = self._planted()
        if resp is not None:
            self._send_planted(resp, with_body=False)
        else:
            super().do_HEAD()

    def list_directory(self, path: str | Path):  # type: ignore[override]
        # Serve files only; a listing is no use to a downloader and hides 404s.
        self.send_error(HTTPStatus.NOT_FOUND, "File not found")
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Listen backlog: many downloader threads connect at once.
    request_queue_size = 256
    routes: dict[str, Route]

    def handle_error(self, request: object, client_address: object) -> None:
        # Clients that hang up mid-transfer (timeouts in download tests) are normal here.
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """A running file server; ``stop()`` or use as a context manager."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0, routes: dict[str, Route] | None = None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"not a directory: {self.root}")
        handler = partial(_Handler, directory=str(self.root))
        self._httpd = _Server((host, port), handler)
        # Shared dict: tests may plant routes after start.
        self._httpd.routes = routes if routes is not None else {}
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"sampleworld-http-{self.port}", daemon=True)
        self._thread.start()

    @property
    def routes(self) -> dict[str, Route]:
        """Planted routes (path -> response), consulted before the filesystem."""
        return self._httpd.routes

    @property
    def base_url(self) -> str:
        """``http://host:port`` without a trailing slash."""
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        """Absolute URL of a path under the root."""
        return f"{self.base_url}/{path.lstrip('/')}"

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=10)
        self._httpd.server_close()

    def __enter__(self) -> "LoopbackServer":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_directory(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    routes: dict[str, Route] | None = None,
) -> LoopbackServer:
    """Start serving ``root`` over HTTP in a daemon thread (port 0 picks a free port)."""
    return LoopbackServer(root, host=host, port=port, routes=routes)
