"""HTTP over the standard library: a keep-alive connection pool, the API's
error mapping, Server-Sent Events and NDJSON readers.

One :class:`Transport` serves one server and key, and every handle made
from it (a sandbox, its commands, files, …) shares its connections: a
request takes an idle connection (or opens one), and gives it back once its
answer is read to the end. Reusing a connection saves the TCP handshake and
the server's per-connection setup on every call, which is most of what an
SDK could add to an exec round trip.
"""

from __future__ import annotations

import contextvars
import http.client
import json
import os
import select
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _errors
from ._errors import TransportError

__all__ = ["Transport", "Response", "DEFAULT_URL", "ENV_URL", "ENV_API_KEY"]

#: where the SDK finds the server and key, as the CLI does
ENV_URL = "AIRLOCK_URL"
ENV_API_KEY = "AIRLOCK_API_KEY"
#: the daemon's default listen address (`airlock serve --listen`)
DEFAULT_URL = "http://127.0.0.1:7070"

#: seconds one ordinary call may wait on the socket (connect, or between
#: two reads of the answer)
DEFAULT_TIMEOUT = 60.0
#: how long a stream may stay silent: the server sends a heartbeat at
#: least every 15 s, so three missed heartbeats mean the connection is gone
#: (a half-open TCP connection would otherwise hang a reader forever)
STREAM_IDLE = 45.0
#: idle connections kept per transport
MAX_IDLE = 8
#: the most of an error body that is read (the API's are small; a proxy's
#: HTML page is cut)
MAX_ERROR_BODY = 64 << 10

_USER_AGENT = "airlock-python/0.1"

Query = Optional[Mapping[str, Union[str, int, float, bool, Sequence[str], None]]]


class _Unset:
    pass


UNSET: Any = _Unset()


class Cancel:
    """Cancels the calls of one asyncio task that run in a worker thread:
    the task's cancellation shuts down the sockets those calls use, so the
    thread stops at once instead of waiting for the server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: List[socket.socket] = []
        self.cancelled = False

    def attach(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            if self.cancelled:
                _shutdown(sock)
            self._socks.append(sock)

    def detach(self, sock: Optional[socket.socket]) -> None:
        with self._lock:
            if sock in self._socks:
                self._socks.remove(sock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            socks, self._socks = self._socks, []
        for s in socks:
            _shutdown(s)


#: the Cancel of the asyncio call this thread runs for, if any
current_cancel: "contextvars.ContextVar[Optional[Cancel]]" = contextvars.ContextVar("airlock_cancel", default=None)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _stale(sock: Optional[socket.socket]) -> bool:
    """Reports whether an idle keep-alive connection was closed by the
    server (it is readable: EOF, or bytes nobody asked for)."""
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(p.poll(0))
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r)
    except (OSError, ValueError):
        return True


_UPLOAD_CHUNK = 1 << 20
#: bodies up to this size go out in the same send as the request head
_INLINE_BODY = 64 << 10


class _Conn:
    """One keep-alive connection. A request is written whole, its head and
    a small body in one send (http.client's HTTPConnection sends them apart
    and builds the head header by header); the answer is parsed by
    http.client's own HTTPResponse."""

    __slots__ = ("sock", "_host")

    def __init__(self, sock: socket.socket, host_header: str) -> None:
        self.sock: Optional[socket.socket] = sock
        self._host = host_header

    def request(self, method: str, target: str, body: Any, headers: Mapping[str, str]) -> None:
        sock = self.sock
        assert sock is not None
        parts = ["%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, target, self._host)]
        for k, v in headers.items():
            if "\n" in v or "\r" in v or "\n" in k or "\r" in k or ":" in k:
                raise _errors.InvalidRequest("header %r has a line break or colon in it" % k)
            parts.append("%s: %s\r\n" % (k, v))
        if isinstance(body, str):
            body = body.encode("utf-8")
        stream = body is not None and not isinstance(body, (bytes, bytearray, memoryview))
        if body is not None and not stream and "Content-Length" not in headers:
            parts.append("Content-Length: %d\r\n" % len(body))
        chunked = stream and "Content-Length" not in headers
        if chunked:
            parts.append("Transfer-Encoding: chunked\r\n")
        parts.append("\r\n")
        head = "".join(parts).encode("latin-1")
        if body is None:
            sock.sendall(head)
        elif not stream:
            if len(body) <= _INLINE_BODY:
                sock.sendall(head + bytes(body))
            else:
                sock.sendall(head)
                sock.sendall(body)
        else:
            sock.sendall(head)
            while True:
                chunk = body.read(_UPLOAD_CHUNK)
                if not chunk:
                    break
                if isinstance(chunk, str):
                    chunk = chunk.encode("utf-8")
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                sock.sendall(b"0\r\n\r\n")

    def getresponse(self, method: str) -> http.client.HTTPResponse:
        assert self.sock is not None
        r = http.client.HTTPResponse(self.sock, method=method)
        try:
            r.begin()
        except BaseException:
            r.close()
            raise
        return r

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


class Response:
    """A 2xx answer whose body is read as it comes (streams, downloads).
    Close it (or use it as a context manager) when done: a body read to its
    end gives the connection back to the pool, else it is closed."""

    def __init__(self, transport: "Transport", conn: _Conn, resp: http.client.HTTPResponse) -> None:
        self._transport = transport
        self._conn: Optional[_Conn] = conn
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers
        self._cancel = current_cancel.get()

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    def readline(self, limit: int) -> bytes:
        """One line (with its newline), b"" at the end of the body. A line
        longer than limit is an error."""
        try:
            line = self._resp.readline(limit + 1)
        except (OSError, http.client.HTTPException) as e:
            raise self._transport.broken(e) from e
        if len(line) > limit and not line.endswith(b"\n"):
            raise TransportError("answer has a line longer than %d bytes" % limit)
        return line

    def read(self, n: int = -1) -> bytes:
        try:
            return self._resp.read(n) if n >= 0 else self._resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise self._transport.broken(e) from e

    def read1(self, n: int) -> bytes:
        try:
            return self._resp.read1(n)
        except (OSError, http.client.HTTPException) as e:
            raise self._transport.broken(e) from e

    def settimeout(self, timeout: Optional[float]) -> None:
        conn = self._conn
        if conn is not None and conn.sock is not None:
            conn.sock.settimeout(timeout)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._cancel is not None:
            self._cancel.detach(conn.sock)
        if self._resp.isclosed() and not self._resp.will_close:
            self._transport._release(conn)
        else:
            conn.close()

    def abort(self) -> None:
        """Closes the connection at once (another thread's read ends)."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            _shutdown(conn.sock)

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Transport:
    """The connection to one airlock server with one API key.

    url and api_key default to ``AIRLOCK_URL`` and ``AIRLOCK_API_KEY``
    (then ``http://127.0.0.1:7070``); timeout is the seconds an ordinary
    call may wait on the socket.
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        url = url or os.environ.get(ENV_URL) or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY, "")
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise _errors.InvalidRequest("server url %r is not http(s)://host[:port]" % _redact(url), code="invalid_argument")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.base_path = u.path.rstrip("/")
        #: the server URL without credentials, for messages
        self.url = "%s://%s%s" % (u.scheme, _netloc(self.host, self.port, u.scheme), self.base_path)
        self.timeout = timeout
        self._api_key = api_key
        self._lock = threading.Lock()
        self._idle: List[_Conn] = []
        self._closed = False
        self._headers: Dict[str, str] = {"User-Agent": _USER_AGENT}
        if api_key:
            self._headers["Authorization"] = "Bearer " + api_key
        self._ssl: Optional[ssl.SSLContext] = ssl.create_default_context() if u.scheme == "https" else None
        self._host_header = _netloc(self.host, self.port, u.scheme)

    def __del__(self) -> None:
        # A handle dropped without close (Sandbox.connect(id).state) must
        # not leave its idle sockets to the garbage collector's warnings.
        try:
            self.close()
        except Exception:
            pass

    # -- connections -----------------------------------------------------

    def auth_headers(self) -> Dict[str, str]:
        """The headers every request carries (for the WebSocket handshake)."""
        return dict(self._headers)

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        return self._ssl

    def _connect(self, timeout: Optional[float]) -> _Conn:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as e:
            raise TransportError("connecting to %s: %s" % (self.url, _reason(e))) from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
        except OSError as e:
            sock.close()
            raise TransportError("connecting to %s: %s" % (self.url, _reason(e))) from e
        return _Conn(sock, self._host_header)

    def _acquire(self, timeout: Optional[float]) -> Tuple[_Conn, bool]:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(timeout), False
            if _stale(conn.sock):
                conn.close()
                continue
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            return conn, True

    def _release(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Closes the idle connections; calls after it open new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def broken(self, e: BaseException) -> TransportError:
        c = current_cancel.get()
        if c is not None and c.cancelled:
            return TransportError("call cancelled")
        return TransportError("connection to %s: %s" % (self.url, _reason(e)))

    # -- requests --------------------------------------------------------

    def target(self, path: str, query: Query = None) -> str:
        """The request target of an API path and query."""
        t = self.base_path + path
        if query:
            pairs: List[Tuple[str, str]] = []
            for k, v in query.items():
                if v is None:
                    continue
                if isinstance(v, (list, tuple)):
                    pairs.extend((k, str(x)) for x in v)
                elif isinstance(v, bool):
                    pairs.append((k, "true" if v else "false"))
                else:
                    pairs.append((k, str(v)))
            if pairs:
                t += "?" + urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)
        return t

    def open(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = UNSET,
    ) -> Response:
        """Sends a request and returns its 2xx answer unread; a non-2xx
        answer raises its AirlockError."""
        conn, resp = self._send(method, path, query, body, headers, timeout)
        if 200 <= resp.status < 300:
            return Response(self, conn, resp)
        raise self._error(conn, resp)

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        json_body: Any = UNSET,
        body: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Any = UNSET,
    ) -> Any:
        """Sends a request and returns its JSON answer (None for an empty
        one); a non-2xx answer raises its AirlockError."""
        h: Dict[str, str] = {}
        if json_body is not UNSET:
            body = json.dumps(json_body, separators=(",", ":")).encode("utf-8")
            h["Content-Type"] = "application/json"
        if headers:
            h.update(headers)
        conn, resp = self._send(method, path, query, body, h, timeout)
        if not 200 <= resp.status < 300:
            raise self._error(conn, resp)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._done(conn)
            conn.close()
            raise self.broken(e) from e
        self._done(conn)
        if resp.will_close:
            conn.close()
        else:
            self._release(conn)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise _errors.InternalError("server answered %s %s with a body that is not JSON" % (method, path.split("?")[0])) from e

    def _done(self, conn: _Conn) -> None:
        c = current_cancel.get()
        if c is not None:
            c.detach(conn.sock)

    def _send(
        self,
        method: str,
        path: str,
        query: Query,
        body: Any,
        headers: Optional[Mapping[str, str]],
        timeout: Any,
    ) -> Tuple[_Conn, http.client.HTTPResponse]:
        if timeout is UNSET:
            timeout = self.timeout
        target = self.target(path, query)
        h = dict(self._headers)
        if headers:
            h.update(headers)
        if body is None and method in ("POST", "PUT", "PATCH"):
            h.setdefault("Content-Length", "0")
        rewindable = body is None or isinstance(body, (bytes, bytearray, memoryview, str))
        cancel = current_cancel.get()
        if cancel is not None and cancel.cancelled:
            raise TransportError("call cancelled")
        # A request that failed on a reused connection the server had
        # closed while it was idle is sent once more on a fresh one: when
        # the send itself failed (nothing reached a handler), or when
        # sending it twice is harmless (an idempotent method, or an
        # Idempotency-Key), as Go's net/http does.
        replayable = method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS") or "Idempotency-Key" in h
        for attempt in (0, 1):
            conn, reused = self._acquire(timeout)
            if cancel is not None:
                cancel.attach(conn.sock)
            sent = False
            try:
                conn.request(method, target, body, h)
                sent = True
                return conn, conn.getresponse(method)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as e:
                if cancel is not None:
                    cancel.detach(conn.sock)
                conn.close()
                again = reused and attempt == 0 and rewindable and (not sent or replayable)
                if again and not (cancel is not None and cancel.cancelled):
                    continue
                raise self.broken(e) from e
            except (OSError, http.client.HTTPException) as e:
                if cancel is not None:
                    cancel.detach(conn.sock)
                conn.close()
                raise self.broken(e) from e
        raise AssertionError("unreachable")

    def _error(self, conn: _Conn, resp: http.client.HTTPResponse) -> _errors.AirlockError:
        try:
            body = resp.read(MAX_ERROR_BODY)
            whole = resp.isclosed()
        except (OSError, http.client.HTTPException):
            body, whole = b"", False
        self._done(conn)
        if whole and not resp.will_close:
            self._release(conn)
        else:
            conn.close()
        return _errors.from_response(resp.status, resp.headers, body)


def _netloc(host: str, port: int, scheme: str) -> str:
    h = "[%s]" % host if ":" in host else host
    if (scheme == "http" and port == 80) or (scheme == "https" and port == 443):
        return h
    return "%s:%d" % (h, port)


def _redact(url: str) -> str:
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable>"
    if u.password or u.username:
        netloc = u.netloc.rsplit("@", 1)[-1]
        return urllib.parse.urlunsplit((u.scheme, netloc, u.path, "", ""))
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path, "", ""))


def _reason(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, http.client.RemoteDisconnected):
        return "server closed the connection"
    if isinstance(e, http.client.IncompleteRead):
        return "answer cut short"
    s = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return s


# -- Server-Sent Events ----------------------------------------------------


class SSEEvent(NamedTuple):
    """One Server-Sent Event: its ``event`` name (``message`` if none),
    its ``data`` (data lines joined by newlines) and its ``id``."""

    event: str
    data: str
    id: Optional[str]


class SSEParser:
    """Turns the lines of a ``text/event-stream`` into events (the WHATWG
    HTML rules: ``field: value`` lines, a blank line ends an event,
    ``:`` lines are comments such as heartbeats)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []
        self._id: Optional[str] = None

    def feed(self, line: str) -> Optional[SSEEvent]:
        """Takes one line (its end of line may be there) and returns the
        event it completes, if any."""
        if line.endswith("\n"):
            line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
        if line == "":
            if not self._data:
                self._event = ""
                return None
            ev = SSEEvent(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return ev
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self._id = value
        return None


#: the longest SSE line read (an output chunk, base64 when binary)
MAX_SSE_LINE = 16 << 20
#: the longest NDJSON line read (a code result with a large figure)
MAX_NDJSON_LINE = 64 << 20


def iter_sse(resp: Response, limit: int = MAX_SSE_LINE) -> Iterator[SSEEvent]:
    """The events of an SSE answer until its body ends."""
    p = SSEParser()
    while True:
        raw = resp.readline(limit)
        if not raw:
            return
        ev = p.feed(raw.decode("utf-8", "replace"))
        if ev is not None:
            yield ev


def iter_ndjson(resp: Response, limit: int = MAX_NDJSON_LINE) -> Iterator[Any]:
    """The JSON values of an NDJSON answer, one a line, until it ends."""
    while True:
        raw = resp.readline(limit)
        if not raw:
            return
        if not raw.strip():
            continue
        try:
            yield json.loads(raw)
        except ValueError as e:
            raise _errors.InternalError("server sent a line that is not JSON in an NDJSON stream") from e


def quote(segment: str) -> str:
    """One path segment, escaped."""
    return urllib.parse.quote(segment, safe="")


Callback = Optional[Callable[..., Any]]
