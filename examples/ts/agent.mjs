#!/usr/bin/env node
// An agent backend's tool call, end to end: the model writes a script, the
// backend runs it in a fresh sandbox and returns only output it has checked.
//
//   export AIRLOCK_URL=http://127.0.0.1:7070 AIRLOCK_API_KEY=ak_…
//   npm ci && node agent.mjs ["task"] [--timeout 30] [--runtime runc]
//
// The model call is stubbed (fakeModel): it answers the task "add 12, 8 and
// 5" with a fixed script, so the path can be checked before a model is
// added. The flow: create a sandbox with a short TTL and no network; check
// that it got the runtime asked for (a weaker one must not be accepted
// silently); write the script; run it as the unprivileged `user` with a
// timeout; treat its output as untrusted (exit code, size, JSON of the
// expected shape); and always delete the sandbox, also when something
// failed. The API key stays in this process: nothing of it reaches the
// sandbox.

import { parseArgs } from "node:util";
import { AirlockError, ExecTimeoutError, Sandbox } from "@airlock/sdk";

/** The most output this tool accepts from the task. */
const MAX_OUTPUT = 4096;

/** fakeModel stands in for the model: the script it would write for task. */
function fakeModel(task) {
  if (task.startsWith("add ")) {
    return ["import json", "values = [12, 8, 5]", "print(json.dumps({'total': sum(values)}))", ""].join("\n");
  }
  if (task.startsWith("loop")) return "while True:\n    pass\n";
  return "print('hello, I am not JSON')\n";
}

/** checkOutput returns the task's output if it is exactly what the application expects. */
function checkOutput(stdout) {
  if (new TextEncoder().encode(stdout).length > MAX_OUTPUT) throw new Error("task output exceeds the application limit");
  let out;
  try {
    out = JSON.parse(stdout);
  } catch {
    throw new Error("unexpected task output: not JSON");
  }
  const ok =
    out !== null && typeof out === "object" && !Array.isArray(out) &&
    Object.keys(out).length === 1 && Number.isInteger(out.total);
  if (!ok) throw new Error('unexpected task output: not {"total": <int>}');
  return out;
}

/** runTask runs the model's script for task in a sandbox of runtime and returns its checked output. */
async function runTask(task, runtime, timeout) {
  const script = fakeModel(task);
  const sbx = await Sandbox.create({ template: "base", runtime, ttl: 120, network: "none" });
  try {
    if (sbx.runtime !== runtime) throw new Error(`this task requires the ${runtime} runtime, got ${sbx.runtime}`);
    await sbx.files.write("task.py", script); // /home/user/task.py
    const r = await sbx.commands.run(["python3", "task.py"], { user: "user", timeout });
    if (r.exitCode !== 0 || r.truncated) throw new Error(`task failed (exit ${r.exitCode}): ${r.stderr.slice(-500)}`);
    return checkOutput(r.stdout);
  } finally {
    await sbx.kill();
  }
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { timeout: { type: "string", default: "30" }, runtime: { type: "string", default: "runc" } },
  });
  const task = positionals[0] ?? "add 12, 8 and 5";
  const timeout = Number(values.timeout);
  try {
    const out = await runTask(task, values.runtime, timeout);
    console.log(JSON.stringify(out));
    return 0;
  } catch (e) {
    if (e instanceof ExecTimeoutError) console.error(`task timed out after ${timeout}s and was killed`);
    else if (e instanceof AirlockError || e instanceof Error) console.error(`task failed: ${e.message}`);
    else throw e;
    return 1;
  }
}

process.exitCode = await main();
