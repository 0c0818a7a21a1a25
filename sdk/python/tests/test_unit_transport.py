"""The HTTP transport and exec streams against an in-process HTTP server:
keep-alive reuse, a connection the server closed while idle, error bodies,
SSE parsing, and an exec stream that drops and is re-attached."""

from __future__ import annotations

import base64
import json
import os
import threading
import unittest
from typing import Any, List
from unittest import mock

import airlock
from airlock import _transport
from airlock._models import SandboxInfo
from airlock._sandbox import Sandbox, resolve
from airlock._transport import SSEParser, Transport

from fakeserver import Handler, HTTPServer


def sse(event: str, data: Any, id: str = "") -> bytes:
    out = "event: %s\n" % event
    if id:
        out += "id: %s\n" % id
    return (out + "data: %s\n\n" % json.dumps(data)).encode()


class SSEParserTest(unittest.TestCase):
    def feed(self, text: str) -> List[Any]:
        p = SSEParser()
        out = []
        for line in text.splitlines(keepends=True):
            ev = p.feed(line)
            if ev is not None:
                out.append(ev)
        return out

    def test_events(self) -> None:
        evs = self.feed(
            ": heartbeat\n\n"
            "event: stdout\nid: 5\ndata: {\"a\":1}\n\n"
            "data:first\ndata: second\r\n\r\n"
            "event: lonely\n\n"  # no data: not dispatched
            "event: exit\ndata: {}\n\n"
        )
        self.assertEqual([(e.event, e.data, e.id) for e in evs], [
            ("stdout", '{"a":1}', "5"),
            ("message", "first\nsecond", "5"),  # the last id stays
            ("exit", "{}", "5"),
        ])

    def test_value_keeps_inner_colons_and_spaces(self) -> None:
        (ev,) = self.feed("data:  two spaces: kept\n\n")
        self.assertEqual(ev.data, " two spaces: kept")


class PathTest(unittest.TestCase):
    def test_resolve(self) -> None:
        self.assertEqual(resolve("a/b.txt"), "/home/user/a/b.txt")
        self.assertEqual(resolve(""), "/home/user")
        self.assertEqual(resolve("."), "/home/user")
        self.assertEqual(resolve("/tmp/x"), "/tmp/x")
        self.assertEqual(resolve("x", "root"), "/root/x")
        self.assertEqual(resolve("x", "alice"), "/home/alice/x")


class Server(unittest.TestCase):
    """A test with a scripted server: route(handler, body) answers."""

    def serve(self, route: Any) -> HTTPServer:
        srv = HTTPServer(route)
        self.addCleanup(srv.stop)
        return srv

    def sandbox(self, srv: HTTPServer, key: str = "k_secret") -> Sandbox:
        tr = Transport(srv.url, key)
        self.addCleanup(tr.close)
        return Sandbox(SandboxInfo.from_json({"id": "sbx_1", "template": "base", "runtime": "runc", "state": "running"}), tr)


class TransportTest(Server):
    def test_keep_alive_reuses_one_connection(self) -> None:
        def route(h: Handler, body: bytes) -> None:
            h.send_json(200, json.dumps({"id": "ex_1", "exit_code": 0, "status": "exited", "stdout": "hi\n", "stderr": ""}).encode())

        srv = self.serve(route)
        sbx = self.sandbox(srv)
        for _ in range(5):
            r = sbx.commands.run("echo hi")
            self.assertEqual((r.stdout, r.exit_code), ("hi\n", 0))
        ports = {req[4] for req in srv.requests}
        self.assertEqual(len(ports), 1, "each call opened a connection: %s" % ports)
        method, path, headers, body, _ = srv.requests[0]
        self.assertEqual((method, path), ("POST", "/v1/sandboxes/sbx_1/exec"))
        self.assertEqual(headers.get("Authorization"), "Bearer k_secret")
        self.assertEqual(json.loads(body), {"shell": "echo hi", "timeout_s": 60.0})

    def test_connection_closed_while_idle_is_replaced(self) -> None:
        # The server closes each connection after its answer (as one whose
        # idle timeout passed): the next call must not fail on it.
        def route(h: Handler, body: bytes) -> None:
            h.close_connection = True
            doc = b'{"id":"sbx_1","template":"base","runtime":"runc","state":"running"}'
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(doc)))
            h.end_headers()
            h.wfile.write(doc)

        srv = self.serve(route)
        sbx = self.sandbox(srv)
        for _ in range(3):
            self.assertEqual(sbx.get_info().state, "running")
        self.assertEqual(len(srv.requests), 3)

    def test_request_dropped_after_it_was_read(self) -> None:
        # The server reads a request on a reused connection and closes it
        # without an answer: a GET is sent again on a fresh connection, a
        # POST exec is not (it may have run), and the caller learns it.
        info = b'{"id":"sbx_1","template":"base","runtime":"runc","state":"running"}'

        def route(h: Handler, body: bytes) -> None:
            n = len(h.server.requests)  # type: ignore[attr-defined]
            if n in (2, 4):  # the second request of each pair
                h.close_connection = True
                return
            h.send_json(200, info)

        srv = self.serve(route)
        sbx = self.sandbox(srv)
        sbx.get_info()
        self.assertEqual(sbx.get_info().state, "running")  # dropped once, sent again
        self.assertEqual([r[0] for r in srv.requests], ["GET", "GET", "GET"])
        with self.assertRaises(airlock.TransportError):
            sbx.commands.run("echo once")
        self.assertEqual([r[0] for r in srv.requests], ["GET", "GET", "GET", "POST"])

    def test_error_answers(self) -> None:
        def route(h: Handler, body: bytes) -> None:
            if h.path.startswith("/v1/sandboxes/sbx_1/files"):
                h.send_json(429, json.dumps({"error": {"code": "quota_exceeded", "message": "disk full", "request_id": "req_1"}}).encode(),
                            {"Retry-After": "3"})
            else:
                h.send_json(404, json.dumps({"error": {"code": "sandbox_not_found", "message": "sandbox not found", "sandbox_id": "sbx_1"}}).encode())

        srv = self.serve(route)
        sbx = self.sandbox(srv)
        with self.assertRaises(airlock.QuotaExceeded) as cm:
            sbx.files.write("a.txt", "x")
        self.assertEqual((cm.exception.retry_after, cm.exception.request_id, cm.exception.status), (3.0, "req_1", 429))
        with self.assertRaises(airlock.SandboxNotFound):
            sbx.get_info()
        # After error answers the connection is still reused.
        self.assertEqual(len({r[4] for r in srv.requests}), 1)
        # The file's path was made absolute under the user's home.
        self.assertIn("path=%2Fhome%2Fuser%2Fa.txt", srv.requests[0][1])

    def test_unreachable_server(self) -> None:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        tr = Transport("http://127.0.0.1:%d" % port, "k_secret")
        with self.assertRaises(airlock.TransportError) as cm:
            tr.call("GET", "/v1/info")
        self.assertTrue(cm.exception.retryable)
        self.assertNotIn("k_secret", str(cm.exception))

    def test_environment(self) -> None:
        with mock.patch.dict(os.environ, {"AIRLOCK_URL": "http://example.invalid:9/base/", "AIRLOCK_API_KEY": "k_env"}):
            tr = Transport()
        self.assertEqual((tr.host, tr.port, tr.base_path), ("example.invalid", 9, "/base"))
        self.assertEqual(tr.auth_headers()["Authorization"], "Bearer k_env")
        self.assertEqual(tr.target("/v1/x", {"a": "b c", "cmd": ["x", "y"], "n": None, "t": True}), "/base/v1/x?a=b%20c&cmd=x&cmd=y&t=true")
        with mock.patch.dict(os.environ, {}, clear=True):
            tr = Transport()
        self.assertEqual((tr.host, tr.port), ("127.0.0.1", 7070))
        with self.assertRaises(airlock.InvalidRequest):
            Transport("ftp://user:pw@host/")


class ExecStreamTest(Server):
    def test_stream_reattaches_after_a_drop(self) -> None:
        # The first stream delivers "hel" and drops; the re-attach replays
        # from the start of the chunk ("hello" at offset 0), of which only
        # "lo" is new, then a binary stderr chunk and the exit.
        attached: List[str] = []

        def route(h: Handler, body: bytes) -> None:
            if h.command == "POST":
                h.start_sse()
                h.chunk(sse("start", {"id": "ex_9"}))
                h.chunk(sse("stdout", {"data": "hel", "offset": 0}, "3"))
                h.close_connection = True  # no final chunk: the stream is cut
                return
            attached.append(h.path)
            h.start_sse()
            h.chunk(sse("stdout", {"data": "hello", "offset": 0}, "5"))
            h.chunk(b": heartbeat\n\n")
            h.chunk(sse("stderr", {"data": base64.b64encode(b"\xffE").decode(), "encoding": "base64", "offset": 5}, "7"))
            h.chunk(sse("exit", {"id": "ex_9", "exit_code": 3, "status": "exited", "truncated": False}))
            h.end_chunks()

        srv = self.serve(route)
        sbx = self.sandbox(srv)
        got: List[str] = []
        r = sbx.commands.run(["prog"], on_stdout=got.append, timeout=None)
        self.assertEqual(attached, ["/v1/sandboxes/sbx_1/execs/ex_9/events?from_offset=3"])
        self.assertEqual("".join(got), "hello")
        self.assertEqual(got, ["hel", "lo"])
        self.assertEqual((r.stdout, r.stderr_bytes, r.exit_code, r.exec_id), ("hello", b"\xffE", 3, "ex_9"))
        self.assertEqual(json.loads(srv.requests[0][3]), {"cmd": ["prog"]})
        self.assertEqual(srv.requests[0][2].get("Accept"), "text/event-stream")

    def test_callbacks_get_whole_characters(self) -> None:
        # A UTF-8 character split across two chunks (each base64, as the
        # server sends a chunk that is not valid UTF-8 alone).
        euro = "€".encode()

        def route(h: Handler, body: bytes) -> None:
            h.start_sse()
            h.chunk(sse("start", {"id": "ex_1"}))
            h.chunk(sse("stdout", {"data": base64.b64encode(b"a" + euro[:1]).decode(), "encoding": "base64", "offset": 0}))
            h.chunk(sse("stdout", {"data": base64.b64encode(euro[1:] + b"b").decode(), "encoding": "base64", "offset": 2}))
            h.chunk(sse("exit", {"id": "ex_1", "exit_code": 0, "status": "exited"}))
            h.end_chunks()

        srv = self.serve(route)
        got: List[str] = []
        r = self.sandbox(srv).commands.run("x", on_stdout=got.append)
        self.assertEqual(got, ["a", "€b"])
        self.assertEqual(r.stdout, "a€b")

    def test_drop_before_start_is_not_resent(self) -> None:
        # Without an exec id the command cannot be re-attached, and sending
        # it again could run it twice.
        def route(h: Handler, body: bytes) -> None:
            h.start_sse()
            h.close_connection = True

        srv = self.serve(route)
        with self.assertRaises(airlock.TransportError) as cm:
            self.sandbox(srv).commands.run("x", on_stdout=lambda s: None)
        self.assertIn("before the exec started", str(cm.exception))
        self.assertEqual(len(srv.requests), 1)

    def test_timeout_raises_with_the_output(self) -> None:
        def route(h: Handler, body: bytes) -> None:
            h.send_json(200, json.dumps({"id": "ex_2", "exit_code": None, "status": "timeout", "error_code": "exec_timeout",
                                         "stdout": "so far", "stderr": ""}).encode())

        srv = self.serve(route)
        with self.assertRaises(airlock.ExecTimeout) as cm:
            self.sandbox(srv).commands.run("sleep 9", timeout=2)
        self.assertEqual(cm.exception.result.stdout, "so far")
        self.assertIn("2s", str(cm.exception))
        self.assertEqual(json.loads(srv.requests[0][3])["timeout_s"], 2)

    def test_truncated_stream_takes_the_record(self) -> None:
        # Past the cap a stream sends samples; the result is the record's
        # kept head and tail, as the JSON mode returns.
        def route(h: Handler, body: bytes) -> None:
            if h.command == "GET":
                h.send_json(200, json.dumps({"id": "ex_3", "exit_code": 0, "status": "exited", "truncated": True,
                                             "stdout": "HEAD…TAIL", "stdout_dropped_bytes": 100}).encode())
                return
            h.start_sse()
            h.chunk(sse("start", {"id": "ex_3"}))
            h.chunk(sse("stdout", {"data": "HEAD", "offset": 0}))
            h.chunk(sse("stdout", {"data": "sample", "offset": 50}))
            h.chunk(sse("exit", {"id": "ex_3", "exit_code": 0, "status": "exited", "truncated": True}))
            h.end_chunks()

        srv = self.serve(route)
        r = self.sandbox(srv).commands.run("flood", on_stdout=lambda s: None)
        self.assertEqual((r.stdout, r.truncated), ("HEAD…TAIL", True))
        self.assertEqual(srv.requests[-1][1], "/v1/sandboxes/sbx_1/execs/ex_3")

    def test_code_events(self) -> None:
        png = base64.b64encode(b"\x89PNG...").decode()

        def route(h: Handler, body: bytes) -> None:
            h.send_response(200)
            h.send_header("Content-Type", "application/x-ndjson")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for ev in (
                {"type": "stdout", "text": "a\n"},
                {"type": "result", "is_main_result": False, "png": png, "text": "<Figure>"},
                {"type": "result", "is_main_result": True, "text": "42", "json": {"k": [1, 2]}},
                {"type": "error", "name": "ValueError", "value": "bad", "traceback": "tb"},
                {"type": "end", "execution_count": 7},
            ):
                h.chunk(json.dumps(ev).encode() + b"\n")
            h.end_chunks()

        srv = self.serve(route)
        results: List[Any] = []
        ex = self.sandbox(srv).run_code("x", on_result=results.append)
        self.assertEqual((ex.stdout, ex.text, ex.execution_count), ("a\n", "42", 7))
        self.assertEqual(ex.results[0].png, b"\x89PNG...")
        self.assertEqual(ex.results[0].formats(), ["text", "png"])
        self.assertEqual(ex.results[1].json, {"k": [1, 2]})
        self.assertEqual((ex.error.name, ex.error.value), ("ValueError", "bad"))
        self.assertEqual(len(results), 2)
        self.assertEqual(srv.requests[0][2].get("Accept"), "application/x-ndjson")


class AsyncCancelTest(Server):
    def test_cancel_ends_the_worker(self) -> None:
        import asyncio
        release = threading.Event()

        def route(h: Handler, body: bytes) -> None:
            h.start_sse()
            h.chunk(sse("start", {"id": "ex_1"}))
            release.wait(10)  # a command that runs on

        srv = self.serve(route)
        sbx = airlock.AsyncSandbox(self.sandbox(srv))

        async def main() -> float:
            loop = asyncio.get_running_loop()
            task = asyncio.ensure_future(sbx.commands.run("sleep 100", on_stdout=lambda s: None))
            await asyncio.sleep(0.3)
            t0 = loop.time()
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            # The call's thread ended (its socket was shut down): nothing of
            # it is left running in the pool.
            await asyncio.sleep(0.2)
            return loop.time() - t0

        try:
            asyncio.run(main())
            busy = [t.name for t in threading.enumerate() if t.name.startswith("airlock") and t.is_alive()]
            # pool threads idle in their queue; none is inside a read
            for t in threading.enumerate():
                if t.name.startswith("airlock"):
                    frames = __import__("sys")._current_frames().get(t.ident)
                    stack = __import__("traceback").format_stack(frames) if frames else []
                    self.assertFalse(any("readline" in f for f in stack), "a worker still reads: %s" % busy)
        finally:
            release.set()

    def test_async_callbacks_run_on_the_loop(self) -> None:
        import asyncio

        def route(h: Handler, body: bytes) -> None:
            h.start_sse()
            h.chunk(sse("start", {"id": "ex_1"}))
            h.chunk(sse("stdout", {"data": "x", "offset": 0}))
            h.chunk(sse("stdout", {"data": "y", "offset": 1}))
            h.chunk(sse("exit", {"id": "ex_1", "exit_code": 0, "status": "exited"}))
            h.end_chunks()

        srv = self.serve(route)
        sbx = airlock.AsyncSandbox(self.sandbox(srv))

        async def main() -> None:
            loop_thread = threading.get_ident()
            seen: List[Any] = []

            async def on_out(s: str) -> None:
                seen.append((s, threading.get_ident() == loop_thread))
                await asyncio.sleep(0)

            r = await sbx.commands.run("x", on_stdout=on_out)
            self.assertEqual(r.stdout, "xy")
            self.assertEqual(seen, [("x", True), ("y", True)])

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
