// Server-Sent Events and NDJSON parsing.
import { test } from "node:test";
import assert from "node:assert/strict";

import { ndjson, SSEParser, sseEvents, StreamCutError } from "../../dist/sse.js";

const enc = new TextEncoder();
async function* from(...parts) {
  for (const p of parts) yield typeof p === "string" ? enc.encode(p) : p;
}
async function collect(gen) {
  const out = [];
  for await (const x of gen) out.push(x);
  return out;
}

const stream =
  ": heartbeat\n\n" +
  "event: start\ndata: {\"id\":\"ex_1\"}\n\n" +
  "event: stdout\r\nid: 6\r\ndata: {\"data\":\"a\",\r\ndata: \"offset\":0}\r\n\r\n" +
  "event: ignored-no-data\n\n" +
  "data:no space\rdata:  two spaces\r\r" +
  "event: exit\ndata: {}\n\n";

const want = [
  { event: "start", data: '{"id":"ex_1"}' },
  { event: "stdout", data: '{"data":"a",\n"offset":0}', id: "6" },
  { event: "message", data: "no space\n two spaces" },
  { event: "exit", data: "{}" },
];

test("events: fields, comments, CRLF, CR, multi-line data, events without data", async () => {
  assert.deepEqual(await collect(sseEvents(from(stream))), want);
});

test("events: the same at every split point (a CRLF cut between CR and LF too)", async () => {
  for (let i = 0; i <= stream.length; i++) {
    const got = await collect(sseEvents(from(stream.slice(0, i), stream.slice(i))));
    assert.deepEqual(got, want, `split at ${i}`);
  }
});

test("events: a UTF-8 character cut between chunks", async () => {
  const b = enc.encode("event: stdout\ndata: héllo ✓\n\n");
  for (let i = 0; i <= b.length; i++) {
    const got = await collect(sseEvents(from(b.subarray(0, i), b.subarray(i))));
    assert.deepEqual(got, [{ event: "stdout", data: "héllo ✓" }], `split at ${i}`);
  }
});

test("a stream cut inside an event or a line is an error, not an end", async () => {
  await assert.rejects(collect(sseEvents(from("event: exit\ndata: {}\n"))), StreamCutError);
  await assert.rejects(collect(sseEvents(from("event: exit\ndata: {"))), StreamCutError);
  assert.deepEqual(await collect(sseEvents(from(": just a heartbeat\n"))), []);
});

test("onActivity sees heartbeats", async () => {
  let n = 0;
  await collect(sseEvents(from(": hb\n\n", ": hb\n\n"), () => n++));
  assert.equal(n, 2);
});

test("an endless line is refused rather than buffered", () => {
  const p = new SSEParser(100);
  assert.throws(() => p.push("data: " + "x".repeat(200)), /too long/);
  const ok = new SSEParser(100);
  assert.deepEqual(ok.push("data: " + "y".repeat(90) + "\n\n"), [{ event: "message", data: "y".repeat(90) }]);
});

test("ndjson: lines across chunks, blank lines, a last line without newline", async () => {
  const got = await collect(ndjson(from('{"type":"std', 'out","text":"a"}\n\n  \n{"type":"end"', ',"execution_count":2}')));
  assert.deepEqual(got, [{ type: "stdout", text: "a" }, { type: "end", execution_count: 2 }]);
  await assert.rejects(collect(ndjson(from("{broken\n"))), SyntaxError);
  await assert.rejects(collect(ndjson(from("x".repeat(50)), 10)), /too long/);
});
