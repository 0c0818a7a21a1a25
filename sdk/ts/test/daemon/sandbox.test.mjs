// Sandbox lifecycle against the real daemon.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  Sandbox,
  SandboxNotFoundError,
  QuotaExceededError,
  RateLimitedError,
  UnauthorizedError,
  RuntimeUnavailableError,
  TemplateNotFoundError,
  InvalidStateError,
  InvalidRequestError,
  AirlockError,
} from "../../dist/index.js";
import { daemon, key, withSandbox } from "./helpers.mjs";

test("create: ready at once, the runtime and template it got, ttl, env, metadata", daemon, async () => {
  const before = Date.now();
  await withSandbox({ ttl: 120, env: { GREETING: "hi there" }, metadata: { user: "u-42", suite: "ts" } }, async (sbx) => {
    assert.match(sbx.id, /^sbx_[a-z0-9]{20,}$/);
    assert.equal(sbx.runtime, "runc");
    assert.equal(sbx.template, "base");
    assert.equal(sbx.info.state, "running");
    assert.equal(sbx.state, "running");
    assert.equal(sbx.sandboxId, sbx.id);
    assert.deepEqual(sbx.info.metadata, { user: "u-42", suite: "ts" });
    const ttl = (sbx.info.expiresAt.getTime() - before) / 1000;
    assert.ok(ttl > 100 && ttl < 140, `expires in ${ttl}s, asked 120`);
    const r = await sbx.commands.run('printf %s "$GREETING"');
    assert.equal(r.stdout, "hi there");
    const later = await sbx.setTtl(600);
    assert.ok(later.expiresAt.getTime() > sbx.info.createdAt.getTime() + 500_000);
  });
});

test("secrets reach commands and are masked in their output", daemon, async () => {
  const secret = "s3cr3t-" + Math.random().toString(36).slice(2);
  await withSandbox({ secrets: { API_TOKEN: secret } }, async (sbx) => {
    const r = await sbx.commands.run('printf %s "$API_TOKEN"; printf %s "$API_TOKEN" | wc -c >&2');
    assert.equal(r.stdout, "*".repeat(secret.length));
    assert.equal(r.stderr.trim(), String(secret.length), "the command saw the real value");
    assert.ok(!JSON.stringify(r).includes(secret));
  });
});

test("connect, list and kill; another tenant sees nothing", daemon, async () => {
  const tag = "t-" + Math.random().toString(36).slice(2);
  const sbx = await Sandbox.create({ metadata: { tag } });
  try {
    const again = await Sandbox.connect(sbx.id);
    assert.equal(again.id, sbx.id);
    assert.equal(again.runtime, "runc");
    assert.equal((await again.commands.run("echo ok")).stdout, "ok\n");

    const mine = await Sandbox.list({ metadata: { tag } });
    assert.deepEqual(mine.map((s) => s.id), [sbx.id]);
    assert.ok((await Sandbox.list({ state: "running" })).some((s) => s.id === sbx.id));
    assert.deepEqual(await Sandbox.list({ metadata: { tag: "no-such-" + tag } }), []);

    const other = { apiKey: key("OTHER") };
    assert.ok(!(await Sandbox.list(other)).some((s) => s.id === sbx.id));
    await assert.rejects(Sandbox.connect(sbx.id, other), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(sbx.id, other), false, "another tenant cannot kill it");
    assert.equal(await sbx.isRunning(), true);
  } finally {
    await sbx.kill();
  }
  assert.equal(await sbx.isRunning(), false);
  await sbx.kill(); // twice is fine
  await assert.rejects(sbx.commands.run("true"), InvalidStateError);
  assert.ok(!(await Sandbox.list()).some((s) => s.id === sbx.id));
  await assert.rejects(Sandbox.connect("sbx_" + "a".repeat(24)), SandboxNotFoundError);
  assert.equal(await Sandbox.kill("sbx_" + "b".repeat(24)), false);
});

test("Symbol.asyncDispose kills the sandbox (await using)", daemon, async () => {
  const sbx = await Sandbox.create();
  assert.equal(typeof sbx[Symbol.asyncDispose], "function");
  await sbx[Symbol.asyncDispose]();
  assert.equal((await Sandbox.connect(sbx.id)).info.state, "stopped");
});

test("network shorthands and policies; metrics", daemon, async () => {
  await withSandbox({ network: ["pypi.org", "10.0.0.0/8:443"] }, async (sbx) => {
    assert.deepEqual(sbx.info.network.mode, "allowlist");
    assert.deepEqual([...sbx.info.network.allow].sort(), ["10.0.0.0/8:443", "pypi.org"]);
    const now = await sbx.setNetwork({ mode: "none" });
    assert.equal(now.mode, "none");
    assert.equal((await sbx.getInfo()).network.mode, "none");
    const m = await sbx.metrics();
    assert.ok(m.pids >= 1 && m.memoryBytes > 0 && m.uptimeS > 0, JSON.stringify(m));
  });
  await withSandbox({ network: "none" }, async (sbx) => assert.equal(sbx.info.network.mode, "none"));
});

test("pause and resume", daemon, async () => {
  await withSandbox({}, async (sbx) => {
    await sbx.commands.run("echo kept > state.txt");
    assert.equal((await sbx.pause()).state, "paused");
    assert.equal((await sbx.getInfo()).state, "paused");
    await assert.rejects(sbx.commands.run("true"), InvalidStateError);
    assert.equal((await sbx.resume()).state, "running");
    assert.equal(await sbx.files.read("state.txt"), "kept\n");
  });
});

test("an idempotency key returns the same sandbox", daemon, async () => {
  const idempotencyKey = "ts-idem-" + Math.random().toString(36).slice(2);
  const a = await Sandbox.create({ idempotencyKey });
  try {
    const b = await Sandbox.create({ idempotencyKey });
    assert.equal(b.id, a.id);
  } finally {
    await a.kill();
  }
});

test("errors by code: key, runtime, template, request", daemon, async () => {
  await assert.rejects(Sandbox.create({ apiKey: "ak_wrong" }), (e) => {
    assert.ok(e instanceof UnauthorizedError);
    assert.ok(e instanceof AirlockError);
    assert.equal(e.status, 401);
    assert.match(e.requestId, /^req_/);
    return true;
  });
  await assert.rejects(Sandbox.create({ runtime: "microvm" }), (e) => e instanceof RuntimeUnavailableError && e.status === 400);
  await assert.rejects(Sandbox.create({ template: "no-such-template" }), TemplateNotFoundError);
  await assert.rejects(Sandbox.create({ ttl: -5 }), InvalidRequestError);
});

test("a tenant over its quota gets QuotaExceededError with retryAfter", daemon, async () => {
  const opts = { apiKey: key("QUOTA") };
  const first = await Sandbox.create(opts);
  try {
    await assert.rejects(Sandbox.create(opts), (e) => {
      assert.ok(e instanceof QuotaExceededError, e.name);
      assert.equal(e.code, "quota_exceeded");
      assert.equal(e.status, 429);
      assert.ok(e.retryAfter > 0, `retryAfter ${e.retryAfter}`);
      return true;
    });
  } finally {
    await first.kill();
  }
  const again = await Sandbox.create(opts);
  await again.kill();
});

test("a key over its rate gets RateLimitedError with retryAfter", daemon, async () => {
  const opts = { apiKey: key("RATE") };
  let err;
  for (let i = 0; i < 5 && !err; i++) {
    try {
      await Sandbox.list(opts);
    } catch (e) {
      err = e;
    }
  }
  assert.ok(err instanceof RateLimitedError, String(err));
  assert.equal(err.status, 429);
  assert.ok(err.retryAfter > 0);
});
