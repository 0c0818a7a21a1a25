// Commands against the real daemon.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { Sandbox, ExecTimeoutError, InvalidRequestError, ExecNotFoundError } from "../../dist/index.js";
import { daemon, eventually } from "./helpers.mjs";

let sbx;
before(async () => {
  if (!daemon.skip) sbx = await Sandbox.create({ ttl: 600 });
});
after(async () => {
  await sbx?.kill();
});

test("a streamed run returns its output, and a non-zero exit is a result", daemon, async () => {
  const out = [];
  const err = [];
  const r = await sbx.commands.run("echo one; echo two >&2; echo three; exit 3", {
    onStdout: (d) => out.push(d),
    onStderr: (d) => err.push(d),
  });
  assert.equal(r.stdout, "one\nthree\n");
  assert.equal(r.stderr, "two\n");
  assert.equal(out.join(""), r.stdout);
  assert.equal(err.join(""), r.stderr);
  assert.equal(r.exitCode, 3);
  assert.equal(r.status, "exited");
  assert.match(r.id, /^ex_/);
  assert.ok(r.endedAt >= r.startedAt);
});

test("output arrives while the command still runs", daemon, async () => {
  // The command waits for stdin that is sent only once its first line
  // arrived: the run can only end if that line was delivered live.
  let h;
  const seen = [];
  h = await sbx.commands.run('echo ready; read line; echo "got $line"', {
    background: true,
    onStdout: (d) => {
      seen.push(d);
      if (d.includes("ready")) h.sendStdin("pong\n");
    },
  });
  if (seen.join("").includes("ready")) await h.sendStdin("pong\n"); // it came before h was set
  const r = await h.wait();
  assert.equal(r.stdout, "ready\ngot pong\n");
  assert.equal(r.exitCode, 0);
});

test("argv without a shell, user, cwd relative to the home, env", daemon, async () => {
  await sbx.files.makeDir("work dir");
  const r = await sbx.commands.run(["sh", "-c", 'printf "%s|%s|%s|%s" "$(id -u)" "$(pwd)" "$A" "$1"', "arg0", "$not-expanded"], {
    cwd: "work dir",
    env: { A: "x y" },
  });
  assert.equal(r.stdout, "1000|/home/user/work dir|x y|$not-expanded");
  const root = await sbx.commands.run("id -u; pwd", { user: "root" });
  assert.equal(root.stdout, "0\n/root\n");
});

test("a foreground run's stdin is closed (or given): never a hang", daemon, async () => {
  assert.equal((await sbx.commands.run("cat")).stdout, "");
  assert.equal((await sbx.commands.run("tr a-z A-Z", { stdin: "shout" })).stdout, "SHOUT");
});

test("a timeout throws ExecTimeoutError with what was printed; the tree is killed", daemon, async () => {
  const marker = "marker-" + Math.random().toString(36).slice(2);
  await assert.rejects(sbx.commands.run(`echo before; sh -c 'sleep 300; echo ${marker}' & sleep 300`, { timeout: 1 }), (e) => {
    assert.ok(e instanceof ExecTimeoutError, e.name);
    assert.equal(e.code, "exec_timeout");
    assert.equal(e.result.stdout, "before\n");
    assert.equal(e.sandboxId, sbx.id);
    return true;
  });
  const ps = await sbx.commands.run("ps -eo args");
  assert.ok(!ps.stdout.includes("sleep 300"), "the timed-out command's children are gone:\n" + ps.stdout);
});

test("output past maxOutputBytes keeps its head and tail", daemon, async () => {
  const r = await sbx.commands.run("echo HEAD; head -c 200000 /dev/zero | tr '\\0' x; echo; echo TAIL", { maxOutputBytes: 4096 });
  assert.equal(r.truncated, true);
  assert.ok(r.stdout.startsWith("HEAD\nxxx"), r.stdout.slice(0, 20));
  assert.ok(r.stdout.endsWith("xxx\nTAIL\n"), r.stdout.slice(-20));
  assert.ok(r.stdout.length <= 4096, `kept ${r.stdout.length} bytes`);
});

test("bytes that are not UTF-8 do not break the stream", daemon, async () => {
  const r = await sbx.commands.run("printf 'a\\377b\\n'; printf '\\342\\234\\223\\n'");
  assert.equal(r.stdout, "a\ufffdb\n✓\n");
});

test("a command that cannot start: 127, and a user the sandbox lacks: InvalidRequestError", daemon, async () => {
  const r = await sbx.commands.run(["no-such-program"]);
  assert.equal(r.exitCode, 127);
  assert.equal(r.status, "error");
  assert.equal(r.errorCode, "exec_failed");
  await assert.rejects(sbx.commands.run("true", { user: "ghost" }), InvalidRequestError);
  await assert.rejects(sbx.commands.run("true", { cwd: "/no/such/dir" }), InvalidRequestError);
});

test("background: stdin, kill, connect replays, list", daemon, async () => {
  const cat = await sbx.commands.run("cat", { background: true });
  await cat.sendStdin("line 1\n");
  await cat.sendStdin(new TextEncoder().encode("line 2\n"));
  await cat.closeStdin();
  const r = await cat.wait();
  assert.equal(r.stdout, "line 1\nline 2\n");
  const once = await sbx.commands.run("wc -c", { background: true });
  await once.sendStdin("four", { eof: true });
  assert.equal((await once.wait()).stdout.trim(), "4");
  const term = await sbx.commands.run("trap 'echo TERM; exit 9' TERM; echo armed; while :; do sleep 0.1; done", { background: true });
  await eventually(() => term.stdout === "armed\n", "the trap armed");
  assert.equal(await term.signal("SIGTERM"), true);
  const t = await term.wait();
  assert.equal(t.stdout, "armed\nTERM\n");
  assert.equal(t.exitCode, 9);
  assert.equal(cat.exitCode, 0);

  const sleeper = await sbx.commands.run("echo started; sleep 300", { background: true });
  await eventually(() => sleeper.stdout === "started\n", "the sleeper's first line");
  const follower = await sbx.commands.connect(sleeper.id);
  assert.equal(await sleeper.kill(), true);
  const killed = await sleeper.wait();
  assert.equal(killed.status, "killed");
  assert.equal(killed.exitCode, 137, "SIGKILL, as a shell reports it");
  const replay = await follower.wait();
  assert.equal(replay.stdout, "started\n", "connect replays from the start");
  assert.equal(replay.status, "killed");
  assert.equal(await sleeper.kill(), false, "it ended already");

  const list = await sbx.commands.list();
  const rec = list.find((c) => c.id === sleeper.id);
  assert.equal(rec?.status, "killed");
  assert.equal(rec.shell, "echo started; sleep 300");
  await assert.rejects(sbx.commands.connect("ex_" + "z".repeat(24)), ExecNotFoundError);
});

test("disconnect stops following; the command goes on", daemon, async () => {
  const h = await sbx.commands.run("sleep 1; echo done", { background: true });
  h.disconnect();
  await assert.rejects(h.wait(), /stopped following/);
  const again = await sbx.commands.connect(h.id);
  assert.equal((await again.wait()).stdout, "done\n");
});

test("aborting a foreground run kills its command", daemon, async () => {
  const ac = new AbortController();
  let id;
  await assert.rejects(
    sbx.commands.run("echo up; sleep 300", {
      signal: ac.signal,
      onStdout: () => ac.abort(new Error("enough")),
    }),
    /enough/,
  );
  const rec = await eventually(async () => {
    const list = await sbx.commands.list({ limit: 5 });
    const r = list.find((c) => c.shell === "echo up; sleep 300");
    id = r?.id;
    return r && r.status !== "running" ? r : undefined;
  }, "the aborted command ends");
  assert.equal(rec.status, "killed", id);
});
