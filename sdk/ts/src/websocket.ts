// WebSocket for the terminal (sbx.pty): the runtime's global WebSocket
// where there is one (Node ≥ 22, Deno, Bun), else a minimal RFC 6455
// client over node:http (Node 18 and 20, whose global WebSocket is missing
// or behind --experimental-websocket).

import { AirlockError, ConnectionError, errorFromBody } from "./errors.js";
import { concat, describe } from "./transport.js";

/** Opcodes (RFC 6455 §5.2). */
export const Opcode = { Continuation: 0, Text: 1, Binary: 2, Close: 8, Ping: 9, Pong: 10 } as const;

/** The GUID of the handshake's Sec-WebSocket-Accept (RFC 6455 §1.3). */
export const HANDSHAKE_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/**
 * Bounds one message the server sends. The server's terminal frames are
 * reads of the PTY (a few KiB); a larger message is a broken peer.
 */
export const MAX_MESSAGE = 4 << 20;

/** One frame. */
export interface Frame {
  fin: boolean;
  opcode: number;
  payload: Uint8Array;
}

/** A violation of the protocol; code is the close code to send (1002, 1007, 1009). */
export class WebSocketProtocolError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
    this.name = "WebSocketProtocolError";
  }
}

/** Web Crypto: the global one, or node:crypto's on Node 18 (whose global needs a flag). */
type WebCrypto = { getRandomValues(b: Uint8Array): Uint8Array; subtle: { digest(alg: string, data: Uint8Array): Promise<ArrayBuffer> } };
let webcrypto: WebCrypto | undefined = (globalThis as { crypto?: WebCrypto }).crypto;

async function loadCrypto(): Promise<WebCrypto> {
  if (!webcrypto) webcrypto = (await import("node:crypto")).webcrypto as unknown as WebCrypto;
  return webcrypto;
}

/** randomBytes fills n bytes from the platform's CSPRNG (masks must be unpredictable, §10.3). */
function randomBytes(n: number): Uint8Array {
  const b = new Uint8Array(n);
  webcrypto!.getRandomValues(b);
  return b;
}

/**
 * encodeFrame builds one frame. A client masks every frame it sends with a
 * fresh key (mask); a server sends them unmasked (mask null).
 */
export function encodeFrame(opcode: number, payload: Uint8Array, mask: Uint8Array | null, fin = true): Uint8Array {
  const n = payload.length;
  const ext = n < 126 ? 0 : n < 65536 ? 2 : 8;
  const head = 2 + ext + (mask ? 4 : 0);
  const out = new Uint8Array(head + n);
  out[0] = (fin ? 0x80 : 0) | (opcode & 0x0f);
  const lenCode = n < 126 ? n : n < 65536 ? 126 : 127;
  out[1] = (mask ? 0x80 : 0) | lenCode;
  const dv = new DataView(out.buffer);
  if (ext === 2) dv.setUint16(2, n);
  if (ext === 8) {
    dv.setUint32(2, Math.floor(n / 2 ** 32));
    dv.setUint32(6, n >>> 0);
  }
  if (mask) {
    out.set(mask.subarray(0, 4), 2 + ext);
    for (let i = 0; i < n; i++) out[head + i] = payload[i]! ^ mask[i & 3]!;
  } else {
    out.set(payload, head);
  }
  return out;
}

/**
 * FrameDecoder parses frames from bytes as they arrive. A client's decoder
 * (masked false) refuses masked frames, a server's (masked true) unmasked
 * ones, as §5.1 demands.
 */
export class FrameDecoder {
  private buf: Uint8Array = new Uint8Array(0);

  constructor(
    private readonly masked = false,
    private readonly maxPayload = MAX_MESSAGE,
  ) {}

  /** push feeds bytes and returns the complete frames; it throws WebSocketProtocolError. */
  push(bytes: Uint8Array): Frame[] {
    this.buf = this.buf.length === 0 ? bytes : concat([this.buf, bytes]);
    const frames: Frame[] = [];
    for (;;) {
      const f = this.next();
      if (!f) break;
      frames.push(f);
    }
    return frames;
  }

  private next(): Frame | undefined {
    const b = this.buf;
    if (b.length < 2) return undefined;
    const b0 = b[0]!;
    const b1 = b[1]!;
    if (b0 & 0x70) throw new WebSocketProtocolError(1002, "reserved bits set without an extension");
    const opcode = b0 & 0x0f;
    const fin = (b0 & 0x80) !== 0;
    if (![0, 1, 2, 8, 9, 10].includes(opcode)) throw new WebSocketProtocolError(1002, `unknown opcode ${opcode}`);
    const isMasked = (b1 & 0x80) !== 0;
    if (isMasked !== this.masked) {
      throw new WebSocketProtocolError(1002, this.masked ? "a client frame was not masked" : "a server frame was masked");
    }
    let len = b1 & 0x7f;
    let off = 2;
    if (opcode >= 8 && (!fin || len > 125)) throw new WebSocketProtocolError(1002, "a control frame was fragmented or too long");
    const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
    if (len === 126) {
      if (b.length < 4) return undefined;
      len = dv.getUint16(2);
      off = 4;
    } else if (len === 127) {
      if (b.length < 10) return undefined;
      const hi = dv.getUint32(2);
      if (hi & 0x80000000) throw new WebSocketProtocolError(1002, "a frame length had its top bit set");
      len = hi * 2 ** 32 + dv.getUint32(6);
      off = 10;
    }
    if (len > this.maxPayload) throw new WebSocketProtocolError(1009, `a frame of ${len} bytes is over the ${this.maxPayload}-byte limit`);
    const maskOff = off;
    if (isMasked) off += 4;
    if (b.length < off + len) return undefined;
    let payload = b.slice(off, off + len);
    if (isMasked) {
      for (let i = 0; i < len; i++) payload[i]! ^= b[maskOff + (i & 3)]!;
    }
    this.buf = b.subarray(off + len);
    if (this.buf.length === 0) this.buf = new Uint8Array(0);
    return { fin, opcode, payload };
  }
}

/** A close frame's payload: code and reason. */
export function closePayload(code: number, reason = ""): Uint8Array {
  const r = new TextEncoder().encode(reason).subarray(0, 123);
  const out = new Uint8Array(2 + r.length);
  new DataView(out.buffer).setUint16(0, code);
  out.set(r, 2);
  return out;
}

/** The message socket the terminal uses: either implementation. */
export interface MessageSocket {
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  /** Set by the user: each complete message. */
  onmessage: (data: string | Uint8Array) => void;
  /** Set by the user: called once when the connection is over. */
  onclose: (code: number, reason: string, err?: Error) => void;
  /** start delivers messages (none is delivered before, so none is lost while the user sets the handlers). */
  start(): void;
}

/** The runtime's WebSocket constructor, if it has one. */
type GlobalWebSocket = new (url: string, opts?: unknown) => {
  binaryType: string;
  readyState: number;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
};

/** Which implementation openSocket uses here: "global" or "builtin". */
export function webSocketKind(): "global" | "builtin" {
  return typeof (globalThis as { WebSocket?: unknown }).WebSocket === "function" ? "global" : "builtin";
}

/**
 * openSocket connects to url (http(s)://…, turned into ws(s)://) sending
 * headers. diagnose is asked for the reason when the global WebSocket
 * reports a failed handshake, which it does without the status or body.
 */
export function openSocket(
  url: string,
  headers: Record<string, string>,
  signal: AbortSignal | undefined,
  diagnose: () => Promise<Error>,
): Promise<MessageSocket> {
  if (webSocketKind() === "global") return connectGlobal(url, headers, signal, diagnose);
  return connectBuiltin(url, headers, signal);
}

async function connectGlobal(
  url: string,
  headers: Record<string, string>,
  signal: AbortSignal | undefined,
  diagnose: () => Promise<Error>,
): Promise<MessageSocket> {
  const WS = (globalThis as unknown as { WebSocket: GlobalWebSocket }).WebSocket;
  const wsUrl = url.replace(/^http/, "ws");
  let ws: InstanceType<GlobalWebSocket>;
  try {
    // Node (undici), Deno and Bun take headers here; a browser cannot send
    // an API key on a WebSocket at all.
    ws = new WS(wsUrl, { headers });
  } catch (e) {
    throw new AirlockError(`this runtime's WebSocket cannot send the API key: ${describe(e)}`, { code: "not_implemented" });
  }
  ws.binaryType = "arraybuffer";
  return new Promise<MessageSocket>((resolve, reject) => {
    let opened = false;
    const onAbort = () => {
      ws.close();
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    let started = false;
    const pending: Array<() => void> = [];
    const emit = (f: () => void) => (started ? f() : pending.push(f));
    const sock: MessageSocket = {
      start: () => {
        started = true;
        for (const f of pending.splice(0)) f();
      },
      send: (d) => ws.send(d),
      close: (code = 1000, reason = "") => {
        try {
          ws.close(code, reason);
        } catch {
          ws.close();
        }
      },
      onmessage: () => {},
      onclose: () => {},
    };
    ws.onopen = () => {
      opened = true;
      signal?.removeEventListener("abort", onAbort);
      resolve(sock);
    };
    ws.onmessage = (ev) => {
      const d = ev.data;
      const m = typeof d === "string" ? d : new Uint8Array(d as ArrayBuffer);
      emit(() => sock.onmessage(m));
    };
    ws.onerror = () => {
      if (opened) return; // onclose follows
      signal?.removeEventListener("abort", onAbort);
      diagnose().then(reject, reject);
    };
    ws.onclose = (ev) => {
      if (!opened) return;
      const err =
        ev.code === 1000 || ev.code === 1001
          ? undefined
          : new ConnectionError(`the terminal's connection closed (${ev.code})`, { code: "unavailable" });
      emit(() => sock.onclose(ev.code, ev.reason, err));
    };
  });
}

/** What the builtin client needs of node:http's socket. */
interface NodeSocket {
  write(b: Uint8Array): boolean;
  end(): void;
  destroy(): void;
  setNoDelay(v: boolean): void;
  on(ev: "data", f: (b: Uint8Array) => void): void;
  on(ev: "close" | "end", f: () => void): void;
  on(ev: "error", f: (e: Error) => void): void;
}

/** acceptKey is the Sec-WebSocket-Accept a server must answer key with. */
export async function acceptKey(key: string): Promise<string> {
  const d = await (await loadCrypto()).subtle.digest("SHA-1", new TextEncoder().encode(key + HANDSHAKE_GUID));
  let bin = "";
  for (const x of new Uint8Array(d)) bin += String.fromCharCode(x);
  return btoa(bin);
}

/** Bounds the error body of a refused handshake. */
const MAX_ERROR_BODY = 64 << 10;

export async function connectBuiltin(url: string, headers: Record<string, string>, signal: AbortSignal | undefined): Promise<MessageSocket> {
  type Http = typeof import("node:http");
  let http: Http;
  try {
    http = (await import(url.startsWith("https:") ? "node:https" : "node:http")) as unknown as Http;
  } catch {
    throw new AirlockError("this runtime has neither a global WebSocket nor node:http", { code: "not_implemented" });
  }
  await loadCrypto();
  let bin = "";
  for (const x of randomBytes(16)) bin += String.fromCharCode(x);
  const key = btoa(bin);
  const want = await acceptKey(key);
  const redacted = (() => {
    const u = new URL(url);
    return `${u.protocol}//${u.host}`;
  })();
  return new Promise<MessageSocket>((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const req = http.request(url, {
      method: "GET",
      headers: {
        ...headers,
        Connection: "Upgrade",
        Upgrade: "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": key,
      },
    });
    let settled = false;
    const fail = (e: unknown) => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener("abort", onAbort);
      reject(e);
    };
    const onAbort = () => {
      req.destroy();
      fail(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    req.on("error", (e) => fail(new ConnectionError(`cannot reach ${redacted}: ${describe(e)}`, { code: "unavailable", cause: e })));
    req.on("response", (res) => {
      // Not upgraded: the API's error body says why.
      const parts: Uint8Array[] = [];
      let n = 0;
      res.on("data", (c: Uint8Array) => {
        if (n < MAX_ERROR_BODY) parts.push(c);
        n += c.length;
      });
      res.on("end", () => {
        const text = new TextDecoder().decode(concat(parts).subarray(0, MAX_ERROR_BODY));
        const h = res.headers;
        fail(
          errorFromBody(res.statusCode ?? 0, text, {
            get: (name: string) => {
              const v = h[name.toLowerCase()];
              return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
            },
          }),
        );
      });
      res.on("error", (e) => fail(new ConnectionError(`the handshake's answer broke: ${describe(e)}`, { code: "unavailable" })));
    });
    req.on("upgrade", (res, socket, head) => {
      if (res.headers["sec-websocket-accept"] !== want) {
        socket.destroy();
        fail(new ConnectionError("the server's WebSocket handshake was wrong (Sec-WebSocket-Accept)", { code: "unavailable" }));
        return;
      }
      if (settled) {
        socket.destroy();
        return;
      }
      settled = true;
      signal?.removeEventListener("abort", onAbort);
      resolve(new BuiltinSocket(socket as unknown as NodeSocket, head));
    });
    req.end();
  });
}

/** The builtin client's connection. */
class BuiltinSocket implements MessageSocket {
  onmessage: (data: string | Uint8Array) => void = () => {};
  onclose: (code: number, reason: string, err?: Error) => void = () => {};
  private readonly dec = new FrameDecoder(false);
  private fragments: Uint8Array[] = [];
  private fragOpcode = 0;
  private fragSize = 0;
  private closeSent = false;
  private closed = false;
  private closeTimer: ReturnType<typeof setTimeout> | undefined;
  private peerClose: { code: number; reason: string } | undefined;
  private failure: Error | undefined;

  private started = false;
  private readonly pending: Array<() => void> = [];

  constructor(
    private readonly sock: NodeSocket,
    head: Uint8Array,
  ) {
    sock.setNoDelay(true);
    if (head.length > 0) this.pending.push(() => this.data(head));
    sock.on("data", (b) => this.later(() => this.data(b)));
    sock.on("error", (e) => {
      this.failure ??= new ConnectionError(`the terminal's connection broke: ${describe(e)}`, { code: "unavailable", cause: e });
    });
    sock.on("close", () => this.later(() => this.finish()));
  }

  start(): void {
    this.started = true;
    for (const f of this.pending.splice(0)) f();
  }

  private later(f: () => void): void {
    if (this.started) f();
    else this.pending.push(f);
  }

  private write(opcode: number, payload: Uint8Array): void {
    this.sock.write(encodeFrame(opcode, payload, randomBytes(4)));
  }

  send(data: string | Uint8Array): void {
    if (this.closeSent || this.closed) throw new ConnectionError("the terminal's connection is closed", { code: "unavailable" });
    if (typeof data === "string") this.write(Opcode.Text, new TextEncoder().encode(data));
    else this.write(Opcode.Binary, data);
  }

  close(code = 1000, reason = ""): void {
    if (this.closed) return;
    if (!this.closeSent) {
      this.closeSent = true;
      try {
        this.write(Opcode.Close, closePayload(code, reason));
      } catch {
        // The socket is gone already.
      }
    }
    // The server answers the close and then closes the TCP connection; one
    // that does not within 5 s is cut.
    this.closeTimer = setTimeout(() => this.sock.destroy(), 5000);
    (this.closeTimer as { unref?: () => void }).unref?.();
  }

  private data(b: Uint8Array): void {
    if (this.closed) return;
    let frames: Frame[];
    try {
      frames = this.dec.push(b);
    } catch (e) {
      this.protocolError(e as WebSocketProtocolError);
      return;
    }
    for (const f of frames) {
      try {
        this.frame(f);
      } catch (e) {
        this.protocolError(e as WebSocketProtocolError);
        return;
      }
    }
  }

  private frame(f: Frame): void {
    switch (f.opcode) {
      case Opcode.Ping:
        if (!this.closeSent) this.write(Opcode.Pong, f.payload);
        return;
      case Opcode.Pong:
        return;
      case Opcode.Close: {
        let code = 1005;
        let reason = "";
        if (f.payload.length >= 2) {
          code = new DataView(f.payload.buffer, f.payload.byteOffset).getUint16(0);
          reason = new TextDecoder().decode(f.payload.subarray(2));
        }
        this.peerClose = { code, reason };
        if (!this.closeSent) {
          this.closeSent = true;
          this.write(Opcode.Close, code === 1005 ? new Uint8Array(0) : closePayload(code));
        }
        this.sock.end();
        return;
      }
      case Opcode.Text:
      case Opcode.Binary:
        if (this.fragments.length > 0) throw new WebSocketProtocolError(1002, "a new message began inside a fragmented one");
        if (f.fin) {
          this.deliver(f.opcode, f.payload);
          return;
        }
        this.fragOpcode = f.opcode;
        this.fragments = [f.payload];
        this.fragSize = f.payload.length;
        return;
      case Opcode.Continuation:
        if (this.fragments.length === 0) throw new WebSocketProtocolError(1002, "a continuation frame without a message");
        this.fragSize += f.payload.length;
        if (this.fragSize > MAX_MESSAGE) throw new WebSocketProtocolError(1009, "a message over the size limit");
        this.fragments.push(f.payload);
        if (f.fin) {
          const whole = concat(this.fragments);
          this.fragments = [];
          this.fragSize = 0;
          this.deliver(this.fragOpcode, whole);
        }
        return;
    }
  }

  private deliver(opcode: number, payload: Uint8Array): void {
    if (opcode === Opcode.Text) {
      let s: string;
      try {
        s = new TextDecoder("utf-8", { fatal: true }).decode(payload);
      } catch {
        throw new WebSocketProtocolError(1007, "a text message was not UTF-8");
      }
      this.onmessage(s);
    } else {
      this.onmessage(payload);
    }
  }

  private protocolError(e: WebSocketProtocolError): void {
    this.failure ??= new ConnectionError(`the terminal's connection failed: ${e.message}`, { code: "unavailable", cause: e });
    if (!this.closeSent) {
      this.closeSent = true;
      try {
        this.write(Opcode.Close, closePayload(e.code ?? 1002));
      } catch {
        // gone already
      }
    }
    this.sock.destroy();
  }

  private finish(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.closeTimer);
    const pc = this.peerClose;
    if (this.failure) this.onclose(pc?.code ?? 1006, pc?.reason ?? "", this.failure);
    else if (pc) this.onclose(pc.code, pc.reason, pc.code === 1000 || pc.code === 1001 || pc.code === 1005 ? undefined : new ConnectionError(`the terminal's connection closed (${pc.code} ${pc.reason})`, { code: "unavailable" }));
    else if (this.closeSent) this.onclose(1000, "");
    else this.onclose(1006, "", new ConnectionError("the terminal's connection was cut", { code: "unavailable" }));
  }
}
