"""Sandboxes, commands, files, terminals and code against a real daemon."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
import time
import unittest
from typing import List

import airlock
from airlock import Sandbox

from daemon import KEY, OTHER_KEY, URL, needs_daemon, token


@needs_daemon
class SandboxLifecycleTest(unittest.TestCase):
    def test_create_runs_and_deletes_on_exit(self) -> None:
        mark = token()
        with Sandbox.create(template="base", ttl=120, metadata={"t": mark}, env={"GREETING": "hi"}, secrets={"TOKEN": mark}) as sbx:
            self.assertTrue(sbx.id.startswith("sbx_"))
            self.assertEqual((sbx.template, sbx.state), ("base", "running"))
            self.assertIn(sbx.runtime, ("runc", "gvisor"))
            self.assertIsNotNone(sbx.info.expires_at)
            left = (sbx.info.expires_at - sbx.info.created_at).total_seconds()
            self.assertTrue(100 <= left <= 130, left)
            r = sbx.commands.run('echo "$GREETING [$TOKEN]"')
            self.assertTrue(r.stdout.startswith("hi ["), r.stdout)
            self.assertNotIn(mark, r.stdout)  # secrets are masked in output
            self.assertEqual(len(r.stdout), len("hi [%s]\n" % mark))
            # Found by its metadata, connected to by id.
            self.assertEqual([s.id for s in Sandbox.list(metadata={"t": mark})], [sbx.id])
            other = Sandbox.connect(sbx.id)
            self.assertEqual((other.id, other.runtime), (sbx.id, sbx.runtime))
            other.close()
        self.assertEqual(Sandbox.connect(sbx.id).state, "stopped")
        self.assertEqual(Sandbox.list(metadata={"t": mark}, state="running"), [])

    def test_deleted_when_the_block_raises(self) -> None:
        with self.assertRaises(ZeroDivisionError):
            with Sandbox.create(template="base") as sbx:
                1 / 0
        self.assertEqual(Sandbox.connect(sbx.id).state, "stopped")
        sbx.kill()  # deleting again is no error

    def test_other_tenant_and_bad_key(self) -> None:
        with Sandbox.create(template="base") as sbx:
            if OTHER_KEY:
                with self.assertRaises(airlock.SandboxNotFound) as cm:
                    Sandbox.connect(sbx.id, api_key=OTHER_KEY)
                self.assertEqual(cm.exception.status, 404)
                self.assertNotIn(sbx.id, [s.id for s in Sandbox.list(api_key=OTHER_KEY)])
            with self.assertRaises(airlock.Unauthorized):
                Sandbox.connect(sbx.id, api_key="ak_not_a_key")
        with self.assertRaises(airlock.SandboxNotFound):
            Sandbox.connect("sbx_" + "a" * 24)

    def test_runtimes(self) -> None:
        with self.assertRaises(airlock.InvalidRequest):
            Sandbox.create(runtime="nope")
        with self.assertRaises(airlock.RuntimeUnavailable) as cm:
            Sandbox.create(runtime="kubernetes")
        self.assertFalse(cm.exception.retryable)
        # gVisor: what this host's daemon says it has is what a create gets.
        import http.client
        import urllib.parse
        u = urllib.parse.urlsplit(URL)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        c.request("GET", "/v1/info", headers={"Authorization": "Bearer " + KEY})
        drivers = {d["name"]: d["health"] for d in json.loads(c.getresponse().read())["drivers"]}
        c.close()
        if drivers.get("gvisor") == "healthy":
            with Sandbox.create(template="base", runtime="gvisor") as g:
                self.assertEqual(g.runtime, "gvisor")
                self.assertEqual(g.commands.run("echo ok").stdout, "ok\n")
        else:
            with self.assertRaises(airlock.RuntimeUnavailable):
                Sandbox.create(template="base", runtime="gvisor")

    def test_pause_resume_ttl(self) -> None:
        with Sandbox.create(template="base", ttl=60) as sbx:
            before = sbx.info.expires_at
            self.assertGreater(sbx.set_ttl(600).expires_at, before)
            self.assertEqual(sbx.pause().state, "paused")
            with self.assertRaises(airlock.InvalidState):
                sbx.commands.run("true")
            self.assertEqual(sbx.resume().state, "running")
            self.assertTrue(sbx.is_running())
            self.assertEqual(sbx.commands.run("echo back").stdout, "back\n")
            self.assertIn("memory_bytes", sbx.metrics())


@needs_daemon
class CommandsTest(unittest.TestCase):
    sbx: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sbx = Sandbox.create(template="base", ttl=600)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sbx.kill()
        cls.sbx.close()

    def test_result(self) -> None:
        r = self.sbx.commands.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.status, r.ok), ("out\n", "err\n", 3, "exited", False))
        self.assertTrue(r.exec_id.startswith("ex_"))
        self.assertTrue(self.sbx.commands.run("true").ok)

    def test_argv_has_no_shell(self) -> None:
        self.assertEqual(self.sbx.commands.run(["echo", "$HOME", "a b"]).stdout, "$HOME a b\n")

    def test_binary_output(self) -> None:
        r = self.sbx.commands.run(["sh", "-c", r"printf '\377\000ok'"])
        self.assertEqual(r.stdout_bytes, b"\xff\x00ok")
        got: List[str] = []
        r = self.sbx.commands.run(["sh", "-c", r"printf '\377\000ok'"], on_stdout=got.append)
        self.assertEqual(r.stdout_bytes, b"\xff\x00ok")
        self.assertEqual("".join(got), "\ufffd\x00ok")

    def test_streaming(self) -> None:
        got: List[tuple] = []
        errs: List[str] = []
        r = self.sbx.commands.run(
            "echo one; sleep 1.5; echo two >&2; echo three",
            on_stdout=lambda s: got.append((s, time.monotonic())), on_stderr=errs.append,
        )
        done = time.monotonic()
        self.assertEqual("".join(s for s, _ in got), "one\nthree\n")
        self.assertEqual((r.stdout, r.stderr, "".join(errs), r.exit_code), ("one\nthree\n", "two\n", "two\n", 0))
        # "one" was delivered while the command still ran, not at its end.
        self.assertGreater(done - got[0][1], 1.0)

    def test_user_cwd_env(self) -> None:
        c = self.sbx.commands
        self.assertEqual(c.run("id -un; pwd").stdout, "user\n/home/user\n")
        self.assertEqual(c.run("id -un; pwd", user="root", cwd="/tmp").stdout, "root\n/tmp\n")
        self.sbx.files.make_dir("proj/sub")
        self.assertEqual(c.run("pwd", cwd="proj/sub").stdout, "/home/user/proj/sub\n")
        self.assertEqual(c.run("pwd", cwd=".", user="root").stdout, "/root\n")
        self.assertEqual(c.run('echo "$X"', env={"X": "y z"}).stdout, "y z\n")
        self.assertEqual(c.run("cat", stdin="from stdin").stdout, "from stdin")
        with self.assertRaises(airlock.InvalidRequest):
            c.run("true", user="nobody_here")
        r = c.run(["no-such-program"])
        self.assertEqual((r.status, r.exit_code, r.error_code), ("error", 127, "exec_failed"))

    def test_timeout(self) -> None:
        for stream in (False, True):
            with self.assertRaises(airlock.ExecTimeout) as cm:
                self.sbx.commands.run("echo before; sleep 30", timeout=1, on_stdout=(lambda s: None) if stream else None)
            res = cm.exception.result
            self.assertEqual((res.status, res.error_code, res.stdout), ("timeout", "exec_timeout", "before\n"))
            self.assertLess(res.duration_ms, 20000)

    def test_background_stdin(self) -> None:
        h = self.sbx.commands.run("cat; echo end", background=True)
        self.assertTrue(h.exec_id.startswith("ex_"))
        h.send_stdin("ab")
        h.send_stdin(b"c\n", eof=True)
        r = h.wait()
        self.assertEqual((r.stdout, r.exit_code), ("abc\nend\n", 0))

    def test_background_kill(self) -> None:
        got: List[str] = []
        h = self.sbx.commands.run("echo started; sleep 60", background=True, timeout=None, on_stdout=got.append)
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(got, ["started\n"])
        self.assertTrue(h.kill())
        r = h.wait()
        self.assertEqual((r.status, r.stdout), ("killed", "started\n"))
        self.assertFalse(h.kill())  # gone already

    def test_background_callbacks_and_reconnect(self) -> None:
        got: List[str] = []
        h = self.sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", background=True, on_stdout=got.append)
        r = h.wait()
        self.assertEqual(("".join(got), r.stdout), ("1\n2\n3\n", "1\n2\n3\n"))
        # Another handle on the same exec replays its output.
        again: List[str] = []
        r2 = self.sbx.commands.connect(h.exec_id).wait(on_stdout=again.append)
        self.assertEqual(("".join(again), r2.stdout, r2.exec_id), ("1\n2\n3\n", "1\n2\n3\n", h.exec_id))
        self.assertIn(h.exec_id, [e.exec_id for e in self.sbx.commands.list(limit=50)])
        with self.assertRaises(airlock.ExecNotFound):
            self.sbx.commands.connect("ex_" + "b" * 24).wait()

    def test_code_needs_a_kernel(self) -> None:
        with self.assertRaises(airlock.TemplateUnsupported):
            self.sbx.run_code("1")


@needs_daemon
class FilesTest(unittest.TestCase):
    sbx: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sbx = Sandbox.create(template="base", ttl=600)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sbx.kill()
        cls.sbx.close()

    def test_relative_to_home(self) -> None:
        f = self.sbx.files
        w = f.write("docs/a.txt", "héllo")
        self.assertEqual((w.path, w.size), ("/home/user/docs/a.txt", 6))
        self.assertEqual(f.read("docs/a.txt"), "héllo")
        self.assertEqual(f.read("/home/user/docs/a.txt", format="bytes"), "héllo".encode())
        self.assertEqual(self.sbx.commands.run("cat docs/a.txt; stat -c %U docs/a.txt").stdout, "héllo" + "user\n")
        w = f.write("r.txt", "root's", user="root")
        self.assertEqual(w.path, "/root/r.txt")
        self.assertEqual(self.sbx.commands.run("cat /root/r.txt", user="root").stdout, "root's")
        with self.assertRaises(airlock.InvalidRequest):
            f.read("../../etc/passwd")

    def test_bytes_and_streams(self) -> None:
        f = self.sbx.files
        every = bytes(range(256)) * 4
        f.write("bin/every", every)
        self.assertEqual(f.read("bin/every", format="bytes"), every)
        big = os.urandom(3 << 20)
        f.write("bin/big", io.BytesIO(big))  # no length: sent chunked
        self.assertEqual(hashlib.sha256(f.read("bin/big", format="bytes")).hexdigest(), hashlib.sha256(big).hexdigest())
        with tempfile.TemporaryFile() as tf:
            tf.write(b"from a file")
            tf.seek(5)
            self.assertEqual(f.write("bin/file", tf).size, 6)
        self.assertEqual(f.read("bin/file"), "a file")
        self.assertEqual(f.write("bin/empty", b"").size, 0)
        self.assertEqual(f.read("bin/empty", format="bytes"), b"")

    def test_mode_list_stat_remove(self) -> None:
        f = self.sbx.files
        f.write("tree/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
        f.write("tree/sub/b.txt", "b")
        self.assertEqual(f.get_info("tree/run.sh").mode, "0755")
        self.assertEqual(self.sbx.commands.run("./tree/run.sh").stdout, "ran\n")
        entries = f.list("tree")
        self.assertEqual(sorted((e.name, e.type) for e in entries), [("run.sh", "file"), ("sub", "dir")])
        self.assertIn("/home/user/tree/sub/b.txt", [e.path for e in f.list("tree", depth=2)])
        self.assertTrue(f.exists("tree/sub/b.txt"))
        self.assertFalse(f.exists("tree/nope"))
        with self.assertRaises(airlock.NotFound):
            f.read("tree/nope")
        moved = f.rename("tree/sub/b.txt", "tree/c.txt")
        self.assertEqual(moved.path, "/home/user/tree/c.txt")
        with self.assertRaises(airlock.InvalidRequest):
            f.remove("tree")  # not empty
        f.remove("tree/c.txt")
        self.assertFalse(f.exists("tree/c.txt"))
        f.remove("tree", recursive=True)
        self.assertFalse(f.exists("tree"))
        self.assertTrue(f.make_dir("made/deep").is_dir)

    def test_watch(self) -> None:
        f = self.sbx.files
        f.make_dir("watched")
        with f.watch("watched") as w:
            f.write("watched/new.txt", "x")
            seen = []
            while not any(e.type == "create" and e.path == "/home/user/watched/new.txt" for e in seen):
                seen.append(w.next(timeout=20))
            f.remove("watched", recursive=True)
            # The watched directory going away ends the watch.
            deadline = time.monotonic() + 20
            while True:
                ev = w.next(timeout=max(deadline - time.monotonic(), 0.1))
                if ev is None:
                    break
            self.assertIsNone(w.next(timeout=1))

    def test_watch_close(self) -> None:
        self.sbx.files.make_dir("w2")
        w = self.sbx.files.watch("w2", recursive=True)
        with self.assertRaises(TimeoutError):
            w.next(timeout=0.2)
        w.close()
        self.assertIsNone(w.next(timeout=5))


@needs_daemon
class PtyTest(unittest.TestCase):
    sbx: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sbx = Sandbox.create(template="base", ttl=600)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sbx.kill()
        cls.sbx.close()

    def read_until(self, p: airlock.PtySession, want: bytes, timeout: float = 20) -> bytes:
        buf = b""
        deadline = time.monotonic() + timeout
        while want not in buf:
            b = p.read(timeout=max(deadline - time.monotonic(), 0.01))
            if not b:
                self.fail("terminal ended before %r: %r" % (want, buf))
            buf += b
        return buf

    def test_shell(self) -> None:
        with self.sbx.pty.create(cmd=["/bin/sh"]) as p:
            p.write("echo $((6*7)); tty\n")
            out = self.read_until(p, b"42")
            self.read_until(p, b"/dev/pts/")
            p.write("exit 3\n")
            res = p.wait(timeout=20)
        self.assertIn(b"42", out)
        self.assertIsNotNone(res)
        self.assertEqual(res.exit_code, 3)

    def test_resize(self) -> None:
        with self.sbx.pty.create(cols=50, rows=10, cmd="stty size; read x; stty size") as p:
            self.read_until(p, b"10 50")
            p.resize(100, 30)
            time.sleep(0.2)
            p.write("\r")
            self.read_until(p, b"30 100")
            p.wait(timeout=20)
        self.assertEqual(p.exit.exit_code, 0)

    def test_large_output(self) -> None:
        # Frames of every length class, as the server sends them.
        n = 300000
        with self.sbx.pty.create(cmd=["sh", "-c", "head -c %d /dev/zero | tr '\\0' a" % n]) as p:
            total = 0
            for b in p:
                total += b.count(b"a")
        self.assertEqual(total, n)
        self.assertEqual(p.exit.exit_code, 0)

    def test_close_hangs_up(self) -> None:
        p = self.sbx.pty.create(cmd=["sh", "-c", "echo ready; sleep 60"])
        self.read_until(p, b"ready")
        p.close()
        self.assertTrue(p.closed)
        # The terminal's process got SIGHUP: its exec ended.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            execs = [e for e in self.sbx.commands.list(limit=20) if "sleep 60" in json.dumps(e.raw)]
            if execs and execs[0].status != "running":
                break
            time.sleep(0.2)
        self.assertTrue(execs, "no exec record of the terminal")
        self.assertNotEqual(execs[0].status, "running")


@needs_daemon
class CodeTest(unittest.TestCase):
    sbx: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sbx = Sandbox.create(template="code-interpreter", ttl=900)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sbx.kill()
        cls.sbx.close()

    def test_state_text_and_stdout(self) -> None:
        out: List[str] = []
        self.sbx.run_code("x = 40")
        ex = self.sbx.run_code("print('hi')\nx + 2", on_stdout=out.append)
        self.assertEqual((ex.text, ex.stdout, "".join(out)), ("42", "hi\n", "hi\n"))
        self.assertIsNone(ex.error)
        self.assertGreater(ex.execution_count, 1)

    def test_figure_html_json(self) -> None:
        ex = self.sbx.run_code(
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3]); plt.title('t'); plt.show()\n"
            "from IPython.display import HTML, JSON, display\n"
            "display(HTML('<b>bold</b>')); display(JSON({'a': [1, 2]}))\n"
        )
        self.assertIsNone(ex.error, ex.error)
        pngs = [r.png for r in ex.results if r.png]
        self.assertTrue(pngs and pngs[0].startswith(b"\x89PNG\r\n\x1a\n"), [r.formats() for r in ex.results])
        self.assertIn("<b>bold</b>", [r.html for r in ex.results])
        self.assertIn({"a": [1, 2]}, [r.json for r in ex.results])
        charts = [r.chart for r in ex.results if r.chart]
        self.assertTrue(charts and charts[0].get("title") == "t", charts)

    def test_errors_are_results(self) -> None:
        errs: List[airlock.ExecutionError] = []
        self.sbx.run_code("kept = 'yes'")
        ex = self.sbx.run_code("1/0", on_error=errs.append)
        self.assertEqual((ex.error.name, ex.error.value), ("ZeroDivisionError", "division by zero"))
        self.assertIn("ZeroDivisionError", ex.error.traceback)
        self.assertEqual(errs, [ex.error])
        ex = self.sbx.run_code("import time; time.sleep(30)", timeout=1)
        self.assertIsNotNone(ex.error)
        self.assertEqual(self.sbx.run_code("kept").text, "'yes'")  # state kept after the interrupt

    def test_languages_and_contexts(self) -> None:
        self.assertEqual(self.sbx.run_code("echo $((1+2))", language="bash").stdout, "3\n")
        self.assertEqual(self.sbx.run_code("1 + 2", language="javascript").text, "3")
        ctx = self.sbx.create_code_context("python")
        try:
            self.assertIn(ctx.id, [c.id for c in self.sbx.list_code_contexts()])
            ex = self.sbx.run_code("x", context=ctx)  # its own state: no x there
            self.assertEqual(ex.error.name, "NameError")
            self.sbx.run_code("y = 5", context=ctx)
            self.sbx.restart_code_context(ctx)
            self.assertEqual(self.sbx.run_code("y", context=ctx.id).error.name, "NameError")
        finally:
            self.sbx.remove_code_context(ctx)
        self.assertNotIn(ctx.id, [c.id for c in self.sbx.list_code_contexts()])


if __name__ == "__main__":
    unittest.main()
