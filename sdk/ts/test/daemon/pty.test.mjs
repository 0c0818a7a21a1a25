// Terminals against the real daemon, with both WebSocket clients: this
// node's and, in a child node, the other kind (the global WebSocket of
// Node ≥ 22 or behind --experimental-websocket in Node 20; the SDK's own
// client over node:http where there is none).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";

import { Sandbox, SandboxNotFoundError, InvalidRequestError, AirlockError } from "../../dist/index.js";
import { webSocketKind } from "../../dist/websocket.js";
import { daemon, eventually } from "./helpers.mjs";

let sbx;
before(async () => {
  if (!daemon.skip) sbx = await Sandbox.create({ ttl: 600 });
});
after(async () => {
  await sbx?.kill();
});

const decode = (d) => new TextDecoder().decode(d);

test(`a terminal (${webSocketKind()} WebSocket): input, resize, exit code`, daemon, async () => {
  let out = "";
  const pty = await sbx.pty.create({ cmd: ["/bin/sh"], cols: 100, rows: 30, onData: (d) => (out += decode(d)) });
  await pty.sendInput("stty size\n");
  await eventually(() => /30 100/.test(out), "the first size");
  await pty.resize({ cols: 120, rows: 40 });
  await pty.sendInput("stty size; echo $((6 * 7)); exit 7\n");
  const r = await pty.wait();
  assert.equal(r.exitCode, 7);
  assert.equal(r.status, "exited");
  assert.match(r.id, /^ex_/);
  assert.match(out, /30 100/);
  assert.match(out, /40 120/);
  assert.match(out, /\r\n42\r\n/);
});

test("kill hangs up the terminal", daemon, async () => {
  const pty = await sbx.pty.create({ cmd: ["sleep", "300"] });
  await pty.kill();
  assert.equal((await pty.wait()).status, "killed");
  const ps = await sbx.commands.run("ps -eo args");
  assert.ok(!ps.stdout.includes("sleep 300"), ps.stdout);
});

test("a terminal of a sandbox that is not there, or a user it lacks", daemon, async () => {
  const gone = await Sandbox.connect(sbx.id);
  const ghost = new Sandbox({ ...gone.info, id: "sbx_" + "q".repeat(24) }, gone["t"]);
  await assert.rejects(ghost.pty.create(), SandboxNotFoundError);
  if (webSocketKind() === "builtin") {
    await assert.rejects(sbx.pty.create({ user: "ghost" }), InvalidRequestError);
  } else {
    await assert.rejects(sbx.pty.create({ user: "ghost" }), AirlockError);
  }
});

test("the other WebSocket client, in a child node", daemon, async () => {
  const major = Number(process.versions.node.split(".")[0]);
  // Node 20 has the global behind a flag; Node 22 has it by default.
  const flag = webSocketKind() === "builtin" ? "--experimental-websocket" : "--no-experimental-websocket";
  if (major < 20 && flag === "--experimental-websocket") return; // Node 18 has no global WebSocket at all
  const child = fileURLToPath(new URL("./pty-child.mjs", import.meta.url));
  const stdout = await new Promise((resolve, reject) =>
    execFile(process.execPath, [flag, child], { env: { ...process.env, AIRLOCK_TEST_SANDBOX: sbx.id }, timeout: 60_000 }, (err, out, errOut) =>
      err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out),
    ),
  );
  const got = JSON.parse(stdout.trim().split("\n").pop());
  assert.notEqual(got.kind, webSocketKind(), "the child used the other client");
  assert.equal(got.exit.exitCode, 3);
  assert.match(got.out, /43 132/);
  assert.match(got.out, /\r\n42\r\n/);
  assert.ok(got.missing, "a cwd the sandbox lacks fails the terminal");
});
