"""The asyncio client against a real daemon."""

from __future__ import annotations

import asyncio
import time
import unittest
from typing import Any, List

import airlock
from airlock import AsyncSandbox

from daemon import needs_daemon


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@needs_daemon
class AsyncTest(unittest.TestCase):
    def test_flow(self) -> None:
        async def main() -> None:
            async with await AsyncSandbox.create(template="base", ttl=300) as sbx:
                self.assertEqual(sbx.state, "running")
                w = await sbx.files.write("a/b.txt", "async")
                self.assertEqual(w.path, "/home/user/a/b.txt")
                self.assertEqual(await sbx.files.read("a/b.txt"), "async")
                self.assertTrue(await sbx.files.exists("a/b.txt"))
                self.assertEqual([e.name for e in await sbx.files.list("a")], ["b.txt"])
                r = await sbx.commands.run("cat a/b.txt; exit 2")
                self.assertEqual((r.stdout, r.exit_code), ("async", 2))

                # Callbacks: coroutine functions and plain ones, on the loop.
                got: List[str] = []

                async def on_out(s: str) -> None:
                    await asyncio.sleep(0)
                    got.append(s)

                errs: List[str] = []
                r = await sbx.commands.run("echo 1; echo e >&2; sleep 0.2; echo 2", on_stdout=on_out, on_stderr=errs.append)
                self.assertEqual(("".join(got), "".join(errs), r.stdout), ("1\n2\n", "e\n", "1\n2\n"))

                with self.assertRaises(airlock.ExecTimeout):
                    await sbx.commands.run("sleep 30", timeout=1)

                h = await sbx.commands.run("cat", background=True)
                await h.send_stdin("in", eof=True)
                self.assertEqual((await h.wait()).stdout, "in")
                h = await sbx.commands.run("sleep 60", background=True, timeout=None)
                self.assertTrue(await h.kill())
                self.assertEqual((await h.wait()).status, "killed")

                self.assertEqual((await sbx.pause()).state, "paused")
                self.assertEqual((await sbx.resume()).state, "running")
                sid = sbx.id
            self.assertEqual((await AsyncSandbox.connect(sid)).state, "stopped")

        run(main())

    def test_concurrent_commands(self) -> None:
        # Five commands of 2 s each at once: together, not one after another.
        async def main() -> float:
            async with await AsyncSandbox.create(template="base") as sbx:
                t0 = time.monotonic()
                rs = await asyncio.gather(*(sbx.commands.run("sleep 2; echo %d" % i) for i in range(5)))
                took = time.monotonic() - t0
                self.assertEqual([r.stdout for r in rs], ["%d\n" % i for i in range(5)])
                return took

        self.assertLess(run(main()), 8.0)

    def test_cancel(self) -> None:
        # A cancelled run ends at once; the sandbox goes on serving.
        async def main() -> None:
            async with await AsyncSandbox.create(template="base") as sbx:
                task = asyncio.ensure_future(sbx.commands.run("sleep 30", timeout=60))
                await asyncio.sleep(0.5)
                t0 = time.monotonic()
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.assertLess(time.monotonic() - t0, 5)
                self.assertEqual((await sbx.commands.run("echo still")).stdout, "still\n")

        run(main())

    def test_watch_and_pty(self) -> None:
        async def main() -> None:
            async with await AsyncSandbox.create(template="base") as sbx:
                await sbx.files.make_dir("w")
                async with await sbx.files.watch("w") as w:
                    await sbx.files.write("w/f", "x")
                    ev = await w.next(timeout=20)
                    self.assertEqual((ev.type, ev.path), ("create", "/home/user/w/f"))
                    with self.assertRaises(TimeoutError):
                        while True:  # the write events that follow, then quiet
                            await w.next(timeout=0.5)
                    await sbx.files.remove("w", recursive=True)
                    rest = [e async for e in w]  # ends with the directory
                    self.assertIn("remove", [e.type for e in rest])

                p = await sbx.pty.create(cmd=["/bin/sh"])
                await p.write("echo $((7*6)); exit 4\n")
                out: List[bytes] = []
                res = await p.wait(on_data=out.append)
                self.assertIn(b"42", b"".join(out))
                self.assertEqual(res.exit_code, 4)
                await p.close()

        run(main())


@needs_daemon
class AsyncCodeTest(unittest.TestCase):
    def test_run_code(self) -> None:
        async def main() -> None:
            async with await AsyncSandbox.create(template="code-interpreter") as sbx:
                results: List[airlock.Result] = []

                async def on_result(r: airlock.Result) -> None:
                    results.append(r)

                ex = await sbx.run_code("print('x')\n6 * 7", on_result=on_result)
                self.assertEqual((ex.text, ex.stdout), ("42", "x\n"))
                self.assertEqual([r.text for r in results], ["42"])

        run(main())


if __name__ == "__main__":
    unittest.main()
