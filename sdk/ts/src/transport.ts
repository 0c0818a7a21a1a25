// The HTTP transport: one server, one API key, fetch underneath.

import { AirlockError, ConnectionError, errorFromBody, InvalidRequestError } from "./errors.js";

/** The address `airlock serve` listens on unless told otherwise. */
export const DEFAULT_URL = "http://127.0.0.1:7070";

/** The SDK's version (sent as User-Agent). */
export const VERSION = "0.1.0";

/** Where the SDK finds the server and its API key; every option falls back on the environment. */
export interface ConnectionOptions {
  /** The server's base URL; default `AIRLOCK_URL`, else http://127.0.0.1:7070. */
  url?: string;
  /** The API key; default `AIRLOCK_API_KEY`. */
  apiKey?: string;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
  /** A fetch implementation; default the global one (Node ≥ 18). */
  fetch?: typeof fetch;
  /**
   * Bounds each ordinary call (not a stream: a running command, a watch,
   * code or a terminal), in seconds; default 120. 0 disables it.
   */
  requestTimeout?: number;
}

/** A query value: repeated for an array, omitted when undefined. */
export type QueryValue = string | number | boolean | undefined | readonly string[];

/** One request's options. */
export interface RequestOptions {
  query?: Record<string, QueryValue>;
  /** A JSON body (sent with Content-Type: application/json). */
  json?: unknown;
  /** A raw body. */
  body?: Uint8Array | string | AsyncIterable<Uint8Array>;
  contentType?: string;
  accept?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** A stream: no request timeout applies (the caller bounds it). */
  stream?: boolean;
}

/** Bounds how much of an error answer is read: the error body is small JSON. */
const MAX_ERROR_BODY = 64 << 10;

/** The default bound of an ordinary call, in seconds (a create waits for the sandbox to be ready). */
const DEFAULT_REQUEST_TIMEOUT = 120;

function env(name: string): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = p?.env?.[name];
  return v === "" ? undefined : v;
}

/** Transport sends the API's requests; one per Sandbox handle (cheap: fetch pools connections). */
export class Transport {
  readonly baseUrl: string;
  readonly apiKey: string | undefined;
  private readonly extraHeaders: Record<string, string>;
  private readonly fetchFn: typeof fetch;
  private readonly timeoutMs: number;
  /** The options it was made from, to derive a Transport for another handle. */
  readonly options: ConnectionOptions;

  constructor(opts: ConnectionOptions = {}) {
    this.options = opts;
    const raw = opts.url ?? env("AIRLOCK_URL") ?? DEFAULT_URL;
    let u: URL;
    try {
      u = new URL(raw);
    } catch {
      throw new InvalidRequestError(`server url ${JSON.stringify(raw)} is not a URL`, { code: "invalid_argument" });
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new InvalidRequestError(`server url ${JSON.stringify(raw)}: the scheme must be http or https`, {
        code: "invalid_argument",
      });
    }
    this.baseUrl = raw.replace(/\/+$/, "");
    this.apiKey = opts.apiKey ?? env("AIRLOCK_API_KEY");
    if (this.apiKey !== undefined && /[\r\n]/.test(this.apiKey)) {
      throw new InvalidRequestError("the api key contains a line break", { code: "invalid_argument" });
    }
    this.extraHeaders = { ...(opts.headers ?? {}) };
    const f = opts.fetch ?? (globalThis.fetch as typeof fetch | undefined);
    if (typeof f !== "function") {
      throw new AirlockError("no fetch: the SDK needs Node.js 18 or later (or pass options.fetch)", {
        code: "invalid_argument",
      });
    }
    this.fetchFn = f;
    this.timeoutMs = (opts.requestTimeout ?? DEFAULT_REQUEST_TIMEOUT) * 1000;
  }

  /** url builds the absolute URL of path (already escaped) and query. */
  url(path: string, query?: Record<string, QueryValue>): string {
    let s = this.baseUrl + path;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) {
        if (v === undefined) continue;
        if (Array.isArray(v)) for (const item of v) q.append(k, item);
        else q.append(k, String(v));
      }
      const qs = q.toString();
      if (qs) s += "?" + qs;
    }
    return s;
  }

  /** The headers that authenticate a request (also for the WebSocket handshake). */
  authHeaders(): Record<string, string> {
    const h: Record<string, string> = { ...this.extraHeaders };
    if (this.apiKey) h["Authorization"] = `Bearer ${this.apiKey}`;
    return h;
  }

  /** Where a request went, for error messages: scheme and host only (queries may hold private paths). */
  redacted(): string {
    const u = new URL(this.baseUrl);
    return `${u.protocol}//${u.host}`;
  }

  /**
   * request sends one request and returns the 2xx response (the caller
   * reads its body); any other answer throws its AirlockError.
   */
  async request(method: string, path: string, o: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { "User-Agent": `airlock-ts/${VERSION}`, ...this.authHeaders() };
    let body: RequestInit["body"];
    let duplex = false;
    if (o.json !== undefined) {
      body = JSON.stringify(o.json);
      headers["Content-Type"] = "application/json";
    } else if (o.body !== undefined) {
      if (typeof o.body === "string" || o.body instanceof Uint8Array) {
        body = o.body as RequestInit["body"];
      } else {
        body = iterableStream(o.body) as unknown as RequestInit["body"];
        duplex = true;
      }
      headers["Content-Type"] = o.contentType ?? "application/octet-stream";
    }
    headers["Accept"] = o.accept ?? "application/json";
    Object.assign(headers, o.headers ?? {});

    const signals: AbortSignal[] = [];
    if (o.signal) signals.push(o.signal);
    let timer: ReturnType<typeof setTimeout> | undefined;
    let timedOut = false;
    const ac = new AbortController();
    if (!o.stream && this.timeoutMs > 0) {
      timer = setTimeout(() => {
        timedOut = true;
        ac.abort();
      }, this.timeoutMs);
    }
    const onAbort = () => ac.abort(o.signal?.reason);
    if (o.signal) {
      if (o.signal.aborted) throw o.signal.reason;
      o.signal.addEventListener("abort", onAbort, { once: true });
    }
    const init: RequestInit & { duplex?: "half" } = { method, headers, body, signal: ac.signal };
    if (duplex) init.duplex = "half";
    let res: Response;
    try {
      res = await this.fetchFn(this.url(path, o.query), init);
    } catch (err) {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
      if (o.signal?.aborted) throw o.signal.reason;
      if (timedOut) {
        throw new ConnectionError(`${method} ${path}: no answer from ${this.redacted()} within ${this.timeoutMs / 1000}s`, {
          code: "unavailable",
          cause: err,
        });
      }
      throw new ConnectionError(`cannot reach ${this.redacted()}: ${describe(err)}`, { code: "unavailable", cause: err });
    }
    // The timer bounds the answer's headers; a body the caller reads (a
    // file, a stream) is the caller's to bound.
    clearTimeout(timer);
    // On success the listener stays: aborting later ends the body being read.
    if (res.status >= 200 && res.status < 300) return res;
    o.signal?.removeEventListener("abort", onAbort);
    const text = await readBounded(res, MAX_ERROR_BODY);
    throw errorFromBody(res.status, text, res.headers);
  }

  /** json sends a request and decodes its JSON answer (undefined for 204). */
  async json<T>(method: string, path: string, o: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, o);
    if (res.status === 204) {
      await res.body?.cancel();
      return undefined as T;
    }
    const text = await res.text();
    if (text.trim() === "") return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw new AirlockError(`decoding the answer to ${method} ${path}: ${describe(err)}`, { code: "internal", cause: err });
    }
  }
}

/** A short description of a network error (undici puts the real reason in cause). */
export function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    if (cause instanceof Error && cause.message) return cause.message;
    return err.message;
  }
  return String(err);
}

/** Reads at most max bytes of a response body as text and drops the rest. */
async function readBounded(res: Response, max: number): Promise<string> {
  if (!res.body) return "";
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  try {
    while (n < max) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      n += value.length;
    }
  } catch {
    // A body cut off: what arrived is all there is.
  } finally {
    reader.cancel().catch(() => {});
  }
  return new TextDecoder().decode(concat(parts).subarray(0, max));
}

/** concat joins byte chunks. */
export function concat(parts: readonly Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** A ReadableStream over an async iterable of bytes (ReadableStream.from is newer than Node 18). */
function iterableStream(src: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const it = src[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await it.next();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    async cancel(reason) {
      await it.return?.(reason);
    },
  });
}

/** chunks yields the bytes of a response body as they arrive. */
export async function* chunks(body: ReadableStream<Uint8Array> | null): AsyncGenerator<Uint8Array> {
  if (!body) return;
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      if (value && value.length > 0) yield value;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** seg escapes one path segment. */
export const seg = (s: string): string => encodeURIComponent(s);
