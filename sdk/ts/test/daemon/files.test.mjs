// Files against the real daemon: paths relative to the user's home.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { Sandbox, NotFoundError, PermissionDeniedError, InvalidRequestError, InvalidStateError } from "../../dist/index.js";
import { daemon } from "./helpers.mjs";

let sbx;
before(async () => {
  if (!daemon.skip) sbx = await Sandbox.create({ ttl: 600 });
});
after(async () => {
  await sbx?.kill();
});

test("write and read: relative paths are in the user's home, text and bytes round-trip", daemon, async () => {
  const w = await sbx.files.write("notes/today.txt", "héllo\n");
  assert.deepEqual(w, { path: "/home/user/notes/today.txt", size: 7 });
  assert.equal(await sbx.files.read("/home/user/notes/today.txt"), "héllo\n");
  assert.equal(await sbx.files.read("~/notes/today.txt"), "héllo\n");
  assert.equal((await sbx.commands.run("cat notes/today.txt")).stdout, "héllo\n");

  const all = Uint8Array.from({ length: 256 }, (_, i) => i);
  await sbx.files.write("bin/all.bin", all);
  assert.deepEqual(await sbx.files.read("bin/all.bin", { format: "bytes" }), all);
  await sbx.files.write("bin/ab.bin", all.buffer);
  assert.equal((await sbx.files.getInfo("bin/ab.bin")).size, 256);
  assert.equal((await sbx.commands.run("sha256sum bin/all.bin bin/ab.bin | awk '{print $1}' | uniq | wc -l")).stdout, "1\n");
});

test("streams: write from an async iterable, read as one", daemon, async () => {
  const chunk = new Uint8Array(300_000).fill(65);
  async function* parts() {
    for (let i = 0; i < 4; i++) yield chunk;
  }
  const w = await sbx.files.write("big.txt", parts());
  assert.equal(w.size, 1_200_000);
  let n = 0;
  for await (const c of await sbx.files.read("big.txt", { format: "stream" })) {
    n += c.length;
    assert.ok(c.every((b) => b === 65));
  }
  assert.equal(n, 1_200_000);
});

test("list, stat, exists, makeDir, rename, remove", daemon, async () => {
  await sbx.files.makeDir("tree/a/b");
  await sbx.files.write("tree/a/file.txt", "x");
  const top = await sbx.files.list("tree");
  assert.deepEqual(top.map((e) => [e.name, e.path, e.type]), [["a", "/home/user/tree/a", "dir"]]);
  const deep = await sbx.files.list("tree", { depth: 3 });
  assert.deepEqual(deep.map((e) => e.path).sort(), ["/home/user/tree/a", "/home/user/tree/a/b", "/home/user/tree/a/file.txt"]);
  const st = await sbx.files.getInfo("tree/a/file.txt");
  assert.equal(st.type, "file");
  assert.equal(st.size, 1);
  assert.equal(st.uid, 1000);
  assert.ok(st.modifiedAt instanceof Date && !Number.isNaN(st.modifiedAt.getTime()));
  assert.equal(await sbx.files.exists("tree/a/file.txt"), true);
  assert.equal(await sbx.files.exists("tree/nothing"), false);
  const moved = await sbx.files.rename("tree/a/file.txt", "tree/moved.txt");
  assert.equal(moved.path, "/home/user/tree/moved.txt");
  assert.equal(await sbx.files.exists("tree/a/file.txt"), false);
  await assert.rejects(sbx.files.remove("tree"), (e) => e.status === 409 || e.status === 400, "not recursive unless asked");
  await sbx.files.remove("tree", { recursive: true });
  assert.equal(await sbx.files.exists("tree"), false);
  await assert.rejects(sbx.files.remove("tree"), NotFoundError);
  await assert.rejects(sbx.files.read("tree/moved.txt"), NotFoundError);
});

test("mode and user: an executable script, root's files are root's", daemon, async () => {
  await sbx.files.write("run.sh", "#!/bin/sh\necho ran as $(id -u)\n", { mode: 0o755 });
  assert.equal((await sbx.files.getInfo("run.sh")).mode, 0o755);
  assert.equal((await sbx.commands.run("./run.sh")).stdout, "ran as 1000\n");

  const w = await sbx.files.write("secret.txt", "root only", { user: "root", mode: 0o600 });
  assert.equal(w.path, "/root/secret.txt", "a relative path is in root's home for root");
  assert.equal(await sbx.files.read("secret.txt", { user: "root" }), "root only");
  await assert.rejects(sbx.files.read("/root/secret.txt"), PermissionDeniedError);
  await assert.rejects(sbx.files.read("../etc/passwd"), InvalidRequestError);
});

test("watch: changes in the tree, then the end when the directory goes", daemon, async () => {
  await sbx.files.makeDir("watched/sub");
  const seen = [];
  const w = await sbx.files.watch("watched", { recursive: true, onEvent: (e) => seen.push(e) });
  await sbx.files.write("watched/sub/a.txt", "1");
  await sbx.files.rename("watched/sub/a.txt", "watched/b.txt");
  await sbx.files.remove("watched", { recursive: true });
  const iterated = [];
  for await (const ev of w) iterated.push(ev); // ends with the directory
  await w.done;
  assert.deepEqual(iterated, seen);
  const types = seen.map((e) => `${e.type} ${e.path.replace("/home/user/", "")}`);
  // An upload shows as its create, then its write (as envd's in-place write).
  assert.deepEqual(types.slice(0, 3), ["create watched/sub/a.txt", "write watched/sub/a.txt", "rename watched/b.txt"]);
  assert.equal(seen[2].from, "/home/user/watched/sub/a.txt");
  assert.ok(types.includes("remove watched"), types.join(", "));
  assert.ok(seen.every((e) => e.time instanceof Date));
  await assert.rejects(sbx.files.watch("not-there"), NotFoundError);
});

test("stop() ends a watch; changes after it are not delivered", daemon, async () => {
  await sbx.files.makeDir("stopped");
  const seen = [];
  let exited = false;
  const w = await sbx.files.watch("stopped", { onEvent: (e) => seen.push(e), onExit: (err) => (exited = err === undefined) });
  await sbx.files.write("stopped/1", "x");
  for await (const ev of w) {
    assert.equal(ev.path, "/home/user/stopped/1");
    break; // return() stops the watch
  }
  await w.done;
  assert.equal(exited, true);
  await sbx.files.write("stopped/2", "x");
  assert.ok(!seen.some((e) => e.path.endsWith("/2")));
});

test("files of a deleted sandbox: InvalidStateError", daemon, async () => {
  const gone = await Sandbox.create();
  await gone.kill();
  await assert.rejects(gone.files.write("/tmp/x", "x"), InvalidStateError);
});
