"""In-process servers for the unit tests: an HTTP server whose handler a
test scripts, and a raw TCP server for the WebSocket tests. Loopback only."""

from __future__ import annotations

import http.server
import socket
import threading
from typing import Any, Callable, List, Optional


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the daemon

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _dispatch(self) -> None:
        srv: "HTTPServer" = self.server  # type: ignore[assignment]
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        srv.requests.append((self.command, self.path, dict(self.headers), body, self.client_address[1]))
        srv.route(self, body)

    do_GET = do_POST = do_PUT = do_DELETE = _dispatch

    def send_json(self, status: int, doc: bytes, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(doc)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(doc)

    def start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, route: Callable[[Handler, bytes], None]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.route = route
        self.requests: List[Any] = []
        self._t = threading.Thread(target=self.serve_forever, daemon=True)
        self._t.start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server_address[1]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class TCPServer:
    """Accepts one connection and runs serve(conn) in a thread."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._ls = socket.socket()
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(1)
        self.port = self._ls.getsockname()[1]
        self.error: Optional[BaseException] = None
        self._serve = serve
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        conn, _ = self._ls.accept()
        try:
            self._serve(conn)
        except BaseException as e:  # reported by join()
            self.error = e
        finally:
            conn.close()
            self._ls.close()

    def join(self, timeout: float = 10.0) -> None:
        self._t.join(timeout)
        if self._t.is_alive():
            raise AssertionError("server thread did not end")
        if self.error is not None:
            raise self.error
