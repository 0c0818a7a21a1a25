"""The WebSocket client (RFC 6455) against an in-process server written
from the RFC: the handshake, masking, lengths, fragmentation, ping/pong,
closing, and reads that time out in the middle of a frame."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import threading
import time
import unittest
from typing import Callable, List, Optional, Tuple

import airlock
from airlock import _ws
from airlock._ws import OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, WebSocket

from fakeserver import TCPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def server_frame(op: int, payload: bytes, fin: bool = True) -> bytes:
    """An unmasked frame, as a server sends."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | op
    if n < 126:
        return bytes([b0, n]) + payload
    if n < 65536:
        return bytes([b0, 126]) + struct.pack("!H", n) + payload
    return bytes([b0, 127]) + struct.pack("!Q", n) + payload


class Peer:
    """The server side of one connection: reads client frames and checks
    that each is masked."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def _need(self, n: int) -> bytes:
        while len(self.buf) < n:
            c = self.conn.recv(65536)
            if not c:
                raise EOFError("client closed")
            self.buf += c
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def handshake(self, accept: Optional[Callable[[str], str]] = None, status: str = "101 Switching Protocols") -> dict:
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.conn.recv(4096)
        head, self.buf = head.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        hdrs = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        hdrs["request-line"] = lines[0]
        key = hdrs["sec-websocket-key"]
        assert len(base64.b64decode(key)) == 16, "the key is 16 random bytes"
        acc = accept(key) if accept else base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.conn.sendall(("HTTP/1.1 %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % (status, acc)).encode())
        return hdrs

    def read_frame(self) -> Tuple[bool, int, bytes]:
        b0, b1 = self._need(2)
        assert b1 & 0x80, "client frame is not masked"
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._need(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._need(8))
        key = self._need(4)
        data = self._need(n)
        return bool(b0 & 0x80), b0 & 0x0F, bytes(c ^ key[i % 4] for i, c in enumerate(data))


def connect(srv: TCPServer, **kw: object) -> WebSocket:
    return WebSocket.connect("127.0.0.1", srv.port, "/v1/sandboxes/sbx_1/pty?cols=80", {"Authorization": "Bearer k"}, timeout=5, **kw)  # type: ignore[arg-type]


class FramingTest(unittest.TestCase):
    def test_accept_key_of_the_rfc(self) -> None:
        self.assertEqual(_ws.accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")

    def test_masked_hello_of_the_rfc(self) -> None:
        # RFC 6455 §5.7: a masked text frame "Hello".
        f = _ws.encode_frame(OP_TEXT, b"Hello", mask_key=bytes([0x37, 0xFA, 0x21, 0x3D]))
        self.assertEqual(f, bytes([0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58]))
        self.assertEqual(_ws.mask(_ws.mask(b"x" * 1001, b"abcd"), b"abcd"), b"x" * 1001)

    def test_lengths(self) -> None:
        for n, head in ((125, 2), (126, 4), (65535, 4), (65536, 10)):
            f = _ws.encode_frame(OP_BINARY, b"\0" * n, mask_key=b"\1\2\3\4")
            self.assertEqual(len(f), head + 4 + n, n)
            sf = bytearray(server_frame(OP_BINARY, b"z" * n))
            fin, op, payload, used = _ws.parse_frame(sf)
            self.assertEqual((fin, op, len(payload), used), (True, OP_BINARY, n, len(sf)))
            # A frame not all there yet is not parsed.
            self.assertIsNone(_ws.parse_frame(sf[:-1]))
            self.assertIsNone(_ws.parse_frame(sf[:1]))

    def test_bad_server_frames(self) -> None:
        masked = bytearray(_ws.encode_frame(OP_TEXT, b"x"))
        rsv = bytearray([0xC1, 0x01, 0x78])
        long_ping = bytearray(server_frame(OP_PING, b"p" * 126))
        frag_close = bytearray([OP_CLOSE, 0x00])
        for f in (masked, rsv, long_ping, frag_close):
            with self.assertRaises(_ws.ProtocolError):
                _ws.parse_frame(f)


class ConnectionTest(unittest.TestCase):
    def test_session(self) -> None:
        got: List[Tuple[bool, int, bytes]] = []
        hdrs: dict = {}

        def serve(conn: socket.socket) -> None:
            p = Peer(conn)
            hdrs.update(p.handshake())
            # A text message in three fragments with a ping between.
            conn.sendall(server_frame(OP_TEXT, b'{"a":', fin=False) + server_frame(OP_PING, b"hb")
                         + server_frame(0, b" 1", fin=False) + server_frame(0, b"}"))
            got.append(p.read_frame())  # the pong
            conn.sendall(server_frame(OP_BINARY, b"B" * 70000))
            got.append(p.read_frame())  # the client's binary
            got.append(p.read_frame())  # its close
            conn.sendall(server_frame(OP_CLOSE, struct.pack("!H", 1000)))

        srv = TCPServer(serve)
        ws = connect(srv)
        self.assertEqual(ws.recv(5), (OP_TEXT, b'{"a": 1}'))
        self.assertEqual(ws.recv(5), (OP_BINARY, b"B" * 70000))
        ws.send_binary(b"keys\x03")
        ws.close()
        srv.join()
        self.assertEqual(hdrs["request-line"], "GET /v1/sandboxes/sbx_1/pty?cols=80 HTTP/1.1")
        self.assertEqual((hdrs["upgrade"].lower(), hdrs["sec-websocket-version"], hdrs["authorization"]), ("websocket", "13", "Bearer k"))
        self.assertEqual(got[0], (True, OP_PONG, b"hb"))
        self.assertEqual(got[1], (True, OP_BINARY, b"keys\x03"))
        self.assertEqual(got[2][:2], (True, OP_CLOSE))
        self.assertEqual(struct.unpack("!H", got[2][2][:2])[0], 1000)
        self.assertTrue(ws.closed)
        self.assertEqual(ws.close_code, 1000)

    def test_server_closes(self) -> None:
        echoed: List[Tuple[bool, int, bytes]] = []

        def serve(conn: socket.socket) -> None:
            p = Peer(conn)
            p.handshake()
            conn.sendall(server_frame(OP_TEXT, b'{"exit":{"exit_code":0}}') + server_frame(OP_CLOSE, struct.pack("!H", 1000) + b"exited"))
            echoed.append(p.read_frame())

        srv = TCPServer(serve)
        ws = connect(srv)
        self.assertEqual(ws.recv(5), (OP_TEXT, b'{"exit":{"exit_code":0}}'))
        self.assertIsNone(ws.recv(5))
        self.assertIsNone(ws.recv(5))  # stays closed
        srv.join()
        self.assertEqual((ws.close_code, ws.close_reason), (1000, "exited"))
        self.assertEqual(echoed[0][1], OP_CLOSE)
        with self.assertRaises(airlock.TransportError):
            ws.send_binary(b"late")

    def test_timeout_in_the_middle_of_a_frame(self) -> None:
        go = threading.Event()
        frame = server_frame(OP_BINARY, b"0123456789")

        def serve(conn: socket.socket) -> None:
            p = Peer(conn)
            p.handshake()
            conn.sendall(frame[:5])
            go.wait(5)
            conn.sendall(frame[5:] + server_frame(OP_CLOSE, struct.pack("!H", 1000)))
            p.read_frame()

        srv = TCPServer(serve)
        ws = connect(srv)
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError):
            ws.recv(0.3)
        self.assertLess(time.monotonic() - t0, 3)
        go.set()
        self.assertEqual(ws.recv(5), (OP_BINARY, b"0123456789"))
        self.assertIsNone(ws.recv(5))
        srv.join()

    def test_dropped_without_close_frame(self) -> None:
        def serve(conn: socket.socket) -> None:
            Peer(conn).handshake()

        srv = TCPServer(serve)
        ws = connect(srv)
        srv.join()
        with self.assertRaises(airlock.TransportError):
            ws.recv(5)

    def test_bad_accept(self) -> None:
        srv = TCPServer(lambda conn: Peer(conn).handshake(accept=lambda key: "wrong"))
        with self.assertRaises(_ws.ProtocolError):
            connect(srv)
        srv.join()

    def test_error_answer(self) -> None:
        def serve(conn: socket.socket) -> None:
            conn.recv(4096)
            body = json.dumps({"error": {"code": "sandbox_not_found", "message": "sandbox not found"}}).encode()
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Request-Id: req_9\r\n\r\n%s" % (len(body), body))

        srv = TCPServer(serve)
        with self.assertRaises(airlock.SandboxNotFound) as cm:
            connect(srv)
        self.assertEqual((cm.exception.status, cm.exception.request_id), (404, "req_9"))
        srv.join()

    def test_masked_server_frame_is_refused(self) -> None:
        closes: List[Tuple[bool, int, bytes]] = []

        def serve(conn: socket.socket) -> None:
            p = Peer(conn)
            p.handshake()
            conn.sendall(_ws.encode_frame(OP_BINARY, b"x"))
            closes.append(p.read_frame())

        srv = TCPServer(serve)
        ws = connect(srv)
        with self.assertRaises(_ws.ProtocolError):
            ws.recv(5)
        srv.join()
        self.assertEqual(closes[0][1], OP_CLOSE)
        self.assertEqual(struct.unpack("!H", closes[0][2][:2])[0], 1002)


if __name__ == "__main__":
    unittest.main()
