// Sandbox.create against a scripted server: the request body, waiting for
// a template's build, retrying a create whose answer was lost.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import { Sandbox, TemplateBuildingError } from "../../dist/index.js";

const sandbox = { id: "sbx_made", tenant: "t", template: "code-interpreter", template_version: 2, runtime: "gvisor", state: "running", created_at: "2026-01-01T00:00:00Z", expires_at: "2026-01-01T00:05:00Z", resources: { cpu: 2, memory_mb: 1024 }, network: { mode: "allowlist", allow: ["pypi.org"] }, ready_ms: 40 };

async function server(answer) {
  const seen = [];
  const srv = http.createServer(async (req, res) => {
    let body = "";
    for await (const c of req) body += c;
    seen.push({ method: req.method, url: req.url, body: body ? JSON.parse(body) : undefined, key: req.headers["idempotency-key"] });
    answer(req, res, seen.length);
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${srv.address().port}`, seen, close: () => srv.close() };
}

const created = (res) => {
  res.writeHead(201, { "content-type": "application/json" });
  res.end(JSON.stringify(sandbox));
};

test("create sends the API's fields and reads the sandbox back in camelCase", async () => {
  const s = await server((req, res) => created(res));
  try {
    const sbx = await Sandbox.create({
      url: s.url,
      apiKey: "k",
      template: "code-interpreter",
      runtime: "gvisor",
      ttl: 300,
      env: { A: "1" },
      secrets: { S: "x" },
      secretsAsFiles: true,
      metadata: { user: "u-42" },
      network: ["pypi.org"],
      resources: { cpu: 2, memoryMb: 1024, diskMb: 2048, pids: 64 },
      volumes: [{ name: "vol", path: "/data", readOnly: true }],
    });
    assert.deepEqual(s.seen[0].body, {
      template: "code-interpreter",
      runtime: "gvisor",
      timeout_s: 300,
      env: { A: "1" },
      secrets: { S: "x" },
      secrets_as_files: true,
      metadata: { user: "u-42" },
      network: { mode: "allowlist", allow: ["pypi.org"] },
      resources: { cpu: 2, memory_mb: 1024, disk_mb: 2048, pids: 64 },
      volumes: [{ name: "vol", path: "/data", read_only: true }],
    });
    assert.equal(s.seen[0].url, "/v1/sandboxes");
    assert.match(s.seen[0].key, /^ts-[0-9a-f]{32}$/, "every create carries an idempotency key");
    assert.equal(sbx.id, "sbx_made");
    assert.equal(sbx.runtime, "gvisor");
    assert.equal(sbx.info.templateVersion, 2);
    assert.deepEqual(sbx.info.resources, { cpu: 2, memoryMb: 1024 });
    assert.deepEqual(sbx.info.network, { mode: "allowlist", allow: ["pypi.org"] });
    assert.deepEqual(sbx.info.expiresAt, new Date("2026-01-01T00:05:00Z"));
    await Sandbox.create({ url: s.url, network: "open" });
    assert.deepEqual(s.seen[1].body, { network: { mode: "open" } });
  } finally {
    s.close();
  }
});

const building = (res) => {
  res.writeHead(503, { "content-type": "application/json", "retry-after": "1" });
  res.end(JSON.stringify({ error: { code: "template_building", message: "template is being built", build_id: "bld_1" } }));
};

test("create waits for a template's build (Retry-After) and then makes the sandbox", async () => {
  const s = await server((req, res, n) => (n === 1 ? building(res) : created(res)));
  try {
    const sbx = await Sandbox.create({ url: s.url, template: "code-interpreter" });
    assert.equal(sbx.id, "sbx_made");
    assert.equal(s.seen.length, 2);
  } finally {
    s.close();
  }
});

test("waitForTemplate: false throws TemplateBuildingError with the build", async () => {
  const s = await server((req, res) => building(res));
  try {
    await assert.rejects(Sandbox.create({ url: s.url, waitForTemplate: false }), (e) => {
      assert.ok(e instanceof TemplateBuildingError);
      assert.equal(e.buildId, "bld_1");
      assert.equal(e.retryAfter, 1);
      return true;
    });
    assert.equal(s.seen.length, 1);
  } finally {
    s.close();
  }
});

test("a create whose answer was lost is retried with the same idempotency key", async () => {
  const s = await server((req, res, n) => (n === 1 ? res.socket.destroy() : created(res)));
  try {
    const sbx = await Sandbox.create({ url: s.url, idempotencyKey: "mine" });
    assert.equal(sbx.id, "sbx_made");
    assert.deepEqual(s.seen.map((r) => r.key), ["mine", "mine"]);
  } finally {
    s.close();
  }
});
