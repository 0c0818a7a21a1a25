// Commands against a scripted server: the request run() sends, the
// re-attach after a dropped stream (no output lost or repeated), the idle
// watchdog, timeouts, truncated output, error events, relative paths.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import { Sandbox } from "../../dist/sandbox.js";
import { Transport } from "../../dist/transport.js";
import { ConnectionError, ExecTimeoutError, AgentUnavailableError, ExecNotFoundError } from "../../dist/index.js";
import { homeFromPasswd, joinPath } from "../../dist/files.js";

const info = { id: "sbx_1", tenant: "t", template: "base", template_version: 1, runtime: "runc", state: "running", created_at: "2026-01-01T00:00:00Z" };
// Streams are idle after 20 s here (a loaded machine is slow, never that
// slow); the idle test takes its own short one.
const tuning = { idleMs: 20_000, resumeAttempts: 3, backoffMs: 10 };

function sse(res) {
  res.writeHead(200, { "content-type": "text/event-stream" });
  return (event, data) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

/** A server whose routes are handlers of "METHOD /path" (query apart); it records every request. */
async function server(routes, tune = tuning) {
  const seen = [];
  const srv = http.createServer(async (req, res) => {
    const u = new URL(req.url, "http://x");
    let body = "";
    for await (const c of req) body += c;
    seen.push({ method: req.method, path: u.pathname, query: Object.fromEntries(u.searchParams), body, accept: req.headers.accept });
    const h = routes[`${req.method} ${u.pathname}`];
    if (!h) {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "not_found", message: "no route " + u.pathname } }));
      return;
    }
    h(req, res, { query: u.searchParams, body, n: seen.filter((s) => s.path === u.pathname).length });
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const sbx = new Sandbox(
    { id: "sbx_1", tenant: "t", template: "base", templateVersion: 1, runtime: "runc", state: "running", createdAt: new Date(), resources: {}, metadata: {}, network: { mode: "none" }, readyMs: 0 },
    new Transport({ url: `http://127.0.0.1:${srv.address().port}`, apiKey: "k" }),
    tune,
  );
  return { sbx, seen, close: () => srv.close() };
}

const exit = (extra = {}) => ({ id: "ex_1", exit_code: 0, status: "exited", duration_ms: 5, ...extra });

test("run sends a shell string as shell, an argv as cmd, and closes stdin of a foreground run", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      send("exit", exit());
      res.end();
    },
  });
  try {
    await s.sbx.commands.run("echo $HOME", { timeout: 5, user: "root", cwd: "work", env: { A: "1" } });
    await s.sbx.commands.run(["python3", "-c", "print(1)"], { stdin: "data" });
    const [a, b] = s.seen.map((r) => JSON.parse(r.body));
    assert.deepEqual(a, { shell: "echo $HOME", timeout_s: 5, user: "root", cwd: "/root/work", env: { A: "1" }, stdin: "" }, "a relative cwd is in the user's home");
    assert.deepEqual(b, { cmd: ["python3", "-c", "print(1)"], stdin: "data" });
    assert.equal(s.seen[0].accept, "text/event-stream");
  } finally {
    s.close();
  }
});

test("a dropped stream re-attaches from the last offset: nothing lost, nothing twice", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      send("stdout", { data: "hello ", offset: 0 });
      // Half an event, then the connection dies.
      res.write('event: stdout\ndata: {"data":"wor');
      setTimeout(() => res.socket.destroy(), 20);
    },
    "GET /v1/sandboxes/sbx_1/execs/ex_1/events": (req, res, { n }) => {
      const send = sse(res);
      if (n === 1) {
        // The first re-attach fails too, before any output.
        res.socket.destroy();
        return;
      }
      send("start", { id: "ex_1" });
      // The server replays from the start of a chunk the client had in part.
      send("stdout", { data: "lo world\n", offset: 3 });
      send("stderr", { data: Buffer.from([0xe2, 0x9c]).toString("base64"), encoding: "base64", offset: 15 });
      send("stderr", { data: Buffer.from([0x93, 0x0a]).toString("base64"), encoding: "base64", offset: 17 });
      send("exit", exit({ exit_code: 2 }));
      res.end();
    },
  });
  try {
    const outs = [];
    const errs = [];
    const r = await s.sbx.commands.run("x", { onStdout: (d) => outs.push(d), onStderr: (d) => errs.push(d) });
    assert.equal(r.stdout, "hello world\n");
    assert.deepEqual(outs, ["hello ", "world\n"]);
    assert.equal(r.stderr, "✓\n");
    assert.deepEqual(errs, ["✓\n"], "a character cut between chunks is delivered whole");
    assert.equal(r.exitCode, 2);
    const attaches = s.seen.filter((q) => q.path.endsWith("/events"));
    assert.deepEqual(attaches.map((q) => q.query.from_offset), ["6", "6"]);
    assert.equal(s.seen.filter((q) => q.method === "POST").length, 1, "the exec is never sent twice");
  } finally {
    s.close();
  }
});

test("a stream lost before the start event is an error: the command is not sent again", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => res.socket.destroy(),
  });
  try {
    await assert.rejects(s.sbx.commands.run("x"), ConnectionError);
    assert.equal(s.seen.length, 1);
  } finally {
    s.close();
  }
});

test("a silent stream (no heartbeat) is called dead and re-attached", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      sse(res)("start", { id: "ex_1" }); // then silence, connection open
    },
    "GET /v1/sandboxes/sbx_1/execs/ex_1/events": (req, res) => {
      const send = sse(res);
      send("stdout", { data: "late\n", offset: 0 });
      send("exit", exit());
      res.end();
    },
  }, { ...tuning, idleMs: 500 });
  try {
    const r = await s.sbx.commands.run("x");
    assert.equal(r.stdout, "late\n");
  } finally {
    s.close();
  }
});

test("a re-attach that keeps failing gives up with a ConnectionError", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      sse(res)("start", { id: "ex_1" });
      setTimeout(() => res.socket.destroy(), 10);
    },
    "GET /v1/sandboxes/sbx_1/execs/ex_1/events": (req, res) => res.socket.destroy(),
  });
  try {
    await assert.rejects(s.sbx.commands.run("x"), (e) => e instanceof ConnectionError && /lost after 4 attempts/.test(e.message));
  } finally {
    s.close();
  }
});

test("a re-attach answered 404 is not retried", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      sse(res)("start", { id: "ex_1" });
      setTimeout(() => res.socket.destroy(), 10);
    },
    "GET /v1/sandboxes/sbx_1/execs/ex_1/events": (req, res) => {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "exec_not_found", message: "exec not found" } }));
    },
  });
  try {
    await assert.rejects(s.sbx.commands.run("x"), ExecNotFoundError);
    assert.equal(s.seen.filter((q) => q.path.endsWith("/events")).length, 1);
  } finally {
    s.close();
  }
});

test("a timeout throws ExecTimeoutError with the output so far", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      send("stdout", { data: "partial", offset: 0 });
      send("exit", exit({ status: "timeout", exit_code: null, error_code: "exec_timeout" }));
      res.end();
    },
  });
  try {
    await assert.rejects(s.sbx.commands.run("sleep 9", { timeout: 1 }), (e) => {
      assert.ok(e instanceof ExecTimeoutError);
      assert.equal(e.code, "exec_timeout");
      assert.equal(e.result.stdout, "partial");
      assert.equal(e.sandboxId, "sbx_1");
      return true;
    });
  } finally {
    s.close();
  }
});

test("truncated output is taken from the exec's record (its kept head and tail)", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      send("stdout", { data: "head", offset: 0 });
      send("stdout", { data: "sample", offset: 5000 });
      send("exit", exit({ truncated: true }));
      res.end();
    },
    "GET /v1/sandboxes/sbx_1/execs/ex_1": (req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(exit({ truncated: true, stdout: Buffer.from("head…tail").toString("base64"), encoding: "base64", stderr: "" })));
    },
  });
  try {
    const r = await s.sbx.commands.run("flood");
    assert.equal(r.stdout, "head…tail");
    assert.equal(r.truncated, true);
  } finally {
    s.close();
  }
});

test("an error event in the stream is thrown as its class", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      send("error", { error: { code: "agent_unavailable", message: "the agent is gone" } });
      res.end();
    },
  });
  try {
    await assert.rejects(s.sbx.commands.run("x"), AgentUnavailableError);
  } finally {
    s.close();
  }
});

test("background: the handle comes at the start event; wait, stdin and kill use the exec id", async () => {
  let finish;
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      send("stdout", { data: "ready\n", offset: 0 });
      finish = () => {
        send("exit", exit({ status: "killed", exit_code: null, signal: "SIGKILL", error_code: "killed_by_user" }));
        res.end();
      };
    },
    "POST /v1/sandboxes/sbx_1/execs/ex_1/stdin": (req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    },
    "POST /v1/sandboxes/sbx_1/execs/ex_1/signal": (req, res) => {
      res.writeHead(204);
      res.end();
      finish();
    },
  });
  try {
    const h = await s.sbx.commands.run("server", { background: true });
    assert.equal(h.id, "ex_1");
    assert.equal(h.exitCode, undefined);
    await h.sendStdin("in");
    await h.closeStdin();
    assert.equal(await h.kill(), true);
    const r = await h.wait();
    assert.equal(r.status, "killed");
    assert.equal(r.signal, "SIGKILL");
    assert.equal(h.stdout, "ready\n");
    assert.equal(h.exitCode, null);
    const body = JSON.parse(s.seen[0].body);
    assert.equal("stdin" in body, false, "a background command's stdin stays open");
    const stdin = s.seen.filter((q) => q.path.endsWith("/stdin"));
    assert.deepEqual(stdin.map((q) => [q.body, q.query.eof]), [["in", undefined], ["", "true"]]);
    assert.equal(JSON.parse(s.seen.find((q) => q.path.endsWith("/signal")).body).signal, "SIGKILL");
  } finally {
    s.close();
  }
});

test("relative paths start from the home /etc/passwd names; hostile entries are not believed", async () => {
  const passwd = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/srv/u:/bin/sh\nevil:x:1001:1001::../../etc:/bin/sh\n";
  const s = await server({
    "GET /v1/sandboxes/sbx_1/files": (req, res, { query }) => {
      res.writeHead(200, { "content-type": "application/octet-stream" });
      res.end(query.get("path") === "/etc/passwd" ? passwd : "content of " + query.get("path"));
    },
  });
  try {
    assert.equal(await s.sbx.files.read("a.txt"), "content of /srv/u/a.txt");
    assert.equal(await s.sbx.files.read("~/b.txt"), "content of /srv/u/b.txt");
    assert.equal(await s.sbx.files.read("/abs"), "content of /abs");
    assert.equal(await s.sbx.files.read("c", { user: "root" }), "content of /root/c");
    assert.equal(await s.sbx.files.read("d", { user: "evil" }), "content of /home/evil/d");
    const lookups = s.seen.filter((q) => q.query.path === "/etc/passwd");
    assert.equal(lookups.length, 2, "one lookup per user (root needs none)");
  } finally {
    s.close();
  }
  assert.equal(homeFromPasswd("user:x:1:1::/home/user:/bin/sh", "user"), "/home/user");
  assert.equal(homeFromPasswd("user:x:1:1::relative:/bin/sh", "user"), undefined);
  assert.equal(homeFromPasswd("other:x:1:1::/h:/bin/sh", "user"), undefined);
  assert.equal(joinPath("/home/user/", "x/y"), "/home/user/x/y");
  assert.equal(joinPath("/home/user", "."), "/home/user");
  assert.equal(joinPath("/home/user", "./z"), "/home/user/z");
});

test("a malformed event fails the run at once (re-attaching would read it again)", async () => {
  const s = await server({
    "POST /v1/sandboxes/sbx_1/exec": (req, res) => {
      const send = sse(res);
      send("start", { id: "ex_1" });
      res.write("event: stdout\ndata: {not json\n\n");
    },
  });
  try {
    await assert.rejects(s.sbx.commands.run("x"), (e) => e.code === "internal" && /malformed stdout event/.test(e.message));
    assert.equal(s.seen.length, 1, "no re-attach");
  } finally {
    s.close();
  }
});
