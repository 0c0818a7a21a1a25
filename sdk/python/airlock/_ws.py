"""A minimal WebSocket client (RFC 6455) on the standard library, for the
sandbox's terminal (``GET /v1/sandboxes/{id}/pty``).

It does what a client must and nothing more: the opening handshake with
``Sec-WebSocket-Accept`` checked, masked frames from the client (a fresh
random key per frame), unmasked ones from the server (a masked one is a
protocol error), fragmented messages reassembled, pings answered with
pongs (also between the fragments of a message), and the closing
handshake. No extensions (the RSV bits must be 0) and no subprotocols.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import threading
import time
from typing import Dict, Mapping, Optional, Tuple

from . import _errors
from ._errors import TransportError

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

#: close codes (RFC 6455 §7.4.1)
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_ABNORMAL = 1006  # never sent: no close frame was received
CLOSE_TOO_BIG = 1009

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: the longest handshake answer head read
_MAX_HEAD = 64 << 10
#: the largest message accepted from the server (terminal output comes in
#: reads of a few KiB; the bound keeps a broken server from making the
#: client buffer without limit)
MAX_MESSAGE = 16 << 20
_RECV = 64 << 10


class ProtocolError(TransportError):
    """The server broke the WebSocket protocol."""


def accept_key(key: str) -> str:
    """The Sec-WebSocket-Accept the server must answer key with."""
    return base64.b64encode(hashlib.sha1((key + _GUID).encode("ascii")).digest()).decode("ascii")


def mask(data: bytes, key: bytes) -> bytes:
    """XORs data with the 4-byte masking key (RFC 6455 §5.3); masking twice
    gives the data back."""
    n = len(data)
    if n == 0:
        return b""
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(k, "little")).to_bytes(n, "little")


def encode_frame(opcode: int, payload: bytes, *, fin: bool = True, mask_key: Optional[bytes] = None) -> bytes:
    """One frame. A client's frames are masked: give mask_key (4 bytes) or
    a random one is drawn."""
    if mask_key is None:
        mask_key = os.urandom(4)
    if len(mask_key) != 4:
        raise ValueError("a masking key is 4 bytes")
    n = len(payload)
    head = bytearray([(0x80 if fin else 0) | (opcode & 0x0F)])
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += struct.pack("!H", n)
    else:
        head.append(0x80 | 127)
        head += struct.pack("!Q", n)
    head += mask_key
    return bytes(head) + mask(bytes(payload), mask_key)


def parse_frame(buf: bytearray) -> Optional[Tuple[bool, int, bytes, int]]:
    """Parses the first frame of buf: (fin, opcode, payload, bytes used), or
    None when buf does not hold a whole frame yet. Server frames must be
    unmasked, without RSV bits; control frames whole and short."""
    if len(buf) < 2:
        return None
    b0, b1 = buf[0], buf[1]
    fin, rsv, opcode = bool(b0 & 0x80), b0 & 0x70, b0 & 0x0F
    if rsv:
        raise ProtocolError("websocket frame with reserved bits set (no extension was agreed)")
    if b1 & 0x80:
        raise ProtocolError("websocket frame from the server is masked")
    n = b1 & 0x7F
    pos = 2
    if n == 126:
        if len(buf) < 4:
            return None
        (n,) = struct.unpack_from("!H", buf, 2)
        pos = 4
    elif n == 127:
        if len(buf) < 10:
            return None
        (n,) = struct.unpack_from("!Q", buf, 2)
        if n >> 63:
            raise ProtocolError("websocket frame length has its top bit set")
        pos = 10
    if opcode >= 0x8:
        if not fin or n > 125:
            raise ProtocolError("websocket control frame fragmented or longer than 125 bytes")
        if opcode not in (OP_CLOSE, OP_PING, OP_PONG):
            raise ProtocolError("websocket frame with unknown control opcode %#x" % opcode)
    elif opcode not in (OP_CONT, OP_TEXT, OP_BINARY):
        raise ProtocolError("websocket frame with unknown opcode %#x" % opcode)
    if n > MAX_MESSAGE:
        raise ProtocolError("websocket frame of %d bytes is over the limit" % n)
    if len(buf) < pos + n:
        return None
    return fin, opcode, bytes(buf[pos : pos + n]), pos + n


def _close_payload(code: int, reason: str) -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:123]


class WebSocket:
    """A client WebSocket connection. recv may run in one thread while
    send runs in another; close is safe from any thread."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"", *, max_message: int = MAX_MESSAGE) -> None:
        self._sock = sock
        self._buf = bytearray(buffered)
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self._max = max_message
        self._frag_op: Optional[int] = None
        self._frag = bytearray()
        self._sent_close = False
        #: set once the server's close frame arrived (or the connection dropped)
        self.closed = False
        self.close_code: Optional[int] = None
        self.close_reason = ""

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        target: str,
        headers: Optional[Mapping[str, str]] = None,
        *,
        timeout: Optional[float] = 30.0,
        ssl_context: Optional[ssl.SSLContext] = None,
        host_header: Optional[str] = None,
    ) -> "WebSocket":
        """Opens a WebSocket to target (path and query) on host:port. A
        non-101 answer raises its AirlockError (the API's error body)."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise TransportError("connecting to %s:%d: %s" % (host, port, e.strerror or e)) from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            key = base64.b64encode(os.urandom(16)).decode("ascii")
            lines = [
                "GET %s HTTP/1.1" % target,
                "Host: %s" % (host_header or "%s:%d" % (host, port)),
                "Upgrade: websocket",
                "Connection: Upgrade",
                "Sec-WebSocket-Key: %s" % key,
                "Sec-WebSocket-Version: 13",
            ]
            for k, v in (headers or {}).items():
                if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
                    raise ValueError("header %r has a line break" % k)
                lines.append("%s: %s" % (k, v))
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            status, hdrs, rest = _read_head(sock)
            if status != 101:
                raise _errors.from_response(status, hdrs, _read_body(sock, hdrs, rest))
            if hdrs.get("upgrade", "").lower() != "websocket" or "upgrade" not in [
                t.strip().lower() for t in hdrs.get("connection", "").split(",")
            ]:
                raise ProtocolError("server answered 101 without upgrading to websocket")
            if hdrs.get("sec-websocket-accept") != accept_key(key):
                raise ProtocolError("server's Sec-WebSocket-Accept does not match the key sent")
            if hdrs.get("sec-websocket-extensions"):
                raise ProtocolError("server chose a websocket extension that was not offered")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return cls(sock, rest)

    # -- sending ---------------------------------------------------------

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        frame = encode_frame(opcode, payload)
        with self._wlock:
            if self._sent_close and opcode != OP_CLOSE:
                raise TransportError("websocket is closed")
            try:
                self._sock.sendall(frame)
            except OSError as e:
                raise TransportError("websocket: %s" % (e.strerror or e)) from e

    def send_binary(self, data: bytes) -> None:
        self._send_frame(OP_BINARY, bytes(data))

    def send_text(self, text: str) -> None:
        self._send_frame(OP_TEXT, text.encode("utf-8"))

    def ping(self, payload: bytes = b"") -> None:
        self._send_frame(OP_PING, payload[:125])

    # -- receiving -------------------------------------------------------

    def _fill(self, deadline: Optional[float]) -> None:
        if deadline is None:
            self._sock.settimeout(None)
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("websocket read timed out")
            self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(_RECV)
        except socket.timeout as e:
            raise TimeoutError("websocket read timed out") from e
        except OSError as e:
            self.closed, self.close_code = True, CLOSE_ABNORMAL
            if self._sent_close:
                chunk = b""
            else:
                self._release()
                raise TransportError("websocket: %s" % (e.strerror or e)) from e
        if not chunk:
            self.closed = True
            if self.close_code is None:
                self.close_code = CLOSE_ABNORMAL
            if not self._sent_close:
                self._release()
                raise TransportError("websocket connection closed without a close frame")
            raise EOFError
        self._buf += chunk

    def recv(self, timeout: Optional[float] = None) -> Optional[Tuple[int, bytes]]:
        """The next data message as (OP_TEXT or OP_BINARY, payload), or None
        once the server closed the connection. A timeout raises
        TimeoutError and loses nothing (a frame half read stays buffered)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._rlock:
            while True:
                if self.closed:
                    return None
                try:
                    fr = parse_frame(self._buf)
                except ProtocolError:
                    self._fail(CLOSE_PROTOCOL_ERROR)
                    raise
                if fr is None:
                    try:
                        self._fill(deadline)
                    except EOFError:
                        return None
                    continue
                fin, op, payload, used = fr
                del self._buf[:used]
                if op == OP_PING:
                    try:
                        self._send_frame(OP_PONG, payload)
                    except TransportError:
                        pass  # we are closing: the close handshake goes on
                    continue
                if op == OP_PONG:
                    continue
                if op == OP_CLOSE:
                    self._on_close(payload)
                    return None
                if op == OP_CONT:
                    if self._frag_op is None:
                        self._fail(CLOSE_PROTOCOL_ERROR)
                        raise ProtocolError("websocket continuation frame without a message")
                    self._frag += payload
                else:
                    if self._frag_op is not None:
                        self._fail(CLOSE_PROTOCOL_ERROR)
                        raise ProtocolError("websocket message began inside another")
                    self._frag_op, self._frag = op, bytearray(payload)
                if len(self._frag) > self._max:
                    self._fail(CLOSE_TOO_BIG)
                    raise ProtocolError("websocket message is over %d bytes" % self._max)
                if fin:
                    msg_op, msg = self._frag_op, bytes(self._frag)
                    self._frag_op, self._frag = None, bytearray()
                    assert msg_op is not None
                    return msg_op, msg

    def _on_close(self, payload: bytes) -> None:
        code, reason = CLOSE_NORMAL, ""
        if len(payload) >= 2:
            (code,) = struct.unpack("!H", payload[:2])
            reason = payload[2:].decode("utf-8", "replace")
        elif payload:
            code = CLOSE_PROTOCOL_ERROR
        self.close_code, self.close_reason = code, reason
        # Echo the close (RFC 6455 §5.5.1), then the server closes TCP.
        with self._wlock:
            if not self._sent_close:
                self._sent_close = True
                try:
                    self._sock.sendall(encode_frame(OP_CLOSE, struct.pack("!H", code) if len(payload) >= 2 else b""))
                except OSError:
                    pass
        self.closed = True
        self._release()

    def _fail(self, code: int) -> None:
        with self._wlock:
            if not self._sent_close:
                self._sent_close = True
                try:
                    self._sock.sendall(encode_frame(OP_CLOSE, _close_payload(code, "")))
                except OSError:
                    pass
        self.closed, self.close_code = True, code
        self._release()

    def _release(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def close(self, code: int = CLOSE_NORMAL, reason: str = "", timeout: float = 5.0) -> None:
        """The closing handshake: sends a close frame and waits (up to
        timeout) for the server's, discarding data that comes first."""
        with self._wlock:
            first = not self._sent_close
            self._sent_close = True
            if first:
                try:
                    self._sock.sendall(encode_frame(OP_CLOSE, _close_payload(code, reason)))
                except OSError:
                    first = False
        if first and not self.closed:
            # Another thread may be in recv: it then sees the close frame
            # itself; else read it here.
            if self._rlock.acquire(timeout=timeout):
                try:
                    deadline = time.monotonic() + timeout
                    while not self.closed:
                        try:
                            fr = parse_frame(self._buf)
                        except ProtocolError:
                            break
                        if fr is None:
                            try:
                                self._fill(deadline)
                            except (TimeoutError, EOFError, TransportError):
                                break
                            continue
                        _, op, payload, used = fr
                        del self._buf[:used]
                        if op == OP_CLOSE:
                            self._on_close(payload)
                finally:
                    self._rlock.release()
        self.closed = True
        if self.close_code is None:
            self.close_code = code
        self._release()

    def abort(self) -> None:
        """Drops the connection at once, without the closing handshake."""
        self._sent_close = True
        self.closed = True
        self._release()


def _read_head(sock: socket.socket) -> Tuple[int, Dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        try:
            chunk = sock.recv(4096)
        except socket.timeout as e:
            raise TransportError("websocket handshake timed out") from e
        if not chunk:
            raise TransportError("server closed the connection during the websocket handshake")
        buf += chunk
        if len(buf) > _MAX_HEAD:
            raise ProtocolError("websocket handshake answer head is too long")
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError("websocket handshake: not an HTTP answer")
    hdrs: Dict[str, str] = {}
    for line in lines[1:]:
        k, sep, v = line.partition(":")
        if sep:
            k = k.strip().lower()
            hdrs[k] = (hdrs[k] + ", " + v.strip()) if k in hdrs else v.strip()
    return int(parts[1]), _Headers(hdrs), rest


class _Headers(dict):  # type: ignore[type-arg]
    """Lower-cased header names; get() is case-insensitive like http.client's."""

    def get(self, key: str, default: Optional[str] = None) -> Optional[str]:  # type: ignore[override]
        return super().get(key.lower(), default)


def _read_body(sock: socket.socket, hdrs: Mapping[str, str], rest: bytes) -> bytes:
    try:
        n = int(hdrs.get("content-length") or "-1")
    except ValueError:
        n = -1
    limit = 64 << 10 if n < 0 else min(n, 64 << 10)
    body = rest
    try:
        while len(body) < limit:
            chunk = sock.recv(limit - len(body))
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    return body[:limit]
