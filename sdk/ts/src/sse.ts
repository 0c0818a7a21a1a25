// Server-Sent Events (WHATWG HTML, "server-sent events") and NDJSON
// parsing over byte streams.

/** One dispatched event. */
export interface SSEEvent {
  /** The `event:` field; "message" when the event named none. */
  event: string;
  /** The `data:` lines joined with "\n". */
  data: string;
  /** The `id:` field, when present. */
  id?: string;
}

/**
 * Bounds one line of an event stream. The server sends output in chunks far
 * below this (base64 of a 64 KiB read is 88 KiB); a longer line means a
 * broken or hostile peer, and buffering it would cost unbounded memory.
 */
export const MAX_SSE_LINE = 8 << 20;

/** The stream stopped inside an event or a line: the connection was cut. */
export class StreamCutError extends Error {
  constructor(message = "the event stream ended in the middle of an event") {
    super(message);
    this.name = "StreamCutError";
  }
}

/** SSEParser turns text as it arrives into events. */
export class SSEParser {
  private buf = "";
  private crPending = false; // the last chunk ended in \r: a following \n belongs to it
  private event = "";
  private data: string[] = [];
  private hasData = false;
  private id: string | undefined;
  private partial = false;
  private readonly maxLine: number;

  constructor(maxLine = MAX_SSE_LINE) {
    this.maxLine = maxLine;
  }

  /** push feeds text and returns the events it completed. */
  push(text: string): SSEEvent[] {
    const out: SSEEvent[] = [];
    if (this.crPending && text.startsWith("\n")) text = text.slice(1);
    this.crPending = false;
    this.buf += text;
    let start = 0;
    for (;;) {
      let i = start;
      const n = this.buf.length;
      while (i < n) {
        const c = this.buf.charCodeAt(i);
        if (c === 10 || c === 13) break;
        i++;
      }
      if (i === n) break;
      const line = this.buf.slice(start, i);
      if (this.buf.charCodeAt(i) === 13) {
        if (i + 1 === n) this.crPending = true;
        else if (this.buf.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    this.buf = this.buf.slice(start);
    if (this.buf.length > this.maxLine) throw new Error("event stream line too long");
    return out;
  }

  /** end checks that the stream did not stop inside an event or a line. */
  end(): void {
    if (this.buf.length > 0 || this.partial) throw new StreamCutError();
  }

  private line(line: string): SSEEvent | undefined {
    if (line === "") {
      const ev =
        this.hasData ? { event: this.event || "message", data: this.data.join("\n"), ...(this.id !== undefined ? { id: this.id } : {}) } : undefined;
      this.event = "";
      this.data = [];
      this.hasData = false;
      this.id = undefined;
      this.partial = false;
      return ev;
    }
    if (line.startsWith(":")) return undefined; // a comment: a heartbeat
    this.partial = true;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        this.event = value;
        break;
      case "data":
        this.data.push(value);
        this.hasData = true;
        break;
      case "id":
        this.id = value;
        break;
    }
    return undefined;
  }
}

/**
 * sseEvents yields the events of a byte stream. onActivity is called for
 * every chunk (heartbeats included), so an idle watchdog can tell a silent
 * connection from a quiet command. A stream cut inside an event throws
 * StreamCutError.
 */
export async function* sseEvents(source: AsyncIterable<Uint8Array>, onActivity?: () => void): AsyncGenerator<SSEEvent> {
  const dec = new TextDecoder();
  const p = new SSEParser();
  for await (const chunk of source) {
    onActivity?.();
    for (const ev of p.push(dec.decode(chunk, { stream: true }))) yield ev;
  }
  const rest = dec.decode();
  if (rest) for (const ev of p.push(rest)) yield ev;
  p.end();
}

/** Bounds one NDJSON line (a result carrying a large image is one line). */
export const MAX_NDJSON_LINE = 64 << 20;

/** ndjson yields the JSON values of a newline-delimited JSON byte stream; blank lines are skipped. */
export async function* ndjson(source: AsyncIterable<Uint8Array>, maxLine = MAX_NDJSON_LINE): AsyncGenerator<unknown> {
  const dec = new TextDecoder();
  let buf = "";
  const lines = function* (final: boolean): Generator<unknown> {
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line);
    }
    if (buf.length > maxLine) throw new Error("ndjson line too long");
    if (final && buf.trim()) {
      const line = buf.trim();
      buf = "";
      yield JSON.parse(line);
    }
  };
  for await (const chunk of source) {
    buf += dec.decode(chunk, { stream: true });
    yield* lines(false);
  }
  buf += dec.decode();
  yield* lines(true);
}
