// The builtin WebSocket client: framing (RFC 6455's own examples), the
// handshake, control frames and refusals, against a raw server written
// here byte by byte.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import crypto from "node:crypto";

import {
  acceptKey,
  closePayload,
  connectBuiltin,
  encodeFrame,
  FrameDecoder,
  HANDSHAKE_GUID,
  Opcode,
  WebSocketProtocolError,
} from "../../dist/websocket.js";
import { SandboxNotFoundError, ConnectionError } from "../../dist/index.js";

const hex = (s) => Uint8Array.from(s.split(/\s+/).filter(Boolean), (x) => parseInt(x, 16));
const str = (b) => new TextDecoder().decode(b);

test("RFC 6455 §5.7: frames decode as the RFC says", () => {
  const d = new FrameDecoder(false);
  const [hello] = d.push(hex("81 05 48 65 6c 6c 6f"));
  assert.deepEqual({ fin: hello.fin, opcode: hello.opcode, text: str(hello.payload) }, { fin: true, opcode: 1, text: "Hello" });

  const frag = new FrameDecoder(false).push(hex("01 03 48 65 6c 80 02 6c 6f"));
  assert.deepEqual(
    frag.map((f) => [f.fin, f.opcode, str(f.payload)]),
    [
      [false, 1, "Hel"],
      [true, 0, "lo"],
    ],
  );
  const [ping] = new FrameDecoder(false).push(hex("89 05 48 65 6c 6c 6f"));
  assert.equal(ping.opcode, Opcode.Ping);

  const b256 = new Uint8Array(4 + 256);
  b256.set(hex("82 7e 01 00"));
  const [f256] = new FrameDecoder(false).push(b256);
  assert.equal(f256.payload.length, 256);

  const b64k = new Uint8Array(10 + 65536);
  b64k.set(hex("82 7f 00 00 00 00 00 01 00 00"));
  const [f64k] = new FrameDecoder(false).push(b64k);
  assert.equal(f64k.payload.length, 65536);
});

test("RFC 6455 §5.7: a client's masked frame is the RFC's bytes", () => {
  const mask = hex("37 fa 21 3d");
  const f = encodeFrame(Opcode.Text, new TextEncoder().encode("Hello"), mask);
  assert.deepEqual(f, hex("81 85 37 fa 21 3d 7f 9f 4d 51 58"));
  const [back] = new FrameDecoder(true).push(f);
  assert.equal(str(back.payload), "Hello");
});

test("lengths: 7-bit, 16-bit and 64-bit encodings round-trip byte by byte", () => {
  for (const n of [0, 125, 126, 65535, 65536, 70000]) {
    const p = crypto.randomBytes(n);
    const f = encodeFrame(Opcode.Binary, p, crypto.randomBytes(4));
    assert.equal(f[1] & 0x7f, n < 126 ? n : n < 65536 ? 126 : 127);
    const d = new FrameDecoder(true);
    const got = [];
    for (let i = 0; i < f.length; i += 997) got.push(...d.push(f.subarray(i, i + 997)));
    assert.equal(got.length, 1, `n=${n}`);
    assert.deepEqual(Buffer.from(got[0].payload), p, `n=${n}`);
  }
});

test("protocol violations are refused with their close codes", () => {
  const code = (bytes, masked = false, max) => {
    try {
      new FrameDecoder(masked, max).push(bytes);
    } catch (e) {
      assert.ok(e instanceof WebSocketProtocolError);
      return e.code;
    }
    return 0;
  };
  assert.equal(code(hex("81 85 37 fa 21 3d 7f 9f 4d 51 58")), 1002, "a masked server frame");
  assert.equal(code(hex("81 05 48 65 6c 6c 6f"), true), 1002, "an unmasked client frame");
  assert.equal(code(hex("c1 00")), 1002, "reserved bit");
  assert.equal(code(hex("83 00")), 1002, "unknown opcode");
  assert.equal(code(hex("09 00")), 1002, "a fragmented ping");
  assert.equal(code(hex("89 7e 00 7e")), 1002, "a ping over 125 bytes");
  assert.equal(code(hex("82 7f 80 00 00 00 00 00 00 00")), 1002, "a length with its top bit");
  assert.equal(code(hex("82 7e 01 00"), false, 100), 1009, "over the limit");
});

test("the handshake's accept key is the RFC's", async () => {
  assert.equal(await acceptKey("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
});

/** A raw WebSocket server: script(socket, frames) drives it. */
async function rawServer(onUpgrade) {
  const srv = http.createServer((req, res) => {
    res.writeHead(400);
    res.end();
  });
  srv.on("upgrade", onUpgrade);
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { srv, url: `http://127.0.0.1:${srv.address().port}/v1/sandboxes/sbx_1/pty?cols=80` };
}

function accept(req, sock) {
  const key = req.headers["sec-websocket-key"];
  const acc = crypto.createHash("sha1").update(key + HANDSHAKE_GUID).digest("base64");
  sock.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acc}\r\n\r\n`);
}

test("a session: headers, ping/pong, a fragmented message, text, sends masked, the close handshake", async () => {
  const seen = { frames: [] };
  let serverDone;
  const finished = new Promise((r) => (serverDone = r));
  const { srv, url } = await rawServer((req, sock) => {
    seen.headers = req.headers;
    seen.url = req.url;
    accept(req, sock);
    const dec = new FrameDecoder(true); // the client's frames must be masked
    sock.on("data", (b) => {
      for (const f of dec.push(b)) {
        seen.frames.push({ opcode: f.opcode, payload: Buffer.from(f.payload) });
        if (f.opcode === Opcode.Binary && str(f.payload) === "typed") {
          // The client answered everything: close.
          sock.write(encodeFrame(Opcode.Close, closePayload(1000, "bye"), null));
        }
        if (f.opcode === Opcode.Close) {
          sock.end();
          serverDone();
        }
      }
    });
    // A ping, a binary message in two fragments (the first in the same
    // packet as the handshake's end is fine too), a control message.
    sock.write(
      Buffer.concat([
        encodeFrame(Opcode.Ping, new TextEncoder().encode("are you there"), null),
        encodeFrame(Opcode.Binary, new TextEncoder().encode("frag-"), null, false),
        encodeFrame(Opcode.Continuation, new TextEncoder().encode("ment"), null, true),
        encodeFrame(Opcode.Text, new TextEncoder().encode('{"exit":{"exit_code":0}}'), null),
      ]),
    );
  });
  try {
    const sock = await connectBuiltin(url, { Authorization: "Bearer k" }, undefined);
    const got = [];
    let closed;
    const closedP = new Promise((r) => (closed = r));
    sock.onmessage = (m) => {
      got.push(typeof m === "string" ? ["text", m] : ["binary", str(m)]);
      if (got.length === 2) sock.send(new TextEncoder().encode("typed"));
    };
    sock.onclose = (code, reason, err) => closed({ code, reason, err });
    sock.start();
    const c = await closedP;
    await finished;
    assert.deepEqual(got, [
      ["binary", "frag-ment"],
      ["text", '{"exit":{"exit_code":0}}'],
    ]);
    assert.deepEqual({ code: c.code, reason: c.reason, err: c.err }, { code: 1000, reason: "bye", err: undefined });
    assert.equal(seen.headers.authorization, "Bearer k");
    assert.equal(seen.headers["sec-websocket-version"], "13");
    assert.equal(seen.headers.upgrade.toLowerCase(), "websocket");
    assert.equal(seen.url, "/v1/sandboxes/sbx_1/pty?cols=80");
    const kinds = seen.frames.map((f) => [f.opcode, f.opcode === Opcode.Close ? f.payload.readUInt16BE(0) : str(f.payload)]);
    assert.deepEqual(kinds, [
      [Opcode.Pong, "are you there"],
      [Opcode.Binary, "typed"],
      [Opcode.Close, 1000],
    ]);
  } finally {
    srv.close();
  }
});

test("a refused handshake gives the API's error", async () => {
  const { srv, url } = await rawServer((req, sock) => {
    const b = JSON.stringify({ error: { code: "sandbox_not_found", message: "sandbox not found", request_id: "req_w" } });
    sock.end(`HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n${b}`);
  });
  try {
    await assert.rejects(connectBuiltin(url, {}, undefined), (e) => {
      assert.ok(e instanceof SandboxNotFoundError, e.name);
      assert.equal(e.requestId, "req_w");
      assert.equal(e.status, 404);
      return true;
    });
  } finally {
    srv.close();
  }
});

test("a server that answers the handshake wrongly is refused", async () => {
  const { srv, url } = await rawServer((req, sock) => {
    sock.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: bm9wZQ==\r\n\r\n");
  });
  try {
    await assert.rejects(connectBuiltin(url, {}, undefined), ConnectionError);
  } finally {
    srv.close();
  }
});

test("a server that masks its frames is a protocol error: the client closes 1002", async () => {
  let closeCode;
  const got = new Promise((resolve) => {
    rawServer((req, sock) => {
      accept(req, sock);
      const dec = new FrameDecoder(true);
      sock.on("data", (b) => {
        for (const f of dec.push(b)) if (f.opcode === Opcode.Close) closeCode = f.payload.readUInt16BE(0);
      });
      // The server's sockets are half-open ones: the client's FIN is "end".
      sock.on("end", () => {
        sock.end();
        resolve();
      });
      sock.write(encodeFrame(Opcode.Binary, new TextEncoder().encode("x"), crypto.randomBytes(4)));
    }).then(async ({ srv, url }) => {
      const sock = await connectBuiltin(url, {}, undefined);
      sock.onclose = (code, reason, err) => {
        assert.ok(err instanceof ConnectionError);
        assert.match(err.message, /masked/);
        srv.close();
      };
      sock.start();
    });
  });
  await got;
  assert.equal(closeCode, 1002);
});

test("a connection cut without a close frame is reported (1006)", async () => {
  const { srv, url } = await rawServer((req, sock) => {
    accept(req, sock);
    setTimeout(() => sock.destroy(), 20);
  });
  try {
    const sock = await connectBuiltin(url, {}, undefined);
    const c = await new Promise((r) => {
      sock.onclose = (code, reason, err) => r({ code, err });
      sock.start();
    });
    assert.equal(c.code, 1006);
    assert.ok(c.err instanceof ConnectionError);
  } finally {
    srv.close();
  }
});
