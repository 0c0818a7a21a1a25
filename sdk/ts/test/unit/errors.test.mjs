// Error mapping: every code the server answers with becomes its class.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import * as sdk from "../../dist/index.js";
import { errorFromBody, errorFromEvent, parseRetryAfter } from "../../dist/errors.js";
import { Transport } from "../../dist/transport.js";

const headers = (h) => ({ get: (n) => h[n.toLowerCase()] ?? null });
const body = (code, message = "m", extra = {}) => JSON.stringify({ error: { code, message, ...extra } });

test("every code of the server's table maps to the class the Go test names", (t) => {
  const raw = process.env.AIRLOCK_TEST_ERROR_CODES;
  if (!raw) {
    t.skip("AIRLOCK_TEST_ERROR_CODES is set by test/sdk's TestTSUnit from the server's table");
    return;
  }
  const rows = JSON.parse(raw);
  assert.ok(rows.length >= 20, `only ${rows.length} codes`);
  for (const row of rows) {
    const cls = sdk[row.class];
    assert.equal(typeof cls, "function", `${row.class} (for ${row.code}) is not exported by the SDK`);
    const h = row.retry_after ? { "retry-after": "7", "x-request-id": "req_h" } : { "x-request-id": "req_h" };
    const err = errorFromBody(row.status, body(row.code, "said", { sandbox_id: "sbx_1" }), headers(h));
    assert.ok(err instanceof cls, `${row.status} ${row.code} → ${err.name}, want ${row.class}`);
    assert.equal(err.name, row.class, `${row.code}: the most specific class`);
    assert.ok(err instanceof sdk.AirlockError);
    assert.equal(err.code, row.code);
    assert.equal(err.status, row.status);
    assert.equal(err.message, "said");
    assert.equal(err.sandboxId, "sbx_1");
    assert.equal(err.requestId, "req_h");
    assert.equal(err.retryAfter, row.retry_after ? 7 : undefined, `${row.code}: retryAfter`);
  }
});

test("classes nest: a caller may catch the general one", () => {
  const cases = [
    ["sandbox_not_found", 404, sdk.NotFoundError],
    ["exec_not_found", 404, sdk.NotFoundError],
    ["invalid_state", 409, sdk.ConflictError],
    ["template_building", 503, sdk.UnavailableError],
    ["capacity_exhausted", 503, sdk.UnavailableError],
    ["template_unsupported", 400, sdk.InvalidRequestError],
  ];
  for (const [code, status, parent] of cases) {
    assert.ok(errorFromBody(status, body(code)) instanceof parent, `${code} is a ${parent.name}`);
  }
  assert.ok(!(errorFromBody(404, body("sandbox_not_found")) instanceof sdk.ConflictError));
});

test("a code this SDK does not know falls back on its status and keeps the code", () => {
  const e = errorFromBody(404, body("volume_not_found", "no volume"));
  assert.ok(e instanceof sdk.NotFoundError);
  assert.equal(e.code, "volume_not_found");
  assert.equal(e.message, "no volume");
  assert.ok(errorFromBody(429, body("some_limit")) instanceof sdk.RateLimitedError);
  assert.ok(errorFromBody(418, body("teapot")) instanceof sdk.InvalidRequestError);
  assert.ok(errorFromBody(507, body("full")) instanceof sdk.InternalError);
});

test("a body that is not ours (a proxy) still gives a class and a short message", () => {
  const e = errorFromBody(502, "<html>\n<h1>Bad Gateway</h1></html>", headers({ "x-request-id": "req_p" }));
  assert.ok(e instanceof sdk.UnavailableError);
  assert.equal(e.code, "unavailable");
  assert.equal(e.message, "<html>");
  assert.equal(e.requestId, "req_p");
  const long = errorFromBody(500, "x".repeat(1000));
  assert.ok(long.message.length <= 201);
  assert.equal(errorFromBody(500, "").message, "request failed with status 500");
});

test("Retry-After: seconds or an HTTP date", () => {
  assert.equal(parseRetryAfter("30"), 30);
  assert.equal(parseRetryAfter(" 0 "), 0);
  assert.equal(parseRetryAfter(""), undefined);
  assert.equal(parseRetryAfter(null), undefined);
  assert.equal(parseRetryAfter("soon"), undefined);
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(parseRetryAfter("Thu, 01 Jan 2026 00:00:10 GMT", now), 10);
  assert.equal(parseRetryAfter("Wed, 31 Dec 2025 23:00:00 GMT", now), 0);
  const q = errorFromBody(429, body("quota_exceeded"), headers({ "retry-after": "12" }));
  assert.ok(q instanceof sdk.QuotaExceededError);
  assert.equal(q.retryAfter, 12);
});

test("an error event inside a stream", () => {
  const e = errorFromEvent(body("agent_unavailable", "the agent is gone", { request_id: "req_s" }));
  assert.ok(e instanceof sdk.AgentUnavailableError);
  assert.equal(e.requestId, "req_s");
  assert.equal(e.status, 0);
  assert.ok(errorFromEvent(JSON.stringify({ code: "sandbox_not_found", message: "gone" })) instanceof sdk.SandboxNotFoundError);
  const junk = errorFromEvent("not json");
  assert.ok(junk instanceof sdk.InternalError);
});

test("a server that is not there is a ConnectionError naming only scheme and host", async () => {
  const srv = http.createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const port = srv.address().port;
  await new Promise((r) => srv.close(r));
  const t = new Transport({ url: `http://127.0.0.1:${port}/base`, apiKey: "k" });
  await assert.rejects(t.json("GET", "/v1/sandboxes", { query: { path: "/secret/path" } }), (e) => {
    assert.ok(e instanceof sdk.ConnectionError, e.name);
    assert.ok(e instanceof sdk.UnavailableError);
    assert.equal(e.code, "unavailable");
    assert.match(e.message, new RegExp(`http://127\\.0\\.0\\.1:${port}`));
    assert.doesNotMatch(e.message, /secret/);
    return true;
  });
});

test("the key and the server come from AIRLOCK_API_KEY and AIRLOCK_URL; options win", async () => {
  let seen;
  const srv = http.createServer((req, res) => {
    seen = { auth: req.headers.authorization, url: req.url, ua: req.headers["user-agent"] };
    res.writeHead(401, { "content-type": "application/json", "x-request-id": "req_a" });
    res.end(body("unauthenticated", "missing or invalid api key"));
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${srv.address().port}`;
  const saved = { u: process.env.AIRLOCK_URL, k: process.env.AIRLOCK_API_KEY };
  try {
    process.env.AIRLOCK_URL = url;
    process.env.AIRLOCK_API_KEY = "from-env";
    await assert.rejects(sdk.Sandbox.connect("sbx_x"), sdk.UnauthorizedError);
    assert.equal(seen.auth, "Bearer from-env");
    assert.equal(seen.url, "/v1/sandboxes/sbx_x");
    assert.match(seen.ua, /^airlock-ts\//);
    await assert.rejects(sdk.Sandbox.connect("sbx_y", { apiKey: "given" }), sdk.UnauthorizedError);
    assert.equal(seen.auth, "Bearer given");
    process.env.AIRLOCK_URL = "http://127.0.0.1:1";
    await assert.rejects(sdk.Sandbox.connect("sbx/z", { url }), (e) => e.requestId === "req_a");
    assert.equal(seen.url, "/v1/sandboxes/sbx%2Fz", "ids are escaped");
  } finally {
    for (const [k, v] of [["AIRLOCK_URL", saved.u], ["AIRLOCK_API_KEY", saved.k]]) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    srv.close();
  }
});

test("a bad server url or key is refused before any request", () => {
  assert.throws(() => new Transport({ url: "ftp://x" }), sdk.InvalidRequestError);
  assert.throws(() => new Transport({ url: "not a url" }), sdk.InvalidRequestError);
  assert.throws(() => new Transport({ url: "http://x", apiKey: "a\r\nInjected: 1" }), sdk.InvalidRequestError);
});
